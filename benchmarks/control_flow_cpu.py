"""Why local steps are unrolled and pooling is sliced on CPU.

Times two local SGD steps of LeNet-5 (64 examples, batch 32) jitted four ways:
straight-line (Python-unrolled), ``lax.scan`` over the steps, each step in a
``lax.cond`` branch, and the engine's own client update with
``unroll_steps`` 0 (scan) vs 32 (unrolled); and the straight-line steps with
the plain flax layers (``nn.Conv`` → ReLU → ``nn.max_pool``, i.e.
``reduce_window`` whose gradient is ``select_and_scatter``) in place of the
engine's :class:`fedsim.models.ConvReLUMaxPool` (phase-packed conv, see
:func:`fedsim.models.conv_relu_maxpool`), same parameters. A second table
times LeNet-5's first layer alone (forward + gradient w.r.t. kernel and bias
at batch 32): plain conv + ``nn.max_pool``, plain conv + sliced
:func:`fedsim.models.max_pool`, and :func:`fedsim.models.conv_relu_maxpool`. Calls are interleaved so load
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

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from fedsim.client import LocalTraining, make_client_update, masked_mean_loss  # noqa: E402
from fedsim.models import (build_model, conv_relu_maxpool, init_params,  # noqa: E402
                           make_apply_fn, max_pool)
from fedsim.typing import CohortData  # noqa: E402


class LeNet5ReduceWindow(nn.Module):
    """``fedsim.models.LeNet5`` written with plain flax layers (the reference)."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(6, (5, 5), padding="SAME" if x.shape[1] < 32 else "VALID")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.Conv(16, (5, 5), padding="VALID")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(120)(x))
        x = nn.relu(nn.Dense(84)(x))
        return nn.Dense(10)(x)


def interleaved_medians(variants: dict, arg, repeats: int) -> dict[str, float]:
    """Median seconds of each ``fn(arg)``, calls interleaved across variants."""
    for fn in variants.values():
        jax.block_until_ready(fn(arg))
    times = {k: [] for k in variants}
    for _ in range(repeats):
        for k, fn in variants.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(arg))
            times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


def first_layer_rows(repeats: int) -> list[dict]:
    """Forward + (kernel, bias) gradient of LeNet-5's conv → ReLU → pool layer."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(32, 32, 32, 1)).astype(np.float32))
    kernel = jnp.asarray(rng.normal(size=(5, 5, 1, 6)).astype(np.float32))
    bias = jnp.asarray(rng.normal(size=(6,)).astype(np.float32))
    cot = jnp.asarray(rng.normal(size=(32, 14, 14, 6)).astype(np.float32))

    def plain(x, k, b):
        return jax.lax.conv_general_dilated(x, k, (1, 1), "VALID",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC")) + b

    layers = {
        "conv + nn.max_pool (reduce_window)":
            lambda x, k, b: nn.max_pool(jax.nn.relu(plain(x, k, b)), (2, 2), strides=(2, 2)),
        "conv + sliced max_pool": lambda x, k, b: max_pool(jax.nn.relu(plain(x, k, b)), 2),
        "conv_relu_maxpool (engine)": conv_relu_maxpool,
    }
    variants = {name: jax.jit(lambda kb, f=f: jax.vjp(lambda k, b: f(x, k, b), *kb)[1](cot))
                for name, f in layers.items()}
    med = interleaved_medians(variants, (kernel, bias), repeats)
    ref = med["conv_relu_maxpool (engine)"]
    return [{"variant": k, "median_ms": 1e3 * v, "ratio_to_engine": v / ref}
            for k, v in med.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--out", default="benchmarks/results/control_flow_cpu")
    args = ap.parse_args()
    commit = git_commit()  # at start: the code this process loaded

    model = build_model("lenet5")
    params = init_params(model, (28, 28, 1), jax.random.key(0))
    apply_fn = make_apply_fn(model)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(size=(64, 28, 28, 1)).astype(np.float32))
    y = jnp.asarray(rng.integers(0, 10, 64).astype(np.int32))
    mask = jnp.ones(64)

    def sgd(p, idx, apply_fn=apply_fn):
        g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, p, x[idx], y[idx], mask[idx])
        return jax.tree_util.tree_map(lambda a, b: a - 0.05 * b, p, g)

    reference_apply = make_apply_fn(LeNet5ReduceWindow())

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

    @jax.jit
    def straight_reduce_window(p):
        for i in range(2):
            p = sgd(p, batches[i], reference_apply)
        return p

    data = CohortData(x, y, mask, jnp.int32(64))
    variants = {"straight-line": straight, "lax.scan": scanned, "lax.cond": in_cond,
                "straight-line, plain flax layers (nn.Conv, nn.max_pool)": straight_reduce_window}
    for u in (0, 32):
        fn = jax.jit(make_client_update(apply_fn, optax.sgd(0.05),
                                        LocalTraining("fedavg", 1, 32, 64, unroll_steps=u)))
        variants[f"engine client, unroll_steps={u}"] = (
            lambda p, fn=fn: fn(p, data, {}, jax.random.key(1)))
    med = interleaved_medians(variants, params, args.repeats)
    base = med["straight-line"]
    rows = [{"variant": k, "median_ms": 1e3 * v, "ratio_to_straight_line": v / base}
            for k, v in med.items()]
    layer_rows = first_layer_rows(args.repeats)
    meta = {"device": f"{jax.default_backend()} {platform.machine()} {os.cpu_count()} cores",
            "jax": jax.__version__, "repeats": args.repeats, "loadavg": os.getloadavg(),
            "commit": commit}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"rows": rows, "first_layer": layer_rows, **meta}, indent=2) + "\n")
    lines = ["# Two LeNet-5 SGD steps (batch 32) under different control flow and pooling", "",
             f"Device {meta['device']}, jax {meta['jax']}, median of {args.repeats} interleaved "
             f"calls, load average {meta['loadavg'][0]:.1f}. Produced by "
             f"`python benchmarks/control_flow_cpu.py` at commit {short_commit(commit)}.", "",
             "| variant | median ms | ratio to straight-line |", "|---|---|---|"]
    lines += [f"| {r['variant']} | {r['median_ms']:.1f} | {r['ratio_to_straight_line']:.2f} |"
              for r in rows]
    lines += ["", "## LeNet-5 first layer alone (32×32×1 → 14×14×6, batch 32): forward + "
              "gradient w.r.t. kernel and bias", "",
              "| variant | median ms | ratio to the engine's |", "|---|---|---|"]
    lines += [f"| {r['variant']} | {r['median_ms']:.2f} | {r['ratio_to_engine']:.2f} |"
              for r in layer_rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
