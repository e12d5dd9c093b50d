"""Seed spread of the Table II ordering (IG MSE: VMF κ=75 > Gauss σ=1.23 > none).

For each seed: a different batch of 128 Fashion-MNIST 16×16 training images,
model init, defense key and attack key (all derived from the seed); the three
mechanisms are attacked on the SAME victims/init/keys within a seed, as in
``reproduce_biswas2024.py``. Writes ``benchmarks/results/biswas2024_ig_seeds.json``.

Usage: python -m benchmarks.biswas2024_ig_seeds [--seeds 0,1,2] [--iterations 10000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.provenance import git_commit  # noqa: E402
from benchmarks.reproduce_biswas2024 import defended_observation, run_ig  # noqa: E402
from fedsim.data import load_dataset  # noqa: E402
from fedsim.models import build_model, init_params, make_apply_fn  # noqa: E402

MECHS = {"none": [], "gauss 1.23": [{"name": "dp_gaussian", "noise_multiplier": 1.23,
                                     "clip_norm": 1.0}],
         "vmf 75": [{"name": "dp_vmf", "kappa": 75.0, "clip_norm": 1.0}]}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int, default=10000)
    args = ap.parse_args(argv)
    t0, commit = time.perf_counter(), git_commit()  # at start: the code this process loaded
    ds = load_dataset("fashion_mnist", image_size=16)
    model = build_model("mlp", ds.num_classes)
    apply_fn = make_apply_fn(model)
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        # Seed 0 uses exactly the victims/keys of reproduce_biswas2024.py.
        victims = np.random.default_rng(seed).choice(len(ds.y_train), 128, replace=False)
        x, y = jnp.asarray(ds.x_train[victims]), jnp.asarray(ds.y_train[victims])
        params0 = init_params(model, ds.input_shape, jax.random.fold_in(jax.random.key(seed), 0))
        row = {"seed": seed}
        for name, specs in MECHS.items():
            obs = defended_observation(apply_fn, params0, x, y, specs,
                                       jax.random.fold_in(jax.random.key(seed), 7),
                                       ds.input_shape, ds.num_classes)
            row[name] = dict(zip(("mse", "ssim"), run_ig(
                obs, x, args.iterations, jax.random.fold_in(jax.random.key(seed), 11))))
        row["order_vmf>gauss>none"] = (row["vmf 75"]["mse"] > row["gauss 1.23"]["mse"]
                                       > row["none"]["mse"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = ROOT / "benchmarks" / "results" / "biswas2024_ig_seeds.json"
    command = " ".join(["python -m benchmarks.biswas2024_ig_seeds",
                        *(sys.argv[1:] if argv is None else argv)])
    out.write_text(json.dumps({"command": command, "commit": commit,
                               "seconds": time.perf_counter() - t0,
                               "iterations": args.iterations, "batch": 128,
                               "device": jax.default_backend(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
