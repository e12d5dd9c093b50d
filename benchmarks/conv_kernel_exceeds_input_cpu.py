"""XLA:CPU's convolution where the kernel exceeds the input, against im2col.

VGG's deep layers run a padded 3×3 convolution on 2×2 and 1×1 feature maps
(CIFAR VGG at 32×32 from its fourth stage, at 16×16 from its third). There
XLA:CPU's convolution collapsed to a few GFLOP/s, which made a VGG-11
evaluation of the 10,000 Fashion-MNIST test images at 16×16 take about two
minutes. :func:`fedsim.models.uses_im2col` therefore computes such layers by
im2col. This script measures why and what it buys:

* **layers**: one padded 3×3 convolution (forward) per shape, XLA's conv
  against im2col (each forced with :func:`fedsim.models.conv_implementation`),
  at the batch sizes given; achieved GFLOP/s from the convolution's FLOPs.
* **models**: VGG-11's forward pass over a test batch and its training step
  (gradient of the mean loss) at a client batch, with XLA's conv at every layer
  (``xla``: what ``auto`` was before the kernel rule, at batches above
  :data:`fedsim.models.IM2COL_MAX_BATCH`) against the current ``auto``; the
  largest output difference between the two.

Medians of interleaved calls after a compile call. Writes
``conv_kernel_exceeds_input_cpu.{json,md}`` under ``--out``
(``benchmarks/results``). Run as ``python -m benchmarks.conv_kernel_exceeds_input_cpu``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from benchmarks.provenance import git_commit
from benchmarks.results_io import write_json_and_markdown
from fedsim import models
from fedsim.client import cross_entropy

ROOT = Path(__file__).resolve().parents[1]

# (height = width, input channels, output channels) of VGG-11's layers at 16×16×1,
# and two shapes of the models the earlier benchmark measured (ConvNet, Conv-2).
LAYERS = [(16, 1, 64), (8, 64, 128), (4, 128, 256), (4, 256, 256), (2, 256, 512),
          (2, 512, 512), (1, 512, 512), (14, 32, 64), (8, 32, 32)]
IMPLS = ("xla", "im2col")
MODEL_IMPLS = ("xla", "auto")


def timed(fns: dict, args: tuple, reps: int) -> dict:
    """Median milliseconds of each compiled fn on ``args``, calls interleaved."""
    for f in fns.values():
        jax.block_until_ready(f(*args))
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            times[k].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def compiled_under(impls, fn, args) -> dict:
    """``fn`` traced and compiled under each implementation (a fresh wrapper each:
    the implementation is chosen at trace time)."""
    out = {}
    for impl in impls:
        with models.conv_implementation(impl):
            out[impl] = jax.jit(lambda *a: fn(*a)).lower(*args).compile()
    return out


def layer_rows(batches, reps) -> list[dict]:
    """One row per (batch, layer shape): XLA's conv and im2col, ms and GFLOP/s."""
    def conv(x, k):
        return models.Conv(k.shape[-1], (3, 3), padding=1).apply(
            {"params": {"kernel": k, "bias": jnp.zeros(k.shape[-1])}}, x)

    rows = []
    for batch in batches:
        for h, cin, cout in LAYERS:
            x = jax.random.normal(jax.random.key(0), (batch, h, h, cin))
            k = 0.05 * jax.random.normal(jax.random.key(1), (3, 3, cin, cout))
            ms = timed(compiled_under(IMPLS, conv, (x, k)), (x, k), reps)
            gflop = 2 * batch * h * h * cin * cout * 9 / 1e9  # zero padding counted
            rows.append({"batch": batch, "height": h, "in_channels": cin,
                         "out_channels": cout, "kernel_exceeds_input": 3 > h,
                         "xla_ms": ms["xla"], "im2col_ms": ms["im2col"],
                         "xla_gflops": gflop / ms["xla"] * 1e3,
                         "im2col_gflops": gflop / ms["im2col"] * 1e3,
                         "xla_over_im2col": ms["xla"] / ms["im2col"]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def model_rows(model_name, shape, eval_batch, train_batch, reps) -> list[dict]:
    """VGG forward (``eval_batch``) and training step (``train_batch``), xla vs auto."""
    model = models.build_model(model_name, 10)
    apply_fn = models.make_apply_fn(model)
    params = models.init_params(model, shape, jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (max(eval_batch, train_batch),) + shape)
    y = jax.random.randint(jax.random.key(2), (x.shape[0],), 0, 10)

    def forward(p, xb):
        return apply_fn(p, xb)

    def train_step(p, xb, yb):
        return jax.grad(lambda q: jnp.mean(cross_entropy(apply_fn(q, xb), yb)))(p)

    rows = []
    for label, fn, args in ((f"forward B={eval_batch}", forward, (params, x[:eval_batch])),
                            (f"train step B={train_batch}", train_step,
                             (params, x[:train_batch], y[:train_batch]))):
        fns = compiled_under(MODEL_IMPLS, fn, args)
        outs = {k: jax.tree.leaves(f(*args)) for k, f in fns.items()}
        diff = max(float(jnp.max(jnp.abs(a - b)) / max(float(jnp.max(jnp.abs(b))), 1e-30))
                   for a, b in zip(outs["auto"], outs["xla"]))
        ms = timed(fns, args, reps)
        rows.append({"model": model_name, "input_shape": list(shape), "workload": label,
                     "xla_ms": ms["xla"], "auto_ms": ms["auto"],
                     "xla_over_auto": ms["xla"] / ms["auto"],
                     "max_relative_difference": diff})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(result: dict) -> str:
    lines = ["# XLA:CPU convolution where the kernel exceeds the input (median ms)", "",
             f"Device {result['device']}; median of {result['reps']} interleaved calls after a "
             f"compile call; 1-min load average {result['load_average_1min'][0]:.1f} → "
             f"{result['load_average_1min'][1]:.1f}. Produced by `python -m "
             f"benchmarks.conv_kernel_exceeds_input_cpu {' '.join(result['argv'])}`".rstrip()
             + f" at commit {result['commit']}. GFLOP/s count the zero-padded 3×3 "
             "convolution's multiply-adds (2 FLOPs each).", "",
             "## One padded 3×3 convolution (forward)", "",
             "| batch | input | channels | kernel > input | XLA conv | im2col | XLA / im2col | "
             "XLA GFLOP/s | im2col GFLOP/s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["layers"]:
        lines.append(f"| {r['batch']} | {r['height']}×{r['height']} | {r['in_channels']}→"
                     f"{r['out_channels']} | {'yes' if r['kernel_exceeds_input'] else 'no'} | "
                     f"{r['xla_ms']:.2f} | {r['im2col_ms']:.2f} | {r['xla_over_im2col']:.2f} | "
                     f"{r['xla_gflops']:.1f} | {r['im2col_gflops']:.1f} |")
    lines += ["", "## Whole model: XLA's conv at every layer against `auto`", "",
              "`xla` is what `auto` traced before the kernel rule at batches above "
              f"IM2COL_MAX_BATCH = {result['im2col_max_batch']}.", "",
              "| model | input | workload | xla | auto | xla / auto | max relative difference |",
              "|---|---|---|---|---|---|---|"]
    for r in result["models"]:
        lines.append(f"| {r['model']} | {'×'.join(map(str, r['input_shape']))} | "
                     f"{r['workload']} | {r['xla_ms']:.1f} | {r['auto_ms']:.1f} | "
                     f"{r['xla_over_auto']:.1f} | {r['max_relative_difference']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[20, 500],
                    help="batch sizes of the layer rows (default 20 500)")
    ap.add_argument("--models", nargs="*", default=["vgg11"],
                    help="models of the whole-model rows (default vgg11; none: no rows)")
    ap.add_argument("--image-size", type=int, default=16,
                    help="square 1-channel input of the model rows (default 16, "
                         "reproduce_chu2023's quick size)")
    ap.add_argument("--eval-batch", type=int, default=500)
    ap.add_argument("--train-batch", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    for name in ("batches",):
        if min(getattr(args, name)) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("image_size", "eval_batch", "train_batch", "reps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    unknown = [m for m in args.models if m not in models.MODEL_REGISTRY]
    if unknown:
        ap.error(f"--models: unknown model(s) {unknown}; known: {sorted(models.MODEL_REGISTRY)}")
    if jax.default_backend() != "cpu":
        ap.error(f"this benchmark measures XLA:CPU; the default backend is "
                 f"{jax.default_backend()}")
    commit = git_commit()  # at start: the code this process loaded
    load0 = os.getloadavg()[0]
    layers = layer_rows(args.batches, args.reps)
    shape = (args.image_size, args.image_size, 1)
    rows = [r for m in args.models
            for r in model_rows(m, shape, args.eval_batch, args.train_batch, args.reps)]
    result = {"device": f"cpu ({platform.machine()}, {os.cpu_count()} cpus), "
                        f"jax {jax.__version__}",
              "commit": commit, "load_average_1min": [load0, os.getloadavg()[0]],
              "argv": list(sys.argv[1:] if argv is None else argv), "reps": args.reps,
              "im2col_max_batch": models.IM2COL_MAX_BATCH, "layers": layers, "models": rows}
    write_json_and_markdown(args.out, "conv_kernel_exceeds_input_cpu", result, markdown(result))
    return result


if __name__ == "__main__":
    main()
