"""XLA's memory plan for the membership-inference features, in chunks and all at once.

:func:`attacks.membership.features` takes the examples in chunks of
``batch_size`` (``lax.map``), so its memory should be a chunk's plus the
features themselves, not the whole set's activations. This compiles (does not
run) ``attacks.membership._features`` for sets of each size, once with the
default chunk and once with a chunk that holds the whole set, and reports
:func:`fedsim.memory.planned_bytes` for each: untrained models, CIFAR-10-shaped
inputs (32×32×3), 10 classes.

Usage: ``python -m benchmarks.mia_memory_plan [--models conv2 vgg11]
[--sizes 256 4096]``. Writes ``benchmarks/results/mia_memory_plan.{json,md}``.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from benchmarks.results_io import write_json_and_markdown  # noqa: E402

SHAPE = (32, 32, 3)


def plan_rows(model_names, sizes) -> list[dict]:
    import jax
    import jax.numpy as jnp

    from attacks import membership as MIA
    from fedsim import memory, models
    from fedsim.models import build_model, init_params, make_apply_fn

    rows = []
    for name in model_names:
        model = build_model(name, 10)
        apply_fn = make_apply_fn(model)
        params = init_params(model, SHAPE, jax.random.key(0))
        for n in sizes:
            x = jax.ShapeDtypeStruct((n, *SHAPE), jnp.float32)  # shapes only: nothing allocated
            y = jax.ShapeDtypeStruct((n,), jnp.int32)
            plan = lambda bs: memory.planned_bytes(MIA._features, apply_fn, params, x, y, 10, bs,
                                                   models.trace_settings())
            row = {"model": name, "examples": n, "chunk": MIA.BATCH_SIZE,
                   "chunked_bytes": plan(MIA.BATCH_SIZE), "all_at_once_bytes": plan(max(n, 1))}
            rows.append(row)
            print(row, flush=True)
    return rows


def markdown(result: dict) -> str:
    meta = result["meta"]
    gib = lambda b: "–" if b is None else f"{b / 2**30:.3f}"
    lines = [
        "# Membership-inference features: XLA's memory plan, chunked vs all at once",
        "",
        f"Commit {short_commit(meta['commit'])}; {meta['device']}; "
        f"`{' '.join(['python -m benchmarks.mia_memory_plan', *meta['argv']])}`. "
        "`fedsim.memory.planned_bytes` of `attacks.membership._features` (compiled, not "
        "run): temporaries + outputs for untrained models on 32×32×3 inputs, 10 classes. "
        "Chunked: the default `batch_size`; all at once: one chunk holding the whole set "
        "(what the scorers did before they took chunks).",
        "",
        "| model | examples | chunk | chunked GiB | all at once GiB | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        ratio = ("–" if not r["chunked_bytes"] or r["all_at_once_bytes"] is None
                 else f"{r['all_at_once_bytes'] / r['chunked_bytes']:.1f}×")
        lines.append(f"| {r['model']} | {r['examples']:,} | {r['chunk']} | "
                     f"{gib(r['chunked_bytes'])} | {gib(r['all_at_once_bytes'])} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["lenet5", "conv2", "vgg11"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 4096])
    ap.add_argument("--name", default="mia_memory_plan")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    if any(n < 1 for n in args.sizes):
        ap.error(f"--sizes: each must be at least 1, got {args.sizes}")
    from fedsim.models import MODEL_REGISTRY
    unknown = sorted(set(args.models) - set(MODEL_REGISTRY))
    if unknown:
        ap.error(f"--models: unknown {unknown}; known: {', '.join(sorted(MODEL_REGISTRY))}")
    commit = git_commit()  # at start: the code this process loaded
    import jax

    rows = plan_rows(args.models, args.sizes)
    meta = {"commit": commit, "argv": argv, "jax": jax.__version__,
            "device": f"{jax.devices()[0].device_kind} ({platform.processor() or platform.machine()})"}
    result = {"meta": meta, "rows": rows}
    write_json_and_markdown(args.out, args.name, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
