"""How far one client's FedAvg update moves when its start weights move by rounding.

The cohort strategies (loop, vmap, chunked) compute the same client update
with other convolution code and so other float rounding. For LeNet-5 and the
MLP they agree to about 1e-5 (``tests/fedsim/test_simulation.py::test_strategies_agree``).
This measures, per model, how much the update of one client moves when every
start weight is multiplied by 1 + ε (ε = 1e-7, about float32's rounding, and
1e-6): a smooth local training moves by about ε times the weights' scale, and a
jump far above that means a discrete switch (a max-pool window's winner or a
ReLU flipping) that rounding alone can set off. Such models cannot be held to a
tight tolerance between strategies over several local steps, with or without
batch norm (``tests/fedsim/test_batch_norm.py::test_strategies_agree_with_batch_norm``
compares them over one local step).

Setting: the test suite's small federation (``tests/fedsim/helpers.py``: 6
synthetic 16×16 clients, Dirichlet α = 1, FedAvg 1 epoch at B = 16, lr 0.05);
clients 0 and 3; the jitted client update of the engine.

Usage: ``python -m benchmarks.diagnose_convnet_rounding [--models mlp,lenet5,convnet,convnet_bn]
[--out benchmarks/results]``; writes ``diagnose_convnet_rounding.{json,md}``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.diagnostic_run import checked_models, run_record  # noqa: E402
from benchmarks.provenance import git_commit  # noqa: E402
from benchmarks.results_io import write_json_and_markdown  # noqa: E402
from fedsim.simulation import Simulation  # noqa: E402
from tests.fedsim.helpers import small_config, small_dataset  # noqa: E402

MODELS = ("mlp", "lenet5", "convnet", "convnet_bn")
EPSILONS = (1e-7, 1e-6)
CLIENTS = (0, 3)


def measure(model: str) -> list[dict]:
    """Max |Δ update| of each client at each ε, beside the update's own scale."""
    sim = Simulation(small_config(**{"model.name": model, "training.lr": 0.05}),
                     dataset=small_dataset())
    params = sim.init_state().params
    _, ckey = sim.round_keys(0)
    rows = []
    for c in CLIENTS:
        update = jax.jit(lambda p, c=c: sim.client_update(
            p, sim.client_data(c), {}, jax.random.fold_in(ckey, c)).update)
        base = update(params)
        scale = max(float(jnp.abs(u).max()) for u in jax.tree_util.tree_leaves(base))
        for eps in EPSILONS:
            moved = update(jax.tree_util.tree_map(lambda w: w * (1 + eps), params))
            diff = max(float(jnp.abs(a - b).max()) for a, b in
                       zip(jax.tree_util.tree_leaves(base), jax.tree_util.tree_leaves(moved)))
            rows.append({"model": model, "client": c, "epsilon": eps, "max_update": scale,
                         "max_change": diff})
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated registry names (default: %(default)s)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    models = checked_models(ap, args.models)
    commit = git_commit()  # at start: the code this process loaded
    t0 = time.perf_counter()
    rows = [r for m in models for r in measure(m)]
    result = run_record(rows, "diagnose_convnet_rounding", models, MODELS, time.perf_counter() - t0,
                        commit)
    lines = ["# One client's update against a rounding-sized change of its start weights", "",
             f"Produced by `{result['command']}` at commit {result['commit']}, "
             f"{result['device']}, {result['seconds']:.0f} s. Every start weight times 1 + ε; "
             "the largest change of any coordinate of the client's update, beside the "
             "update's largest coordinate.", "",
             "| model | client | ε | max update | max change |", "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['client']} | {r['epsilon']:.0e} | {r['max_update']:.3g} | "
              f"{r['max_change']:.3g} |" for r in rows]
    write_json_and_markdown(args.out, "diagnose_convnet_rounding", result, "\n".join(lines) + "\n")
    return result


if __name__ == "__main__":
    main()
