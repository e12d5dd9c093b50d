"""How much splitting victims into calls changes a gradient-inversion attack's results.

Where all victims do not fit in memory at once, the gradient-matching attacks
attack them in calls of as many as fit
(:func:`attacks.gradient_inversion.choose_victims_per_call`). Each victim's
attack is independent of the others', so a split changes the numbers only
through float rounding: XLA compiles a different program for k victims than for
V. This measures that change on real data, for the attacks' own optimisers:
Inverting Gradients with signed Adam (its default) and with plain Adam, and DLG
with L-BFGS. Each attack runs V victims in one call (twice: the repeat must give
identical numbers), then with ``attack.victims_per_call`` pinned to each smaller
size; every run is compared with the first one-call run.

Workload: the attack-acceptance setting (``benchmarks/attack_acceptance.py``):
untrained LeNet, real Fashion-MNIST 16×16 training images 0..V−1, batch 1,
labels inferred (iDLG), the attacks' default budgets.

Usage: ``python -m benchmarks.attack_split_determinism [--victims 8]
[--splits 4 2 1] [--attacks ig_signed ig_unsigned dlg] [--iterations-scale 1]``
Writes ``benchmarks/results/attack_split_determinism.{json,md}``.
"""

from __future__ import annotations

import argparse
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

#: name -> (registered attack, config over its defaults).
ATTACKS = {
    "ig_signed": ("inverting_gradients", {"iterations": 1000}),
    "ig_unsigned": ("inverting_gradients", {"iterations": 1000, "signed": False}),
    "dlg": ("dlg", {"iterations": 300}),
}


def run_attack_rows(name: str, victims: int, splits: list[int], seed: int,
                    iterations_scale: float = 1.0) -> list[dict]:
    """One attack's rows: V at once (twice), then each pinned split."""
    from attacks.acceptance import attack_key, fedsgd_observations
    from attacks.api import ATTACK_REGISTRY
    from attacks.metrics import psnr
    from fedsim.data import load_dataset

    attack, config = ATTACKS[name]
    config = dict(config, iterations=max(1, round(config["iterations"] * iterations_scale)))
    ds = load_dataset("fashion_mnist", image_size=16)
    obs, xs, _ = fedsgd_observations(ds, "lenet", victims, init_seed=0)  # the meta's "model jax.random.key(0)"
    truth = np.concatenate(xs)  # [V, 16, 16, 1]: batch 1 per victim
    run_many = ATTACK_REGISTRY[attack].run_many
    rows, ref = [], None
    for k in [victims, victims, *splits]:
        t0 = time.perf_counter()
        recs = run_many(obs, dict(config, victims_per_call=k), attack_key(seed))
        seconds = time.perf_counter() - t0
        x = np.stack([np.asarray(r.x)[0] for r in recs])
        labels = np.array([int(np.asarray(r.labels)[0]) for r in recs])
        scores = np.asarray(psnr(np.clip(x, 0.0, 1.0), truth), np.float64)  # as score_batch
        row = {"attack": name, "config": config, "victims": victims, "victims_per_call": k,
               "seconds": seconds, "psnr": scores.tolist(), "mean_psnr": float(scores.mean())}
        if ref is None:
            ref = {"x": x, "labels": labels, "psnr": scores}
            row["reference"] = True
        else:
            row.update(
                identical=bool(np.array_equal(x, ref["x"]) and np.array_equal(labels, ref["labels"])),
                max_abs_dx=float(np.max(np.abs(x - ref["x"]))),
                max_abs_dpsnr=float(np.max(np.abs(scores - ref["psnr"]))),
                mean_dpsnr=float(scores.mean() - ref["psnr"].mean()),
                labels_equal=bool(np.array_equal(labels, ref["labels"])))
        rows.append(row)
        print(f"{name:12s} k={k:2d} mean PSNR {row['mean_psnr']:6.2f} "
              f"max|dx| {row.get('max_abs_dx', 0):.2e} max|dPSNR| {row.get('max_abs_dpsnr', 0):.2f} "
              f"{seconds:.1f}s", flush=True)
    return rows


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [
        "# Splitting victims into calls: how much the attack's results change",
        "",
        f"Commit {short_commit(meta['commit'])}; {meta['device']}; "
        f"`{' '.join(['python -m benchmarks.attack_split_determinism', *meta['argv']])}`. "
        f"Workload: {meta['workload']}. Each attack ran its "
        f"{meta['victims']} victims in one call twice, then with `attack.victims_per_call` "
        "pinned to each smaller size; every row is compared with the first one-call run "
        "(the reference, same key).",
        "",
        "| attack | iterations | victims per call | mean PSNR (dB) | identical to reference | "
        "max abs Δx | max abs ΔPSNR (dB) | mean ΔPSNR (dB) | labels equal | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if r.get("reference"):
            rest = "reference | – | – | – | – "
        else:
            rest = (f"{'yes' if r['identical'] else 'no'} | {r['max_abs_dx']:.2e} | "
                    f"{r['max_abs_dpsnr']:.2f} | {r['mean_dpsnr']:+.2f} | "
                    f"{'yes' if r['labels_equal'] else 'no'} ")
        lines.append(f"| {r['attack']} | {r['config']['iterations']} | {r['victims_per_call']} | "
                     f"{r['mean_psnr']:.2f} | {rest}| {r['seconds']:.1f} |")
    lines += ["", "Per-victim PSNR (dB), in victim order:", ""]
    for r in result["rows"]:
        lines.append(f"- {r['attack']}, {r['victims_per_call']} per call"
                     f"{' (reference)' if r.get('reference') else ''}: "
                     + " / ".join(f"{p:.2f}" for p in r["psnr"]))
    lines += ["", "PSNR is capped at 100 dB (exact reconstruction)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--victims", type=int, default=8)
    ap.add_argument("--splits", type=int, nargs="+", default=[4, 2, 1],
                    help="victims per call to compare with all at once")
    ap.add_argument("--attacks", nargs="+", choices=sorted(ATTACKS), default=list(ATTACKS))
    ap.add_argument("--iterations-scale", type=float, default=1.0,
                    help="multiply each attack's iterations (tests use a small value)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="attack_split_determinism")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    if args.victims < 2:
        ap.error("--victims: at least 2, or there is nothing to split")
    bad = [k for k in args.splits if not 1 <= k < args.victims]
    if bad:
        ap.error(f"--splits: each must lie in [1, --victims), got {bad}")
    if args.iterations_scale <= 0:
        ap.error(f"--iterations-scale: must be positive, got {args.iterations_scale}")
    commit = git_commit()  # at start: the code this process loaded
    import jax

    rows = []
    for name in args.attacks:
        rows += run_attack_rows(name, args.victims, args.splits, args.seed, args.iterations_scale)
    meta = {"commit": commit, "argv": argv, "victims": args.victims, "seed": args.seed,
            "device": f"{jax.devices()[0].device_kind} ({platform.processor() or platform.machine()})",
            "jax": jax.__version__,
            "workload": ("untrained LeNet, real Fashion-MNIST 16×16 training images "
                         f"0..{args.victims - 1}, batch 1, labels inferred (iDLG), model init key "
                         f"jax.random.key(0), attack key attacks.acceptance.attack_key({args.seed})")}
    result = {"meta": meta, "rows": rows}
    write_json_and_markdown(args.out, args.name, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
