"""What a global pruning mask costs the compiled round step: as an input vs as a constant.

Pruned FL (``pruning:`` in a config, paper 002 Alg 1) multiplies every local
gradient and every upload by the global mask m. The engine passes m to its
compiled steps as an input (``Simulation._client_update_around``). Before Nov 27
2026 m was closed over by the defenses, so it was a constant of the compiled
program: XLA wrote it into the HLO, and every PruneFL/FedDST reconfiguration
compiled every step again.

For each model this builds, in one process and on the same synthetic data, a
dense simulation and a pruned one (PruneFL, p = 0.5, K reconfigurations every
E rounds), and records:

* ``hlo_chars`` and ``compile_s`` (median of ``--repeats``) of one client's step
  (``_run_client``) three ways: dense (the reference), mask as input (the engine
  now), mask as constant (the closure the engine compiled before; the same
  program as passing ``()`` with ``Simulation.client_update``, which still
  closes over the mask);
* the pruned run's seconds per ``run_round`` call (loop strategy; the
  reconfiguration included) and, per jitted step, how
  many executables it holds after the reconfigurations: 1 means none compiled
  again. Before the change each reconfiguration round also compiled the client
  step again (about one ``compile_s`` of the constant program).

Compile seconds are measured with JAX's in-memory caches cleared before each
compile, after the run (so the rounds are timed as a run sees them).

Usage: ``python -m benchmarks.pruned_round_step [--models conv2,vgg11]``. Writes
``benchmarks/results/pruned_round_step.{json,md}``. Compile times on this
2-core machine are noisy: read the medians and ratios.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from benchmarks.results_io import write_json_and_markdown  # noqa: E402

IMAGE_SIZE = {"conv2": 28, "vgg11": 32, "lenet5": 28, "mlp": 16}


def _config(model: str, rounds: int, pruned: bool, reconfigs: int, every: int):
    from fedsim.config import load_config

    sets = {"name": "pruned_round_step", "seed": 0, "data.dataset": "synthetic",
            "data.image_size": IMAGE_SIZE.get(model, 32), "data.num_clients": 4,
            "data.partition": "iid", "data.examples_per_client": 8, "model.name": model,
            "training.algorithm": "fedavg", "training.rounds": rounds,
            "training.clients_per_round": 2, "training.batch_size": 8, "training.lr": 0.01,
            "training.client_parallelism": "loop", "output.progress": False,
            "output.plots": False}
    if pruned:
        sets.update({"pruning.scheme": "prunefl", "pruning.p": 0.5,
                     "pruning.reconfigurations": reconfigs, "pruning.reconfigure_every": every})
    return load_config(None, [f"{k}={v}" for k, v in sets.items()])


def _lowered(sim, gmask):
    st = sim.init_state()
    cs = jax.tree_util.tree_map(lambda a: a[0], st.client_states)
    return sim._run_client.lower(st.params, gmask, sim._x, sim._y, sim._idx, jnp.int32(0), cs,
                                 jax.random.key(0))


def _program(sim, gmask, repeats: int) -> dict:
    text, times = None, []
    for _ in range(repeats):
        jax.clear_caches()  # else JAX serves the repeats from its in-memory executable cache
        lowered = _lowered(sim, gmask)  # a new one each time: Lowered.compile() memoizes
        text = text or lowered.as_text()
        t0 = time.perf_counter()
        lowered.compile()
        times.append(time.perf_counter() - t0)
    return {"hlo_chars": len(text), "compile_s": statistics.median(times), "compile_all_s": times}


def measure(model: str, rounds: int, reconfigs: int, every: int, repeats: int) -> dict:
    from fedsim.data import synthetic_dataset
    from fedsim.simulation import Simulation

    ds = synthetic_dataset(seed=0, image_size=IMAGE_SIZE.get(model, 32), num_train=64,
                           num_test=32)
    dense = Simulation(_config(model, rounds, False, reconfigs, every), dataset=ds)
    pruned = Simulation(_config(model, rounds, True, reconfigs, every), dataset=ds, donate=True)
    n = sum(l.size for l in jax.tree_util.tree_leaves(dense.init_state().params))
    state, seconds, reconfig_rounds = pruned.init_state(), [], []
    for r in range(rounds):
        if pruned.reconfiguration_at(r) is not None:
            reconfig_rounds.append(r)
        t0 = time.perf_counter()  # the whole call: a reconfiguration comes before its timer
        state, _ = pruned.run_round(state, r)
        jax.block_until_ready(state.params)
        seconds.append(time.perf_counter() - t0)
    # The loop strategy's steps (without an observer _run_client is not called).
    executables = {name: getattr(pruned, name)._cache_size()
                   for name in ("_run_and_accumulate", "_finish")}
    # After the run: _program clears JAX's caches, which would make the rounds compile
    # what they share with the simulation's setup (the mask scheme's ops) again.
    programs = {"dense": _program(dense, (), repeats),
                "mask_input": _program(pruned, pruned._mask_arg(), repeats),
                "mask_constant": _program(pruned, (), repeats)}
    later = [s for r, s in enumerate(seconds) if r > 0 and r not in reconfig_rounds]
    return {"model": model, "params": int(n), "programs": programs,
            "round_seconds": seconds, "reconfiguration_rounds": reconfig_rounds,
            "median_other_round_s": statistics.median(later) if later else None,
            "executables_after_run": executables,
            "mask_density": float(sum(float(jnp.sum(m)) for m in jax.tree_util.tree_leaves(
                pruned.global_mask)) / n)}


def markdown(result: dict) -> str:
    lines = [
        "# The global pruning mask in the compiled round step: input vs constant",
        "",
        f"Commit {short_commit(result['commit'])}, {result['device']}; "
        f"`python -m benchmarks.pruned_round_step --models {','.join(result['models'])} "
        f"--rounds {result['rounds']} --reconfigs {result['reconfigs']} --every "
        f"{result['every']} --repeats {result['repeats']}`. Synthetic data, FedAvg, 2 "
        "clients a round with 8 examples and one local step each, loop strategy; "
        "PruneFL p = 0.5. One client's step (`_run_client`): HLO size and compile seconds "
        f"(median of {result['repeats']}).",
        "",
        "| model | params | program | HLO chars | × dense | compile s | × dense |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in result["results"]:
        d = m["programs"]["dense"]
        for name in ("dense", "mask_input", "mask_constant"):
            p = m["programs"][name]
            lines.append(f"| {m['model']} | {m['params']:,} | {name} | {p['hlo_chars']:,} | "
                         f"{p['hlo_chars'] / d['hlo_chars']:.2f} | {p['compile_s']:.2f} | "
                         f"{p['compile_s'] / d['compile_s']:.2f} |")
    lines += ["", "The pruned run with the mask as input (this commit): seconds per round "
              "(reconfiguration rounds in bold) and the executables each jitted step holds "
              "after the run (1: none compiled again).", "",
              "| model | rounds (s) | median other round s | executables |", "|---|---|---|---|"]
    for m in result["results"]:
        secs = ", ".join(f"**{s:.2f}**" if r in m["reconfiguration_rounds"] else f"{s:.2f}"
                         for r, s in enumerate(m["round_seconds"]))
        ex = ", ".join(f"{k} {v}" for k, v in m["executables_after_run"].items())
        other = m["median_other_round_s"]
        lines.append(f"| {m['model']} | {secs} | "
                     f"{'—' if other is None else f'{other:.2f}'} | {ex} |")
    lines += ["", "Round 0 includes compiling every step. Before the change, each "
              "reconfiguration round compiled the client step again around its new constant "
              "(about the `mask_constant` compile seconds; the engine rebuilt every jitted "
              "step, and those without the mask could come from JAX's in-memory cache)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="conv2,vgg11")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reconfigs", type=int, default=3)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if not models:
        ap.error("--models names no model")
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    from fedsim.config import ConfigError

    try:  # a bad model name, round count or schedule is named by the config check
        for m in models:
            _config(m, args.rounds, True, args.reconfigs, args.every)
    except ConfigError as e:
        ap.error(str(e))
    result = {"commit": git_commit(), "device": f"{jax.default_backend()} ({platform.machine()})",
              "models": models, "rounds": args.rounds, "reconfigs": args.reconfigs,
              "every": args.every, "repeats": args.repeats,
              "results": [measure(m, args.rounds, args.reconfigs, args.every, args.repeats)
                          for m in models]}
    write_json_and_markdown(args.out, "pruned_round_step", result, markdown(result))
    return result


if __name__ == "__main__":
    main()
