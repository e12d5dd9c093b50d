"""Why GraSP-pruned Conv-2 stays at chance in the PriPrune reproduction (issue #7 diagnostic).

In ``reproduce_chu2023.py`` part A (``--a-trained-rounds 30``) every GraSP mask
gives a Conv-2 that FedAvg never lifts above chance, even at p = 0.1. This
script takes part A's initial model and probe batch (seed 0, Fashion-MNIST
16×16), so GraSP's and SNIP's masks (deterministic given those) are part A's;
Random draws its own. It reports, for GraSP, SNIP and Random at each p:

* the kept fraction of each weight leaf and the mean of the kept first-conv
  kernel (before pruning it is ~0);
* the std of the masked model's logits on the probe batch;
* the test accuracy after R FedAvg rounds with the mask fixed (part A's
  ``train_masked``: part B's 20 clients, 10 a round).

Usage: ``python benchmarks/diagnose_grasp_collapse.py [--rates 0.1 --rounds 30]``.
Writes ``benchmarks/results/grasp_collapse.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.provenance import git_commit  # noqa: E402
from benchmarks.reproduce_chu2023 import part_a_key, scheme_mask, train_masked  # noqa: E402
from defenses.pruning import apply_mask  # noqa: E402
from fedsim.data import load_dataset  # noqa: E402
from fedsim.models import build_model, init_params, make_apply_fn  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def leaf_name(path) -> str:
    return "/".join(str(getattr(k, "key", k)) for k in path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[0.1])
    ap.add_argument("--schemes", nargs="+", default=["grasp", "snip", "random"])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0, commit = time.perf_counter(), git_commit()
    seed = args.seed
    ds = load_dataset("fashion_mnist", image_size=16)
    # Part A's probe batch, initial model and masks (reproduce_chu2023.part_a and its
    # named key streams: no key is shared between the model, a mask and the engine).
    rng = np.random.default_rng(seed)
    probe = rng.choice(len(ds.y_train), 64, replace=False)
    xp, yp = jnp.asarray(ds.x_train[probe]), jnp.asarray(ds.y_train[probe])
    model = build_model("conv2", ds.num_classes)
    apply_fn = make_apply_fn(model)
    params = init_params(model, ds.input_shape, part_a_key(seed, "init", "conv2")[0])
    fl = SimpleNamespace(image_size=16, clients=20, local_batch=20, clients_per_round=10,
                         lr=0.1, upload="weights")
    rows = []
    for scheme in args.schemes:
        for p in args.rates:
            mask = scheme_mask(scheme, part_a_key(seed, "mask", "conv2", scheme, p)[0],
                               params, p, apply_fn, xp, yp, ds.input_shape, 20)
            pm = apply_mask(params, mask)
            kept = {leaf_name(k): float(jnp.mean(m))
                    for k, m in jax.tree_util.tree_leaves_with_path(mask) if m.ndim >= 2}
            conv0 = [(leaf_name(k), a, b, m) for (k, a), b, m in zip(
                jax.tree_util.tree_leaves_with_path(pm), jax.tree_util.tree_leaves(params),
                jax.tree_util.tree_leaves(mask)) if a.ndim == 4][0]
            removed = conv0[2][conv0[3] == 0]
            _, acc = train_masked(fl, ds, pm, mask, seed, args.rounds)
            rows.append({"scheme": scheme, "p": p, "kept_fraction": kept,
                         "first_conv": conv0[0],
                         "first_conv_mean_before": float(jnp.mean(conv0[2])),
                         "first_conv_mean_kept": float(jnp.mean(conv0[1])),
                         "first_conv_mean_removed": (float(jnp.mean(removed)) if removed.size
                                                     else None),
                         "logit_std_dense": float(jnp.std(apply_fn(params, xp))),
                         "logit_std_masked": float(jnp.std(apply_fn(pm, xp))),
                         "rounds": args.rounds, "test_accuracy": float(acc)})
            print(rows[-1], flush=True)
    result = {"commit": commit, "seed": seed, "seconds": time.perf_counter() - t0,
              "command": "benchmarks/diagnose_grasp_collapse.py " + " ".join(argv or sys.argv[1:]),
              "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "grasp_collapse.json").write_text(json.dumps(result, indent=1))
    lines = ["# GraSP on Conv-2: mask statistics and trainability", "",
             f"`{result['command']}`, commit {commit}, seed {seed}, {result['seconds']:.0f} s. "
             "Part A's initial Conv-2 and probe batch (64 training images); "
             f"accuracy after {args.rounds} FedAvg rounds with the mask fixed.", "",
             "| scheme | p | kept per weight leaf | first-conv mean (dense → masked, zeros "
             "included) | mean of the removed first-conv weights | logit std (dense → masked) | "
             "test accuracy |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        kept = ", ".join(f"{k.split('/')[0]} {v:.2f}" for k, v in r["kept_fraction"].items())
        lines.append(f"| {r['scheme']} | {r['p']} | {kept} | {r['first_conv_mean_before']:.4f} → "
                     f"{r['first_conv_mean_kept']:.4f} | "
                     + (f"{r['first_conv_mean_removed']:.4f}" if r["first_conv_mean_removed"]
                        is not None else "none removed")
                     + f" | {r['logit_std_dense']:.2f} → "
                     f"{r['logit_std_masked']:.2f} | {r['test_accuracy']:.4f} |")
    (RESULTS / "grasp_collapse.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
