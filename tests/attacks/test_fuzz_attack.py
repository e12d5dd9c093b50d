"""Attack-config fuzzing: `fedsim attack` with a mutated `attack` or `defenses`
section never ends in a traceback.

The engine's own fuzz test (tests/fedsim/test_fuzz.py) mutates the simulation's
config; this one mutates what it leaves alone: the attack's name, threat model
and settings, and the defenses' parameters. Every mutated config either runs or
is rejected with one line (exit 1 or 2). Mutations are seeded; a failure names
the seed and the mutations so they can be replayed.
"""

import random

import pytest
import yaml

from fedsim.cli import main
from tests.fedsim.helpers import mutate

BASE = {
    "name": "fuzz_attack", "seed": 0,
    "data": {"dataset": "synthetic", "num_clients": 4, "partition": "iid", "image_size": 8,
             "examples_per_client": 1, "max_train": 40, "max_test": 20},
    "model": {"name": "mlp"},
    "training": {"algorithm": "fedsgd", "rounds": 1, "clients_per_round": 2, "lr": 0.1,
                 "client_parallelism": "loop"},
    "eval": {"every": 1},
    "observer": {"clients": [0, 1], "rounds": [0]},
    "attack": {"name": "inverting_gradients", "grants": {"batch_size": True},
               "config": {"iterations": 3, "restarts": 1, "tv": 0.001, "lr": 0.1}},
    "defenses": [{"name": "gc", "p": 0.3}],
    "output": {"progress": False, "plots": False},
}
WEIRD = [None, -1, 0, 1, 2, 2.5, -3.7, 1e9, "", "zzz", True, False, [], [1, "a"], {}, {"k": 1},
         "1e-3", float("nan"), float("inf"), "dlg", "sgi", "fedavg_inversion", "model_inversion",
         "weights", "l2", "lbfgs", "joint", "gaussian", "soteria", "dp_gaussian"]


def _check(seed, tmp_path, capsys):
    rng = random.Random(seed)
    cfg, what = BASE, []
    for _ in range(rng.randint(1, 2)):
        cfg, w = mutate(rng, cfg, WEIRD, roots=("attack", "defenses"))
        what.append(w)
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    try:
        rc = main(["attack", str(p), "--quiet", "--set", f"output.dir={tmp_path / 'run'}"])
    except Exception as e:  # a traceback is exactly what must not happen
        pytest.fail(f"seed {seed} ({'; '.join(what)}): {type(e).__name__}: {e}")
    err = capsys.readouterr().err
    assert rc in (0, 1, 2), (seed, what, rc)
    if rc:
        lines = [l for l in err.splitlines() if l.startswith("fedsim: ")]
        assert lines and "Traceback" not in err, (seed, what, err)


@pytest.mark.parametrize("seed", range(10))
def test_mutated_attack_configs_never_crash(seed, tmp_path, capsys):
    _check(seed, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10, 80))
def test_mutated_attack_configs_never_crash_many(seed, tmp_path, capsys):
    _check(seed, tmp_path, capsys)
