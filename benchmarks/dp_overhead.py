"""DP-SGD step time relative to plain SGD (JAX/fedsim, and Opacus as reference).

For LeNet (DLG, 32×32×3) and paper 001's MLP (16×16×1) at batch 64 and 128:

* plain: one jitted step = mean-loss gradient + SGD update;
* dp: one jitted step = per-example gradients (vmap(grad)) + the
  ``dp_gaussian`` example-stage defense (flat clip C = 1, σ = 1) + SGD update.

Each step is timed ``--reps`` times after a warm-up (compile excluded,
``block_until_ready``); the table reports medians and the ratio dp / plain.
If a Python with torch + opacus is given (``--torch-python``, default
/tmp/torchenv/bin/python when present), the same two steps are timed in
PyTorch (plain SGD vs Opacus ``make_private`` with the same σ, C) in a
subprocess. Results: ``benchmarks/results/dp_overhead.json`` and ``.md``.
Timings on a shared CPU are noisy: compare ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.provenance import git_commit  # noqa: E402
from defenses.dp import dp_gaussian  # noqa: E402
from fedsim.client import cross_entropy  # noqa: E402
from fedsim.hooks import DefenseContext  # noqa: E402
from fedsim.models import build_model, init_params, make_apply_fn  # noqa: E402

SHAPES = {"lenet": (32, 32, 3), "mlp": (16, 16, 1)}


def make_steps(model_name, batch):
    model = build_model(model_name, 10)
    apply_fn = make_apply_fn(model)
    shape = SHAPES[model_name]
    params = init_params(model, shape, jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (batch,) + shape)
    y = jax.random.randint(jax.random.key(2), (batch,), 0, 10)
    tx = optax.sgd(0.1)
    opt = tx.init(params)
    defense = dp_gaussian(1.0, clip_norm=1.0)
    mask = jnp.ones((batch,))

    @jax.jit
    def plain(params, opt, key):
        del key
        g = jax.grad(lambda p: jnp.mean(cross_entropy(apply_fn(p, x), y)))(params)
        u, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, u), opt

    @jax.jit
    def dp(params, opt, key):
        loss_one = lambda p, xi, yi: cross_entropy(apply_fn(p, xi[None]), yi[None])[0]
        per_ex = jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))(params, x, y)
        g, _ = defense.apply(per_ex, (), key=key, context=DefenseContext(mask=mask))
        u, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, u), opt

    return params, opt, plain, dp


def time_step(step, params, opt, reps):
    key = jax.random.key(3)
    out = step(params, opt, key)
    jax.block_until_ready(out)  # compile + warm-up
    times = []
    for i in range(reps):
        k = jax.random.fold_in(key, i)
        t0 = time.perf_counter()
        jax.block_until_ready(step(params, opt, k))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


TORCH_SCRIPT = r"""
import json, statistics, sys, time, warnings
warnings.filterwarnings("ignore")
import torch, torch.nn as nn
from opacus import PrivacyEngine
torch.set_num_threads(2)
torch.manual_seed(0)

def lenet():
    layers, c = [], 3
    for s in (2, 2, 1, 1):
        layers += [nn.Conv2d(c, 12, 5, stride=s, padding=2), nn.Sigmoid()]; c = 12
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(12 * 8 * 8, 10))

def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(256, 50, bias=False), nn.Sigmoid(),
                         nn.Linear(50, 15, bias=False), nn.Sigmoid(), nn.Linear(15, 10, bias=False))

shapes = {"lenet": (3, 32, 32), "mlp": (1, 16, 16)}
reps = int(sys.argv[1]); out = []
for name, build in (("lenet", lenet), ("mlp", mlp)):
    for batch in (64, 128):
        x = torch.rand((batch,) + shapes[name]); y = torch.randint(0, 10, (batch,))
        res = {"model": name, "batch": batch}
        for mode in ("plain", "opacus"):
            model = build(); opt = torch.optim.SGD(model.parameters(), lr=0.1)
            if mode == "opacus":
                loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)
                model, opt, _ = PrivacyEngine().make_private(module=model, optimizer=opt,
                    data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False)
            lossf = nn.CrossEntropyLoss()
            def step():
                opt.zero_grad(); lossf(model(x), y).backward(); opt.step()
            for _ in range(3): step()
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter(); step(); ts.append(time.perf_counter() - t0)
            res[mode + "_ms"] = 1e3 * statistics.median(ts)
        res["ratio"] = res["opacus_ms"] / res["plain_ms"]
        out.append(res)
print(json.dumps({"torch": torch.__version__, "rows": out}))
"""


def opacus_reference(python, reps):
    if not python or not Path(python).exists():
        return {"skipped": f"no torch/opacus python at {python!r}"}
    try:
        proc = subprocess.run([python, "-c", TORCH_SCRIPT, str(reps)], capture_output=True,
                              text=True, timeout=1200)
    except subprocess.TimeoutExpired:
        return {"skipped": "opacus reference timed out"}
    if proc.returncode != 0:
        return {"skipped": f"opacus reference failed: {proc.stderr.strip()[-400:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    default_torch = "/tmp/torchenv/bin/python" if os.path.exists("/tmp/torchenv/bin/python") else ""
    ap.add_argument("--torch-python", default=default_torch)
    ap.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES),
                    help="which models to time (default: all)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error(f"--reps must be >= 1, got {args.reps}")
    load0 = os.getloadavg()[0]
    rows = []
    for name in args.models:
        for batch in (64, 128):
            params, opt, plain, dp = make_steps(name, batch)
            tp = time_step(plain, params, opt, args.reps)
            td = time_step(dp, params, opt, args.reps)
            rows.append({"model": name, "batch": batch, "plain_ms": 1e3 * tp, "dp_ms": 1e3 * td,
                         "ratio": td / tp})
            print(json.dumps(rows[-1]), flush=True)
    ref = opacus_reference(args.torch_python, args.reps)
    commit = git_commit()  # HEAD, "-dirty" where the code differed
    load1 = os.getloadavg()[0]
    result = {"device": f"{jax.default_backend()} ({platform.machine()}), jax {jax.__version__}, "
                        f"1-min load average {load0:.1f} → {load1:.1f}",
              "commit": commit, "load_average_1min": [load0, load1], "reps": args.reps,
              "rows": rows, "opacus": ref,
              "paper_000_table2": {"LeNet": "DP-SGD +57 % over SGD (Opacus 1.1.2, 4×A100, 25 epochs)"}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dp_overhead.json").write_text(json.dumps(result, indent=2))
    lines = ["# DP-SGD overhead (median step time, ms)", "",
             f"Produced by `benchmarks/dp_overhead.py` at commit {commit[:7]}; device: "
             f"{result['device']}; {args.reps} timed steps each. Shared 2-core CPU: ratios "
             "are the meaningful part.",
             "", "| model | batch | plain JAX | DP JAX | ratio | plain torch | Opacus | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    ref_rows = {(r["model"], r["batch"]): r for r in ref.get("rows", [])}
    for r in rows:
        o = ref_rows.get((r["model"], r["batch"]))
        tail = (f"{o['plain_ms']:.2f} | {o['opacus_ms']:.2f} | {o['ratio']:.2f}" if o
                else "– | – | –")
        lines.append(f"| {r['model']} | {r['batch']} | {r['plain_ms']:.2f} | {r['dp_ms']:.2f} | "
                     f"{r['ratio']:.2f} | {tail} |")
    if "skipped" in ref:
        lines += ["", f"Opacus reference: {ref['skipped']}"]
    else:
        lines += ["", f"Opacus reference: torch {ref['torch']} (CPU, 2 threads), "
                      "poisson_sampling=False, σ = 1, C = 1."]
    lines += ["", "Paper 000 Table 2 (LeNet, Opacus, 4×A100): DP-SGD = 1.57× SGD time."]
    (out / "dp_overhead.md").write_text("\n".join(lines) + "\n")
    return result


if __name__ == "__main__":
    main()
