"""Why did tan2024's learned MIA AUC move while its models did not?

The re-run of tan2024's training part at ec5ce53 gave bit-identical models and
accuracies, the same loss-threshold AUCs, but learned-attack AUCs moved by up to
0.04 (no defense: 0.528 → 0.540). Hypothesis: the learned attack's last-layer
gradient feature (:func:`attacks.membership.features`) takes one example at a
time, so on CPU it now runs through the im2col convolution
(:data:`fedsim.models.IM2COL_MAX_BATCH`, batch ≤ 4), which rounds differently
from ``lax.conv``; the learned attack, trained on 320 + 320 examples, amplifies
that into a different AUC.

This script trains the train part's undefended model once (quick budget, seed 0,
the script's own :func:`train_run`), captures the final model and the member /
non-member sets, and reports:

1. the largest difference in the gradient feature between im2col and lax.conv;
2. the learned AUC with the script's attack keys (the median over its
   ``mia_attack_keys`` trained attacks, as tan2024 reports it) under both paths;
3. the learned AUC of one attack trained from each of ``--keys`` other keys
   (stream ``diagnose_mia_im2col/attack``), im2col path: the spread a key
   change alone gives, to compare the path change with.

Usage:
  python -m benchmarks.diagnose_mia_im2col [--keys 10] [--seed 0]

Writes benchmarks/results/mia_im2col.json and .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attacks import membership as mia
from benchmarks import reproduce_tan2024 as tan
from benchmarks.provenance import git_commit
from fedsim import models
from fedsim.data import load_dataset
from fedsim.keys import experiment_key

RESULTS = Path(__file__).resolve().parent / "results"


def capture_final_model(seed: int):
    """Train the undefended quick-budget model as tan2024's train part does and
    return the arguments its :func:`tan.mia_aucs` call received."""
    budget = tan.BUDGETS["quick"]
    ds_full = load_dataset("fashion_mnist", image_size=32)
    stats = tan.data_statistics(ds_full.x_train)
    n_train = budget.num_clients * budget.examples_per_client
    ds = dataclasses.replace(ds_full, x_train=ds_full.x_train[:n_train],
                             y_train=ds_full.y_train[:n_train], x_test=ds_full.x_test[:2000],
                             y_test=ds_full.y_test[:2000])
    mi_start = jnp.asarray(ds_full.x_test[2000:].mean(0))
    centres = np.stack([ds.x_train[ds.y_train == c].mean(0) for c in range(ds.num_classes)])
    captured = {}
    original = tan.mia_aucs

    def spy(*args, **kwargs):
        captured["args"], captured["kwargs"] = args, kwargs
        out = original(*args, **kwargs)
        captured["out"] = out
        return out

    tan.mia_aucs = spy
    try:
        out = tan.train_run(budget.train_models[0], ds, budget, seed, {}, None, stats, mi_start,
                            centres)
    finally:
        tan.mia_aucs = original
    return budget, out, captured


def learned_auc(args, keys, limit: int) -> dict:
    """tan.mia_aucs with attack keys ``keys`` ([K]) and IM2COL_MAX_BATCH = ``limit``."""
    apply_fn, params, x_in, y_in, x_out, y_out, _, steps, num_classes = args
    with models.im2col_max_batch(limit):
        return tan.mia_aucs(apply_fn, params, x_in, y_in, x_out, y_out, keys, steps, num_classes)


def feature_difference(args) -> dict:
    """Largest |difference| between the im2col and lax.conv last-layer gradient features."""
    apply_fn, params, x_in, y_in, *_, num_classes = args
    n = min(len(x_in), 640)
    x, y = jnp.asarray(x_in[:n]), y_in[:n]
    default = models.IM2COL_MAX_BATCH
    feats = {}
    for limit in (default, 0):
        with models.im2col_max_batch(limit):
            # A fresh jit per path: the dispatch happens at trace time.
            feats[limit] = np.asarray(jax.jit(
                lambda xx, yy: mia._last_layer_grads(apply_fn, params, xx, yy, num_classes))(x, y))
    a, b = feats[default], feats[0]
    return {"examples": n, "max_abs_difference": float(np.max(np.abs(a - b))),
            "max_abs_feature": float(np.max(np.abs(b))),
            "identical": bool(np.array_equal(a, b))}


def markdown(res: dict) -> str:
    f = res["feature"]
    keys = res["other_keys"]
    lines = [
        "# Learned MIA AUC: im2col vs lax.conv, and vs the attack key",
        "",
        f"Produced by `{res['command']}` at commit {res['commit']} in {res['seconds']:.0f} s "
        f"(seed {res['seed']}, tan2024 quick budget, model {res['model']}, no defense; "
        f"{res['known']} known + {res['scored']} scored examples per side).",
        "",
        f"- Final model's accuracy: {res['accuracy']:.4f}.",
        f"- Gradient feature, im2col vs lax.conv over {f['examples']} members: "
        f"max |difference| {f['max_abs_difference']:.3g} (max |feature| "
        f"{f['max_abs_feature']:.3g}); identical: {f['identical']}.",
        "",
        "| attack keys | convolution path | learned AUC | loss-threshold AUC |",
        "|---|---|---|---|",
    ]
    for r in res["script_key"]:
        lines.append(f"| the script's (median of {len(r['learned_per_key'])}: "
                     + ", ".join(f"{a:.4f}" for a in r["learned_per_key"])
                     + f") | {r['path']} | {r['learned']:.4f} | {r['loss_threshold']:.4f} |")
    aucs = [r["learned"] for r in keys]
    lines += [
        "",
        f"Other attack keys, one trained attack each (stream `{res['key_stream']}`, im2col "
        "path), learned AUC: "
        + ", ".join(f"{a:.4f}" for a in aucs),
        "",
        f"Median {np.median(aucs):.4f}, range {min(aucs):.4f}–{max(aucs):.4f}, "
        f"std {np.std(aucs, ddof=1):.4f}. Path change of the script's median: "
        f"{abs(res['script_key'][0]['learned'] - res['script_key'][1]['learned']):.4f}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keys", type=int, default=10, help="other attack keys to try")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.keys < 2:
        ap.error(f"--keys must be >= 2 (a spread needs two), got {args.keys}")
    t0, commit = time.perf_counter(), git_commit()
    budget, out, cap = capture_final_model(args.seed)
    mia_args = cap["args"]
    script_keys = mia_args[6]
    rows = []
    for path, limit in (("im2col (batch <= %d)" % models.IM2COL_MAX_BATCH,
                         models.IM2COL_MAX_BATCH), ("lax.conv", 0)):
        r = learned_auc(mia_args, script_keys, limit)
        rows.append({"path": path, "im2col_max_batch": limit, **r})
    stream = "diagnose_mia_im2col/attack"
    others = jax.random.split(experiment_key(args.seed, stream), args.keys)
    other_rows = [learned_auc(mia_args, k[None], models.IM2COL_MAX_BATCH) for k in others]
    res = {"command": " ".join(["python -m benchmarks.diagnose_mia_im2col",
                                *(argv if argv is not None else sys.argv[1:])]),
           "commit": commit, "seed": args.seed, "model": budget.train_models[0],
           "accuracy": out["accuracy"], "in_run": cap["out"],
           "known": cap["out"]["known"], "scored": cap["out"]["scored"],
           "feature": feature_difference(mia_args), "script_key": rows,
           "key_stream": stream, "other_keys": other_rows,
           "seconds": time.perf_counter() - t0}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mia_im2col.json").write_text(json.dumps(res, indent=1, default=float))
    md = markdown(res)
    (args.out / "mia_im2col.md").write_text(md)
    print(md)
    return res


if __name__ == "__main__":
    main()
