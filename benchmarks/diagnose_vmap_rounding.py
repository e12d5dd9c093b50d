"""Do vmapped clients compute the same update as each client alone, or only round differently?

With the local steps in a scan (``training.unroll_steps: 0``), a vmap over
clients of the width-4 batch-norm ConvNet gave some clients a one-step update
about 1e-4 away from the same client run alone, on inputs that are identical
element for element; the unrolled steps agreed to 1e-7. A gap that size could
be a bug in how the scan's per-step ``lax.cond`` batches (under vmap it becomes
a select of both branches) or float32 rounding amplified by the model. This
separates the two: it runs the same clients in float64 (``jax.enable_x64``,
parameters and data cast), where rounding is about 1e-16. If the vmapped and
single programs compute the same function, their float64 updates agree to
about that; and the float32 updates of both sit about equally far from the
float64 one.

Setting: the test suite's small federation (``tests/fedsim/helpers.py``: 6
synthetic 16×16 clients, Dirichlet α = 1, FedAvg 1 epoch, lr 0.05), the three
clients of round 0's cohort, each with its own key from the round's client key;
batch 200 (one local step for every client) and 16 (up to 10 steps, the
smaller clients' last batches padding only); the scan (0) and unrolled (32)
paths; the MLP, LeNet-5 and the ConvNet at width 4 with and without batch norm.

Usage: ``python -m benchmarks.diagnose_vmap_rounding [--models ...] [--batch-sizes 200,16]
[--out benchmarks/results]``;
writes ``diagnose_vmap_rounding.{json,md}``.
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
from fedsim.models import MODEL_REGISTRY, ConvNet  # noqa: E402
from fedsim.simulation import Simulation  # noqa: E402
from tests.fedsim.helpers import small_config, small_dataset  # noqa: E402

#: The width-4 ConvNets (8 to 16 channels) the batch-norm tests use.
WIDTH4 = {"convnet_width4": False, "convnet_bn_width4": True}
MODELS = ("mlp", "lenet5", "convnet_width4", "convnet_bn_width4")
BATCH_SIZES = (200, 16)
UNROLL = (0, 32)


def _max_diff(a, b) -> float:
    return max(float(jnp.abs(x.astype(jnp.float64) - y.astype(jnp.float64)).max())
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def _to64(tree):
    return jax.tree_util.tree_map(
        lambda a: a.astype(jnp.float64) if a.dtype == jnp.float32 else a, tree)


def _updates(sim, params, datas, keys):
    """(each client alone, the clients vmapped) updates, as lists of pytrees."""
    single = jax.jit(sim.client_update)
    alone = [single(params, d, {}, k).update for d, k in zip(datas, keys)]
    stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *datas)
    many = jax.jit(jax.vmap(sim.client_update, in_axes=(None, 0, None, 0)))(
        params, stacked, {}, jnp.stack(keys)).update
    vmapped = [jax.tree_util.tree_map(lambda a, i=i: a[i], many) for i in range(len(datas))]
    return alone, vmapped


def measure(model: str, batch_size: int, unroll: int) -> dict:
    """The four distances for one setting, each the largest over clients and coordinates."""
    sim = Simulation(small_config(**{"model.name": model, "training.lr": 0.05,
                                     "training.batch_size": batch_size,
                                     "training.unroll_steps": unroll}),
                     dataset=small_dataset())
    params = sim.init_state().params
    clients = [int(c) for c in sim.cohort(0)]
    _, ckey = sim.round_keys(0)
    keys = [jax.random.fold_in(ckey, c) for c in clients]
    datas = [sim.client_data(c) for c in clients]
    alone32, vmapped32 = _updates(sim, params, datas, keys)
    with jax.enable_x64(True):
        alone64, vmapped64 = _updates(sim, _to64(params), [_to64(d) for d in datas], keys)
        if any(a.dtype != jnp.float64 for a in jax.tree_util.tree_leaves(alone64)):
            raise RuntimeError("the float64 run did not run in float64")
        pairs = lambda u, v: max(_max_diff(a, b) for a, b in zip(u, v))  # noqa: E731
        return {
            "model": model, "batch_size": batch_size, "unroll_steps": unroll,
            "steps": int(sim.settings.num_steps), "clients": clients,
            "max_update": max(float(jnp.abs(x).max()) for u in alone64
                              for x in jax.tree_util.tree_leaves(u)),
            "f32_vmap_vs_alone": pairs(vmapped32, alone32),
            "f64_vmap_vs_alone": pairs(vmapped64, alone64),
            "f32_alone_vs_f64": pairs(alone32, alone64),
            "f32_vmap_vs_f64": pairs(vmapped32, alone64),
        }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated model names (default: %(default)s)")
    ap.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)),
                    help="comma-separated local batch sizes (default: %(default)s)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    try:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    except ValueError:
        batch_sizes = []
    if not batch_sizes or min(batch_sizes) < 1:
        ap.error(f"--batch-sizes: expected positive integers, got {args.batch_sizes!r}")
    for name, batch_norm in WIDTH4.items():
        MODEL_REGISTRY.setdefault(name, lambda num_classes=10, bn=batch_norm: ConvNet(
            num_classes, width=4, batch_norm=bn))
    models = checked_models(ap, args.models)
    commit = git_commit()  # at start: the code this process loaded
    t0 = time.perf_counter()
    rows = [measure(m, b, u) for m in models for b in batch_sizes for u in UNROLL]
    result = run_record(rows, "diagnose_vmap_rounding", models, MODELS, time.perf_counter() - t0,
                        commit)
    if batch_sizes != list(BATCH_SIZES):
        result["command"] += f" --batch-sizes {','.join(map(str, batch_sizes))}"
    lines = ["# Vmapped clients against each client alone, in float32 and float64", "",
             f"Produced by `{result['command']}` at commit {result['commit']}, "
             f"{result['device']}, {result['seconds']:.0f} s. Each entry is the largest "
             "|difference| over the round-0 cohort's three clients and every coordinate of "
             "their updates. \"alone\": the jitted client update per client; \"vmap\": the "
             "three clients in one vmapped program (the engine's vmap strategy); f64: the "
             "same parameters and data cast to float64 under `jax.enable_x64`, which the "
             "float32 columns are measured against.", "",
             "| model | batch | steps | unroll | max update | f32 vmap − alone | "
             "f64 vmap − alone | f32 alone − f64 | f32 vmap − f64 |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['batch_size']} | {r['steps']} | {r['unroll_steps']} | "
              f"{r['max_update']:.3g} | {r['f32_vmap_vs_alone']:.3g} | "
              f"{r['f64_vmap_vs_alone']:.3g} | {r['f32_alone_vs_f64']:.3g} | "
              f"{r['f32_vmap_vs_f64']:.3g} |" for r in rows]
    write_json_and_markdown(args.out, "diagnose_vmap_rounding", result, "\n".join(lines) + "\n")
    return result


if __name__ == "__main__":
    main()
