"""Cost of one Soteria-defended local step vs a plain step (CPU).

Times, jitted, for LeNet (DLG, 16×16) and ConvNet (width 16, 16×16) at
batch 32: the plain batch gradient, and the gradient plus Soteria's
replacement with ‖∇_X rᵢ‖ computed three ways — ``jacobian="per_example"``
(``jax.jacrev`` per example, ``lax.map`` over examples; the previous default)
and ``jacobian="batched"`` (one forward pass, L reverse passes over the whole
batch; the new default), and the opt-in approximation ``jacobian="sketch"``
(16 random forward-mode probes; its gradient differs by design). Calls are interleaved so load changes hit every
variant alike; medians reported. Also checks that both give the same
gradient. Writes ``benchmarks/results/soteria_speed.{json,md}``.

Run: ``python benchmarks/soteria_speed.py [--repeats 10]``
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from defenses.soteria import soteria_gradient  # noqa: E402
from fedsim.client import masked_mean_loss  # noqa: E402
from fedsim.hooks import DefenseContext  # noqa: E402
from fedsim.models import ConvNet, build_model, init_params, make_apply_fn  # noqa: E402

VARIANTS = [("plain", None, None), ("per_example chunk 8", "per_example", 8),
            ("batched chunk 32", "batched", 32), ("batched chunk 192", "batched", 192),
            ("sketch 16 probes (approx.)", "sketch", 16)]


def step_fn(apply_fn, method, chunk, p_fc=0.4):
    def f(params, x, y):
        mask = jnp.ones(x.shape[:1])
        g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
        if method is None:
            return g
        ctx = DefenseContext(params=params, x=x, y=y, mask=mask, apply_fn=apply_fn)
        return soteria_gradient(g, ctx, p_fc, jacobian=method, chunk=chunk,
                                key=jax.random.key(3), probes=16)[0]
    return jax.jit(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results/soteria_speed")
    args = ap.parse_args()
    commit = git_commit()  # at start: the code this process loaded
    models = {"lenet": build_model("lenet"), "convnet_w16": ConvNet(num_classes=10, width=16)}
    x = jax.random.uniform(jax.random.key(1), (32, 16, 16, 1))
    y = jax.random.randint(jax.random.key(2), (32,), 0, 10)
    result = {"device": f"{jax.default_backend()} ({platform.machine()}, {os.cpu_count()} cpus)",
              "batch": 32, "image": [16, 16, 1], "p_fc": 0.4, "repeats": args.repeats,
              "commit": commit, "models": {}}
    for name, model in models.items():
        params = init_params(model, (16, 16, 1), jax.random.key(0))
        apply_fn = make_apply_fn(model)
        fns, outs, compile_s = {}, {}, {}
        for label, method, chunk in VARIANTS:
            fns[label] = step_fn(apply_fn, method, chunk)
            t0 = time.perf_counter()
            outs[label] = jax.block_until_ready(fns[label](params, x, y))
            compile_s[label] = time.perf_counter() - t0
        ref = outs["per_example chunk 8"]
        max_diff = {label: float(max(jnp.max(jnp.abs(a - b)) for a, b in zip(
            jax.tree_util.tree_leaves(outs[label]), jax.tree_util.tree_leaves(ref))))
            for label, method, _ in VARIANTS if method is not None}
        times = {label: [] for label, _, _ in VARIANTS}
        for _ in range(args.repeats):
            for label, _, _ in VARIANTS:
                t0 = time.perf_counter()
                jax.block_until_ready(fns[label](params, x, y))
                times[label].append(time.perf_counter() - t0)
        med = {k: float(np.median(v)) for k, v in times.items()}
        result["models"][name] = {
            "median_s": med, "first_call_s": compile_s,
            "slowdown_vs_plain": {k: v / med["plain"] for k, v in med.items()},
            "max_abs_diff_vs_per_example": max_diff}
        print(name, {k: f"{v * 1e3:.1f} ms" for k, v in med.items()}, max_diff, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = ["# Soteria step cost (CPU)", "",
             f"Device {result['device']}; batch 32, 16×16×1, p_fc 0.4, exact score, per-example "
             f"masks; median of {args.repeats} interleaved calls (machine shared: noisy). "
             f"Produced by `benchmarks/soteria_speed.py` at commit {short_commit(commit)}.", "",
             "| model | variant | median ms | × plain step | max abs Δgrad vs per_example |",
             "|---|---|---|---|---|"]
    for name, m in result["models"].items():
        for label, method, _ in VARIANTS:
            diff = "—" if method is None else f"{m['max_abs_diff_vs_per_example'][label]:.1e}"
            lines.append(f"| {name} | {label} | {m['median_s'][label] * 1e3:.1f} | "
                         f"{m['slowdown_vs_plain'][label]:.1f} | {diff} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
