"""Achieved GFLOP/s of the engine vs a measured matmul peak (issue 9 §7).

* Peak: median time of a jitted float32 matmul (``--matmul-size``, default
  1024², 2·n³ FLOPs) on the default backend.
* Engine: FLOPs of one client's local training (LeNet-5, 32×32×1, 64
  examples, 2 SGD steps of batch 32) from XLA's own cost analysis of the
  compiled client step, times the cohort size, divided by the measured
  median round time of the ``loop`` strategy (one jitted dispatch/client).

Writes ``benchmarks/results/gflops.{json,md}``. On a GPU run the same
command there; the device is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.provenance import git_commit, short_commit  # noqa: E402


def matmul_peak(n: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f = jax.jit(jnp.dot)
    jax.block_until_ready(f(a, b))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(a, b))
        ts.append(time.perf_counter() - t0)
    sec = statistics.median(ts)
    return {"n": n, "seconds": sec, "gflops": 2 * n ** 3 / sec / 1e9}


def engine(clients: int, repeats: int, strategy: str) -> dict:
    import jax
    import jax.numpy as jnp

    from fedsim.config import load_config
    from fedsim.data import synthetic_dataset
    from fedsim.simulation import Simulation

    ds = synthetic_dataset(seed=0, image_size=32, num_train=64 * clients, num_test=100)
    cfg = load_config(None, [
        "data.dataset=synthetic", f"data.num_clients={clients}", "data.partition=iid",
        "data.examples_per_client=64", "model.name=lenet5", f"training.clients_per_round={clients}",
        "training.batch_size=32", f"training.client_parallelism={strategy}",
        "output.progress=false"])
    sim = Simulation(cfg, dataset=ds, donate=True)
    state = sim.init_state()
    _, ckey = sim.round_keys(0)
    cost = sim._run_client.lower(state.params, sim._mask_arg(), sim._x, sim._y, sim._idx,
                                 jnp.int32(0),
                                 jax.tree_util.tree_map(lambda s: s[0], state.client_states),
                                 ckey).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops_client = float(cost.get("flops", float("nan")))
    state, _ = sim.run_round(state, 0)
    ts = []
    for r in range(1, repeats + 1):
        state, res = sim.run_round(state, r)
        ts.append(res.seconds)
    sec = statistics.median(ts)
    return {"clients": clients, "strategy": sim.strategy, "seconds_per_round": sec,
            "flops_per_client": flops_client,
            "gflops": flops_client * clients / sec / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--matmul-size", type=int, default=1024)
    ap.add_argument("--clients", type=int, default=None)
    ap.add_argument("--strategy", default="loop")
    args = ap.parse_args()
    commit = git_commit()  # at start: the code this process loaded
    import jax

    repeats = 3 if args.quick else 7
    clients = args.clients or (20 if args.quick else 100)
    peak = matmul_peak(args.matmul_size, repeats * 3)
    eng = engine(clients, repeats, args.strategy)
    d = jax.devices()[0]
    result = {"device": f"{jax.default_backend()}: {getattr(d, 'device_kind', d)}; "
                        f"{os.cpu_count()} cores", "jax": jax.__version__,
              "mode": "quick" if args.quick else "full", "loadavg": os.getloadavg(),
              "matmul_peak": peak, "engine": eng,
              "fraction_of_peak": eng["gflops"] / peak["gflops"],
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit}
    from fedsim.results import atomic_write_text
    out = ROOT / "benchmarks" / "results" / "gflops"
    atomic_write_text(out.with_suffix(".json"), json.dumps(result, indent=1) + "\n")
    md = (f"# Achieved GFLOP/s vs matmul peak ({result['mode']} mode)\n\n"
          f"Device: {result['device']}, jax {result['jax']}, load average {result['loadavg'][0]:.1f} "
          f"(shared machine: noisy). Produced by `python benchmarks/gflops.py"
          f"{' --quick' if args.quick else ''}` on {result['date']} at commit {short_commit(commit)}.\n\n"
          "| measurement | seconds | GFLOP/s |\n|---|---|---|\n"
          f"| matmul {peak['n']}² f32 (peak) | {peak['seconds']:.4f} | {peak['gflops']:.1f} |\n"
          f"| engine round, LeNet-5, {eng['clients']} clients, {eng['strategy']} "
          f"({eng['flops_per_client'] / 1e6:.1f} MFLOP/client, XLA cost analysis) | "
          f"{eng['seconds_per_round']:.3f} | {eng['gflops']:.2f} |\n\n"
          f"Engine at {100 * result['fraction_of_peak']:.1f} % of the matmul peak.\n")
    atomic_write_text(out.with_suffix(".md"), md)
    print(md)


if __name__ == "__main__":
    main()
