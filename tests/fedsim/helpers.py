"""Small configs and datasets for engine tests, and the config fuzzers' mutation."""

import copy
import random

from fedsim.config import UNROLL_STEPS, load_config
from fedsim.data import synthetic_dataset


#: Puts small_config's ``training.unroll_steps`` back to the engine's default:
#: for tests of what the default does, or of how configs hashed before the key.
ENGINE_UNROLL = {"training.unroll_steps": UNROLL_STEPS}


def drop_later_config_keys(d: dict) -> dict:
    """``d`` (a ``cfg.to_dict()``) without the keys configs gained after the
    fingerprints the legacy-fingerprint tests rebuild: ``observer.fill``
    (2026-11-27), ``training.unroll_steps`` (2026-11-28), the ``accounting``
    section (2026-11-29), ``training.dtype`` (2026-11-30) and the server
    optimizer's hyperparameters (2026-12-02). A config key added later, and left
    out of the hash where it keeps the earlier rule, belongs here too."""
    del d["observer"]["fill"], d["training"]["unroll_steps"], d["accounting"]
    del d["training"]["dtype"]
    for key in ("server_momentum", "server_b1", "server_b2", "server_tau"):
        del d["training"][key]
    return d


def small_config(**overrides):
    base = {
        "name": "test", "seed": 0,
        "data.dataset": "synthetic", "data.num_clients": 6, "data.partition": "dirichlet",
        "data.alpha": 1.0,
        "model.name": "mlp",
        "training.rounds": 2, "training.clients_per_round": 3, "training.batch_size": 16,
        "training.lr": 0.5, "training.client_parallelism": "loop",
        # A scan over the local steps: it compiles in a fraction of the unrolled
        # steps' time (benchmarks/results/unroll_steps_cpu.md), and these tests run
        # a round or two. The engine's default (32, unrolled, for the rounds after
        # the first) is tested in test_unroll_steps.py and where a test asks for
        # it (ENGINE_UNROLL).
        "training.unroll_steps": 0,
        "eval.every": 1, "output.progress": False, "output.plots": False,
    }
    base.update(overrides)
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


def small_dataset(seed=0, n=600):
    return synthetic_dataset(seed=seed, image_size=16, num_train=n, num_test=200)


def random_zeroing_upload(rate=0.5):
    """An upload-stage test defense: zero each coordinate of Δ with probability ``rate``.

    Every client draws its own pattern from its upload key, so clients send
    different coordinates — what the ``sender_mean`` aggregation is about.
    """
    import jax
    import jax.numpy as jnp

    from fedsim.hooks import Defense

    def apply(delta, state, *, key, context=None):
        leaves, tree = jax.tree_util.tree_flatten(delta)
        keys = jax.random.split(key, len(leaves))
        kept = [jnp.where(jax.random.bernoulli(k, 1.0 - rate, l.shape), l, 0.0)
                for k, l in zip(keys, leaves)]
        return jax.tree_util.tree_unflatten(tree, kept), state

    return Defense(init=lambda params: (), apply=apply, stage="upload", name="random_zeroing")


def config_paths(node, prefix=()):
    """Every path into a config's mappings and lists (depth first, in order)."""
    items = node.items() if isinstance(node, dict) else (
        enumerate(node) if isinstance(node, list) else ())
    for k, v in items:
        yield prefix + (k,)
        yield from config_paths(v, prefix + (k,))


def mutate(rng: random.Random, cfg: dict, weird: list, roots=None) -> tuple[dict, str]:
    """A copy of ``cfg`` with one random change, and what it was.

    One path (under the top-level keys ``roots``, default all) is set to a
    value from ``weird``, deleted, or given a bogus key (in the mapping it
    names, else in the mapping that holds it).
    """
    cfg = copy.deepcopy(cfg)
    paths = [p for p in config_paths(cfg) if roots is None or p[0] in roots]
    if not paths:  # an earlier mutation deleted every root
        return cfg, "nothing (no path left)"
    path = rng.choice(paths)
    node = cfg
    for p in path[:-1]:
        node = node[p]
    kind = rng.choice(["set", "set", "set", "delete", "unknown_key"])
    if kind == "delete":
        del node[path[-1]]
    elif kind == "unknown_key" and isinstance(node[path[-1]], dict):
        node[path[-1]]["bogus_" + str(rng.randint(0, 9))] = 1
    elif kind == "unknown_key" and isinstance(node, dict):
        node["bogus_" + str(rng.randint(0, 9))] = 1
    else:
        kind = "set"
        node[path[-1]] = rng.choice(weird)
    return cfg, f"{kind} {'.'.join(map(str, path))}"


#: A small valid run config the fuzzers mutate (synthetic data, one MLP round).
FUZZ_BASE = {
    "name": "fuzz", "seed": 0,
    "data": {"dataset": "synthetic", "num_clients": 4, "partition": "iid", "image_size": 8,
             "max_train": 200, "max_test": 50},
    "model": {"name": "mlp"},
    "training": {"rounds": 1, "clients_per_round": 2, "batch_size": 16, "lr": 0.1,
                 "client_parallelism": "loop"},
    "eval": {"every": 1},
    "output": {"progress": False, "plots": False},
}


def fuzz_command(command: str, base: dict, seed: int, tmp_path, capsys, weird: list,
                 roots=None) -> None:
    """``fedsim COMMAND`` on ``base`` mutated once or twice (seeded by ``seed``,
    under ``roots``) either runs or ends with a one-line ``fedsim: `` message
    (exit 1 or 2), never a traceback; a failure names the seed and mutations."""
    import pytest
    import yaml

    from fedsim.cli import main

    rng = random.Random(seed)
    cfg, what = base, []
    for _ in range(rng.randint(1, 2)):
        cfg, w = mutate(rng, cfg, weird, roots)
        what.append(w)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    try:
        rc = main([command, str(path), "--quiet", "--set", f"output.dir={tmp_path / 'run'}"])
    except Exception as e:  # a traceback is exactly what must not happen
        pytest.fail(f"seed {seed} ({'; '.join(what)}): {type(e).__name__}: {e}")
    err = capsys.readouterr().err
    assert rc in (0, 1, 2), (seed, what, rc)
    if rc:
        lines = [l for l in err.splitlines() if l.strip()]
        assert lines and lines[-1].startswith("fedsim: ") and "Traceback" not in err, \
            (seed, what, err)
