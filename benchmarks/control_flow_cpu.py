"""Why local steps are unrolled on CPU: a conv step inside control flow is slower.

Times two local SGD steps of LeNet-5 (64 examples, batch 32) jitted four ways:
straight-line (Python-unrolled), ``lax.scan`` over the steps, each step in a
``lax.cond`` branch, and the engine's own client update with
``unroll_steps`` 0 (scan) vs 32 (unrolled). Calls are interleaved so load
changes hit every variant alike; medians reported. Writes
``benchmarks/results/control_flow_cpu.{json,md}``.

Run: ``python benchmarks/control_flow_cpu.py [--repeats 40]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fedsim.client import LocalTraining, make_client_update, masked_mean_loss  # noqa: E402
from fedsim.models import build_model, init_params, make_apply_fn  # noqa: E402
from fedsim.typing import CohortData  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--out", default="benchmarks/results/control_flow_cpu")
    args = ap.parse_args()

    model = build_model("lenet5")
    params = init_params(model, (28, 28, 1), jax.random.key(0))
    apply_fn = make_apply_fn(model)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(size=(64, 28, 28, 1)).astype(np.float32))
    y = jnp.asarray(rng.integers(0, 10, 64).astype(np.int32))
    mask = jnp.ones(64)

    def sgd(p, idx):
        g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, p, x[idx], y[idx], mask[idx])
        return jax.tree_util.tree_map(lambda a, b: a - 0.05 * b, p, g)

    batches = jnp.arange(64).reshape(2, 32)

    @jax.jit
    def straight(p):
        for i in range(2):
            p = sgd(p, batches[i])
        return p

    @jax.jit
    def scanned(p):
        return jax.lax.scan(lambda c, idx: (sgd(c, idx), None), p, batches)[0]

    @jax.jit
    def in_cond(p):
        for i in range(2):
            p = jax.lax.cond(jnp.any(mask > 0), lambda q: sgd(q, batches[i]), lambda q: q, p)
        return p

    data = CohortData(x, y, mask, jnp.int32(64))
    variants = {"straight-line": straight, "lax.scan": scanned, "lax.cond": in_cond}
    for u in (0, 32):
        fn = jax.jit(make_client_update(apply_fn, optax.sgd(0.05),
                                        LocalTraining("fedavg", 1, 32, 64, unroll_steps=u)))
        variants[f"engine client, unroll_steps={u}"] = (
            lambda p, fn=fn: fn(p, data, {}, jax.random.key(1)))
    for fn in variants.values():
        jax.block_until_ready(fn(params))
    times = {k: [] for k in variants}
    for _ in range(args.repeats):
        for k, fn in variants.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(params))
            times[k].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    base = med["straight-line"]
    rows = [{"variant": k, "median_ms": 1e3 * v, "ratio_to_straight_line": v / base}
            for k, v in med.items()]
    meta = {"device": f"{jax.default_backend()} {platform.machine()} {os.cpu_count()} cores",
            "jax": jax.__version__, "repeats": args.repeats, "loadavg": os.getloadavg()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, **meta}, indent=2) + "\n")
    lines = ["# Two LeNet-5 SGD steps (batch 32) under different control flow", "",
             f"Device {meta['device']}, jax {meta['jax']}, median of {args.repeats} interleaved "
             f"calls, load average {meta['loadavg'][0]:.1f}. Produced by "
             "`python benchmarks/control_flow_cpu.py`.", "",
             "| variant | median ms | ratio to straight-line |", "|---|---|---|"]
    lines += [f"| {r['variant']} | {r['median_ms']:.1f} | {r['ratio_to_straight_line']:.2f} |"
              for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
