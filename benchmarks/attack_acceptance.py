"""Acceptance check of issue 3: IG and DLG at batch 1 on real Fashion-MNIST.

Untrained models (init key 0): paper 001's 13,700-parameter MLP and the DLG
sigmoid LeNet, both on 16×16 Fashion-MNIST (the MLP needs 16×16; LeNet uses
the same size to fit the CPU budget). Labels are inferred (iDLG), not granted.
Targets: PSNR ≥ 30 dB on the MLP, ≥ 20 dB on LeNet, label accuracy 100 %.

Usage:
  python benchmarks/attack_acceptance.py [--quick] [--victims N]

Writes benchmarks/results/attack_acceptance.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attacks.acceptance import attack_and_score, fedsgd_observations  # noqa: E402
from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from fedsim.data import load_dataset  # noqa: E402

TARGET = {"mlp": 30.0, "lenet": 20.0}
ITERATIONS = {"inverting_gradients": 1000, "dlg": 300}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 victims instead of 4")
    ap.add_argument("--victims", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0,
                    help="the attacks' key (attacks.acceptance.attack_key); the model is initialised from jax.random.key(0) whatever the seed")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    commit = git_commit()  # at start: the code this process loaded
    victims = args.victims or (2 if args.quick else 4)
    ds = load_dataset("fashion_mnist", image_size=16)
    rows = []
    for model in ("mlp", "lenet"):
        obs, xs, ys = fedsgd_observations(ds, model, victims, init_seed=0)  # --seed is the attack's
        for attack, iters in ITERATIONS.items():
            res = attack_and_score(attack, obs, xs, ys, {"iterations": iters}, args.seed)
            res.update(model=model, attack=attack, iterations=iters, target_psnr=TARGET[model],
                       passed=bool(res["min_psnr"] >= TARGET[model] and res["mean"]["label_acc"] == 1.0))
            rows.append(res)
            print(f"{model:6s} {attack:20s} mean PSNR {res['mean']['psnr']:6.2f} min {res['min_psnr']:6.2f} "
                  f"SSIM {res['mean']['ssim']:.3f} label acc {res['mean']['label_acc']:.2f} "
                  f"{res['seconds']:.1f}s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"mode": "quick" if args.quick else "full", "victims": victims, "seed": args.seed,
            "model_init_seed": 0,
            "dataset": "fashion_mnist 16x16 (real, training images 0..victims-1)",
            "device": f"{jax.devices()[0].device_kind} ({platform.processor() or platform.machine()})",
            "jax": jax.__version__, "labels": "inferred (iDLG), not granted", "commit": commit}
    (out / "attack_acceptance.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = ["# Attack acceptance (issue 3): batch 1, untrained models, real Fashion-MNIST 16×16\n",
             f"Mode: {meta['mode']} ({victims} victims), attack seed {args.seed} (model from key 0), device {meta['device']}, "
             f"labels {meta['labels']}. Produced by `benchmarks/attack_acceptance.py` at commit {short_commit(commit)}.\n",
             "| model | attack | iterations | mean PSNR (dB) | min PSNR | target | mean SSIM | mean MSE | label acc | seconds (all victims) | pass |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["mean"]
        lines.append(f"| {r['model']} | {r['attack']} | {r['iterations']} | {m['psnr']:.2f} | "
                     f"{r['min_psnr']:.2f} | ≥ {r['target_psnr']:.0f} | {m['ssim']:.4f} | {m['mse']:.2e} | "
                     f"{m['label_acc']:.2f} | {r['seconds']:.1f} | {'yes' if r['passed'] else 'NO'} |")
    lines.append("\nPSNR is capped at 100 dB (exact reconstruction).")
    (out / "attack_acceptance.md").write_text("\n".join(lines) + "\n")
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
