"""What DP-SGD's per-example clip-and-sum costs on XLA:CPU, one [B, P] matrix vs leaf by leaf.

The example-stage DP defenses (``defenses.dp.gaussian.clipped_sum``, used by
``dp_gaussian``, ``dp_clip`` and ``dp_vmf``) clip B per-example gradients and
sum them. Until this benchmark, both clipping modes first concatenated every
leaf into one [B, P] matrix; per-layer clipping then summed squares with a
``segment_sum`` (a scatter-add) over the P columns and gathered the [B, R]
scales back to [B, P]. Both now work leaf by leaf
(``clipping.clip_examples`` / ``clip_layers``) and concatenate only the [P]
sums. This script measures, in one run, on random per-example gradients with
each model's parameter shapes (all rows real, as a padding mask of ones):

- ``flat, one matrix``: flat clipping as it was (concatenate, clip, sum),
  written out here;
- ``flat, leaf-wise``: the library's flat clipping now (norms as a sum of
  per-leaf sums);
- ``per-layer, segment-sum``: per-layer clipping as it was, written out here;
- ``per-layer, leaf-wise``: the library's per-layer clipping now;
- ``per-example grads``: ``vmap(grad)`` of the cross-entropy on a batch of B
  inputs, the step every variant follows, for scale.

Every variant's sum is compared with a float64 numpy computation (largest
absolute error over the largest absolute value). Calls are jitted,
interleaved, and medians reported.

Run: ``python benchmarks/dp_clip_cpu.py [--repeats 7]``
Writes ``benchmarks/results/dp_clip_cpu.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CLIP_NORM = 1.0
# (model, square input size, channels, batch): paper 001's MLP at its batch 128
# (reproduce_biswas2024, per-layer "clip"), LeNet-5 at 64 (dp_overhead.py),
# part B's Conv-2 at 16x16 with batch 8 and 32.
CASES = (("mlp", 16, 1, 128), ("lenet5", 32, 1, 64), ("conv2", 16, 1, 8), ("conv2", 16, 1, 32))
VARIANTS = ("flat, one matrix", "flat, leaf-wise", "per-layer, segment-sum",
            "per-layer, leaf-wise")


def variants():
    """{name: f(per_example pytree, mask [B]) -> clipped sum [P]}, the four variants."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(ROOT))
    from defenses.dp._flat import batched_rows
    from defenses.dp.gaussian import clipped_sum

    def library(clipping):
        return lambda tree, mask: clipped_sum(tree, mask, CLIP_NORM, clipping)[0]

    def masked_blocks(tree, mask):
        blocks, _ = batched_rows(tree)
        return [b * mask[:, None] for b in blocks]

    def flat_one_matrix(tree, mask):
        # The implementation before this benchmark (clip_rows on flatten_batched).
        matrix = jnp.concatenate(masked_blocks(tree, mask), axis=1)
        norms = jnp.sqrt(jnp.sum(matrix * matrix, axis=1))
        return jnp.sum(matrix * (1.0 / jnp.maximum(1.0, norms / CLIP_NORM))[:, None], axis=0)

    def per_layer_segment_sum(tree, mask):
        # The implementation before this benchmark (clip_rows_per_layer).
        blocks = masked_blocks(tree, mask)
        matrix = jnp.concatenate(blocks, axis=1)
        segments = jnp.asarray(np.repeat(np.arange(len(blocks), dtype=np.int32),
                                         [b.shape[1] for b in blocks]))
        sq = jax.ops.segment_sum((matrix * matrix).T, segments, len(blocks)).T
        scale = 1.0 / jnp.maximum(1.0, jnp.sqrt(sq) / CLIP_NORM)
        return jnp.sum(matrix * scale[:, segments], axis=0)

    return {"flat, one matrix": flat_one_matrix, "flat, leaf-wise": library("flat"),
            "per-layer, segment-sum": per_layer_segment_sum,
            "per-layer, leaf-wise": library("per_layer")}


def float64_reference(tree, mode: str) -> np.ndarray:
    """The clipped sum in float64 numpy (independent of the library)."""
    import jax

    rows = [np.asarray(a, np.float64).reshape(a.shape[0], -1)
            for a in jax.tree_util.tree_leaves(tree)]
    if mode == "flat":
        norms = np.sqrt(sum(np.sum(r * r, axis=1) for r in rows))
        scale = 1.0 / np.maximum(1.0, norms / CLIP_NORM)
        return np.concatenate([(r * scale[:, None]).sum(0) for r in rows])
    return np.concatenate([(r / np.maximum(1.0, np.linalg.norm(r, axis=1) / CLIP_NORM)[:, None])
                           .sum(0) for r in rows])


def measure(model_name: str, size: int, channels: int, batch: int, repeats: int) -> dict:
    """Median seconds and float64 error of each variant at one model and batch."""
    import jax
    import jax.numpy as jnp

    from fedsim.client import cross_entropy
    from fedsim.models import build_model, init_params, make_apply_fn

    model = build_model(model_name, 10)
    shape = (size, size, channels)
    params = init_params(model, shape, jax.random.key(0))
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves) + 2)
    # Per-example gradients of mixed size: some rows above C, some below.
    row_scale = jnp.exp(jax.random.normal(keys[-1], (batch,)))
    per_example = treedef.unflatten([
        jax.random.normal(k, (batch,) + a.shape) * (row_scale.reshape((-1,) + (1,) * a.ndim)
                                                     / np.sqrt(a.size * len(leaves)))
        for k, a in zip(keys, leaves)])
    apply_fn = make_apply_fn(model)
    x = jax.random.uniform(keys[-2], (batch,) + shape)
    y = jnp.arange(batch) % 10
    mask = jnp.ones(batch)  # the engine passes its padding mask (all real rows here)

    def loss_one(p, xi, yi):
        return cross_entropy(apply_fn(p, xi[None]), yi[None])[0]

    grads = jax.jit(jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0)))
    calls = {"per-example grads": (grads, (params, x, y))}
    errors = {}
    refs = {m: float64_reference(per_example, m) for m in ("flat", "per_layer")}
    for name, f in variants().items():
        jf = jax.jit(f)
        ref = refs["flat" if name.startswith("flat") else "per_layer"]
        got = np.asarray(jf(per_example, mask), np.float64)
        errors[name] = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        calls[name] = (jf, (per_example, mask))
    for f, args in calls.values():
        jax.block_until_ready(f(*args))
    times = {k: [] for k in calls}
    for _ in range(repeats):
        for k, (f, args) in calls.items():
            t = time.perf_counter()
            jax.block_until_ready(f(*args))
            times[k].append(time.perf_counter() - t)
    return {"model": model_name, "input_shape": list(shape), "batch": batch,
            "params": int(sum(a.size for a in leaves)), "layers": len(leaves),
            "median_s": {k: float(np.median(v)) for k, v in times.items()},
            "relative_error_vs_float64": errors}


def _markdown(result: dict) -> str:
    lines = ["# DP-SGD's per-example clip-and-sum on XLA:CPU: one [B, P] matrix vs leaf by leaf",
             "",
             f"Device {result['device']}, jax {result['jax']}; random per-example gradients "
             f"with each model's shapes, C = {CLIP_NORM}; median of {result['repeats']} "
             f"interleaved jitted calls; 1-min load average {result['load_average_1min'][0]:.1f}"
             f" → {result['load_average_1min'][1]:.1f}. Produced by "
             f"`python benchmarks/dp_clip_cpu.py` at commit {result['commit'][:7]}.", "",
             "| model | P | layers | B | per-example grads (ms) | "
             + " | ".join(f"{v} (ms)" for v in VARIANTS)
             + " | flat: matrix / leaf-wise | per-layer: segment-sum / leaf-wise |",
             "|---|---|---|---|---|" + "---|" * len(VARIANTS) + "---|---|"]
    for r in result["cases"]:
        m = r["median_s"]
        lines.append(
            f"| {r['model']} | {r['params']:,} | {r['layers']} | {r['batch']} | "
            f"{1e3 * m['per-example grads']:.1f} | "
            + " | ".join(f"{1e3 * m[v]:.1f}" for v in VARIANTS)
            + f" | {m['flat, one matrix'] / m['flat, leaf-wise']:.2f} | "
            f"{m['per-layer, segment-sum'] / m['per-layer, leaf-wise']:.1f} |")
    lines += ["", "Relative error of the clipped sum against float64 numpy "
              "(max |error| / max |value|):", "",
              "| model | B | " + " | ".join(VARIANTS) + " |",
              "|---|---|" + "---|" * len(VARIANTS)]
    for r in result["cases"]:
        e = r["relative_error_vs_float64"]
        lines.append(f"| {r['model']} | {r['batch']} | "
                     + " | ".join(f"{e[v]:.1e}" for v in VARIANTS) + " |")
    lines += ["", "Ratios above 1: the leaf-wise variant is faster. The library now uses "
              "both leaf-wise variants; the others are the former implementation."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--case", nargs=3, action="append", metavar=("MODEL", "SIZE", "BATCH"),
                    help="measure this model at SIZE x SIZE inputs and batch BATCH instead of "
                         "the default cases (repeatable)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    cases = CASES
    if args.case:
        try:
            cases = [(m, int(size), 1, int(batch)) for m, size, batch in args.case]
        except ValueError:
            ap.error(f"--case takes MODEL SIZE BATCH with integer SIZE and BATCH, got {args.case}")
        if any(size < 4 or batch < 1 for _, size, _, batch in cases):
            ap.error(f"--case needs SIZE >= 4 and BATCH >= 1, got {args.case}")
        sys.path.insert(0, str(ROOT))
        from fedsim.models import MODEL_REGISTRY

        unknown = sorted({m for m, *_ in cases} - set(MODEL_REGISTRY))
        if unknown:
            ap.error(f"--case: unknown model(s) {unknown}; known: {', '.join(sorted(MODEL_REGISTRY))}")
    import jax

    load0 = os.getloadavg()[0]
    cases = [measure(*case, args.repeats) for case in cases]
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.provenance import git_commit

    commit = git_commit()  # HEAD, "-dirty" where the code differed
    result = {"repeats": args.repeats, "clip_norm": CLIP_NORM, "commit": commit,
              "jax": jax.__version__, "device": f"cpu ({platform.machine()}, {os.cpu_count()} cpus)",
              "load_average_1min": [load0, os.getloadavg()[0]], "cases": cases}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dp_clip_cpu.json").write_text(json.dumps(result, indent=1))
    md = _markdown(result)
    (args.out / "dp_clip_cpu.md").write_text(md)
    print(md)
    return result


if __name__ == "__main__":
    main()
