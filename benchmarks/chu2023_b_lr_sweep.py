"""Which learning rate trains part B's VGG-11? A sweep on chu2023's FL setting.

``benchmarks/reproduce_chu2023.py`` part B trained VGG-11 at lr 0.1 (its
``--lr`` default, chosen for Conv-2) and reached 0.30 test accuracy
(``chu2023_B_vgg11.json``). This runs ``fedsim sweep`` on
``configs/chu2023_b_lr_sweep.yaml`` (part B's FL setting without its pruning
mask or defenses) over a grid of learning rates and seeds, then reads each
cell's ``metrics.jsonl``: the test accuracy averaged over the last 5 rounds
(part B's steadier reading: the accuracy of one round jumps by 20 points) and
of the last round. Test accuracy on the first ``--max-test`` test images.

Usage: ``python -m benchmarks.chu2023_b_lr_sweep [--model vgg11]
[--lrs 0.01 0.03 0.1 0.3] [--seeds 0 1 2] [--max-test 2000]``.
Writes ``benchmarks/results/chu2023_b_lr_sweep/`` (the sweep's cells and
``results.{json,md}``) and ``benchmarks/results/chu2023_b_lr_sweep.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from benchmarks.results_io import write_json_and_markdown  # noqa: E402

CONFIG = ROOT / "configs" / "chu2023_b_lr_sweep.yaml"
LAST_ROUNDS = 5


def cell_accuracy(cell_dir: Path) -> dict:
    """Last-round and last-5-rounds test accuracy of one finished cell."""
    rows = [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines()]
    acc = [r["test_accuracy"] for r in rows if r.get("test_accuracy") is not None]
    return {"last": acc[-1], "last5": float(np.mean(acc[-LAST_ROUNDS:])), "rounds": len(rows)}


def summarise(rows: list[dict], lrs: list[float]) -> list[dict]:
    out = []
    for lr in lrs:
        cells = [r for r in rows if r["training.lr"] == lr and r.get("last5") is not None]
        v = np.array([c["last5"] for c in cells])
        out.append({"lr": lr, "seeds": [c["seed"] for c in cells],
                    "last5_per_seed": v.tolist(), "last_per_seed": [c["last"] for c in cells],
                    "mean_last5": float(v.mean()) if len(v) else None,
                    "se_last5": float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else None,
                    "failed": [r["status"] for r in rows
                               if r["training.lr"] == lr and not r["status"].startswith("done")]})
    return out


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = [
        f"# chu2023 part B's FL setting: test accuracy of {m['model']} vs learning rate",
        "",
        f"Commit {short_commit(m['commit'])}; {m['device']}; "
        f"`{' '.join(['python -m benchmarks.chu2023_b_lr_sweep', *m['argv']])}` in "
        f"{m['seconds']:.0f} s. `fedsim sweep` on `configs/chu2023_b_lr_sweep.yaml` (Fashion-MNIST "
        "16×16, 20 clients × 20 examples, Dirichlet(0.5), 10 per round, FedAvg one local step "
        f"at batch 20, {m['rounds']} rounds, no mask, no defense); accuracy on the first "
        f"{m['max_test']} "
        f"test images, averaged over the last {LAST_ROUNDS} rounds (mean ± SE over seeds), and "
        "of the last round. Part B ran lr 0.1.",
        "",
        f"| lr | last-{LAST_ROUNDS}-rounds accuracy | per seed | last round, per seed |",
        "|---|---|---|---|",
    ]
    for s in result["summary"]:
        if s["mean_last5"] is None:
            lines.append(f"| {s['lr']:g} | failed: {s['failed']} | – | – |")
            continue
        se = "" if s["se_last5"] is None else f" ± {s['se_last5']:.4f}"
        lines.append(f"| {s['lr']:g} | {s['mean_last5']:.4f}{se} | "
                     + " / ".join(f"{a:.3f}" for a in s["last5_per_seed"]) + " | "
                     + " / ".join(f"{a:.3f}" for a in s["last_per_seed"]) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vgg11")
    ap.add_argument("--lrs", type=float, nargs="+", default=[0.01, 0.03, 0.1, 0.3])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--max-test", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=None, help="override the config's 30")
    ap.add_argument("--name", default="chu2023_b_lr_sweep")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    if any(lr <= 0 for lr in args.lrs):
        ap.error(f"--lrs: each must be positive, got {args.lrs}")
    if args.max_test < 1 or (args.rounds is not None and args.rounds < LAST_ROUNDS):
        ap.error(f"--max-test must be >= 1 and --rounds >= {LAST_ROUNDS}")
    commit = git_commit()  # at start: the code this process loaded
    t0 = time.perf_counter()
    import jax

    from fedsim.sweep import cell_name, run_sweep

    sweep_dir = Path(args.out) / args.name
    overrides = [f"model.name={args.model}", f"data.max_test={args.max_test}"]
    if args.rounds is not None:
        overrides.append(f"training.rounds={args.rounds}")
    grid = [f"training.lr={','.join(f'{lr:g}' for lr in args.lrs)}",
            f"seed={','.join(str(s) for s in args.seeds)}"]
    rows = run_sweep(str(CONFIG), grid, sweep_dir, overrides,
                     log=lambda msg: print(msg, flush=True))
    for r in rows:
        if r["status"].startswith("done"):
            name = cell_name({"training.lr": r["training.lr"], "seed": r["seed"]})
            r.update(cell_accuracy(sweep_dir / "cells" / name))
    rounds = max((r.get("rounds", 0) for r in rows), default=0)
    meta = {"commit": commit, "argv": argv, "model": args.model, "max_test": args.max_test,
            "rounds": rounds,
            "config": str(CONFIG.relative_to(ROOT)), "seconds": time.perf_counter() - t0,
            "device": f"{jax.devices()[0].device_kind} ({platform.processor() or platform.machine()})"}
    result = {"meta": meta, "rows": rows, "summary": summarise(rows, args.lrs)}
    write_json_and_markdown(args.out, args.name, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
