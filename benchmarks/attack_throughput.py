"""Attack throughput: vmapped JAX Inverting Gradients vs a loop, vs a PyTorch loop.

Inverting Gradients (cosine + TV, signed Adam, box) against the untrained
paper-001 MLP (13,700 params), batch 1, 16×16 inputs (random targets: speed
does not depend on the data). Measures attack iterations per second
(victims × iterations / wall seconds, compile excluded, median of ``--repeats``)
for V ∈ {1, 8, 64} victims in one vmapped jitted scan; a one-by-one loop of the
same jitted single-victim attack (V = 8); and, if PyTorch is importable, the
same attack written the usual PyTorch way (one victim at a time,
``torch.autograd.grad(create_graph=True)``, ``torch.set_num_threads(1)``).

Writes benchmarks/results/attack_throughput.json (+ .md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attacks.gradient_inversion import InversionConfig, invert_victims  # noqa: E402
from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from fedsim.client import masked_mean_loss  # noqa: E402
from fedsim.models import build_model, init_params, make_apply_fn  # noqa: E402

SHAPE = (16, 16, 1)


def setup(victims: int, seed: int = 0):
    model = build_model("mlp")
    f = make_apply_fn(model)
    p = init_params(model, SHAPE, jax.random.key(0))
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.random((victims, 1, *SHAPE)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, (victims, 1)), jnp.int32)
    g = jax.vmap(lambda xi, yi: jax.grad(masked_mean_loss, argnums=1)(f, p, xi, yi, jnp.ones(1)))(x, y)
    params = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (victims, *a.shape)), p)
    return f, p, params, g, y, np.asarray(x)


def time_jax(victims: int, iterations: int, repeats: int, shared: bool = True) -> dict:
    f, p, params, targets, labels, _ = setup(victims)
    if shared:
        params = p
    cfg = InversionConfig(iterations=iterations, tv=1e-6)
    keys = jax.random.split(jax.random.key(1), victims)
    kw = dict(batch_size=1, input_shape=SHAPE, num_classes=10)
    kw["shared_params"] = shared
    invert_victims(f, cfg, params, targets, labels, keys, **kw)  # compile
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        invert_victims(f, cfg, params, targets, labels, keys, **kw)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"impl": "jax vmap (shared global params)" if shared else "jax vmap (per-victim params)", "victims": victims, "iterations": iterations, "seconds_median": med,
            "seconds_all": times, "iters_per_s": victims * iterations / med}


def time_jax_loop(victims: int, iterations: int, repeats: int) -> dict:
    f, _, params, targets, labels, _ = setup(victims)
    cfg = InversionConfig(iterations=iterations, tv=1e-6)
    keys = jax.random.split(jax.random.key(1), victims)
    kw = dict(batch_size=1, input_shape=SHAPE, num_classes=10)
    sl = lambda t, i: jax.tree_util.tree_map(lambda a: a[i:i + 1], t)
    invert_victims(f, cfg, sl(params, 0), sl(targets, 0), labels[:1], keys[:1], **kw)  # compile
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(victims):
            invert_victims(f, cfg, sl(params, i), sl(targets, i), labels[i:i + 1], keys[i:i + 1], **kw)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"impl": "jax one-by-one loop", "victims": victims, "iterations": iterations,
            "seconds_median": med, "seconds_all": times, "iters_per_s": victims * iterations / med}


def time_torch(victims: int, iterations: int, repeats: int) -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    _, p, _, targets, labels, _ = setup(victims)
    ws = [torch.tensor(np.asarray(p[f"Dense_{i}"]["kernel"]).T.copy()) for i in range(3)]

    def forward(x):
        h = x.reshape(x.shape[0], -1)
        h = torch.sigmoid(h @ ws[0].T)
        h = torch.sigmoid(h @ ws[1].T)
        return h @ ws[2].T

    for w in ws:
        w.requires_grad_(True)
    tgt = [[torch.tensor(np.asarray(targets[f"Dense_{i}"]["kernel"][v]).T.copy()) for i in range(3)]
           for v in range(victims)]
    lab = torch.tensor(np.asarray(labels), dtype=torch.long)

    def attack_one(v):
        gen = torch.Generator().manual_seed(v)
        x = torch.rand((1, *SHAPE), generator=gen, requires_grad=True)
        opt = torch.optim.Adam([x], lr=0.1)
        sched = torch.optim.lr_scheduler.MultiStepLR(
            opt, milestones=[int(3 * iterations / 8), int(5 * iterations / 8), int(7 * iterations / 8)], gamma=0.1)
        for _ in range(iterations):
            opt.zero_grad()
            loss_ce = torch.nn.functional.cross_entropy(forward(x), lab[v])
            g = torch.autograd.grad(loss_ce, ws, create_graph=True)
            dot = sum((a * b).sum() for a, b in zip(g, tgt[v]))
            ng = torch.sqrt(sum((a * a).sum() for a in g))
            nt = torch.sqrt(sum((b * b).sum() for b in tgt[v]))
            tv = (x[:, 1:] - x[:, :-1]).abs().mean() + (x[:, :, 1:] - x[:, :, :-1]).abs().mean()
            loss = 1 - dot / (ng * nt) + 1e-6 * tv
            loss.backward()
            x.grad.sign_()
            opt.step()
            sched.step()
            with torch.no_grad():
                x.clamp_(0, 1)
        return float(loss.detach())

    attack_one(0)  # warm-up (allocator, autograd graph caches), not timed
    times, final = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        final = [attack_one(v) for v in range(victims)]
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"impl": f"pytorch loop (torch {torch.__version__}, 1 thread)", "victims": victims,
            "iterations": iterations, "seconds_median": med, "seconds_all": times,
            "iters_per_s": victims * iterations / med, "final_losses": final}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 iterations, 2 repeats")
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    commit = git_commit()  # at start: the code this process loaded
    iters = args.iterations or (100 if args.quick else 300)
    reps = args.repeats or (2 if args.quick else 3)
    rows = []
    for shared in (True, False):
        for v in (1, 8, 64):
            rows.append(time_jax(v, iters, reps, shared))
            print(rows[-1]["impl"], v, f"{rows[-1]['iters_per_s']:.0f} it/s", flush=True)
    rows.append(time_jax_loop(8, iters, reps))
    print(rows[-1]["impl"], 8, f"{rows[-1]['iters_per_s']:.0f} it/s", flush=True)
    for v in (1, 8, 64):
        # The 64-victim loop is 64 sequential attacks (minutes): one timed run.
        r = time_torch(v, iters, reps if v < 64 else 1)
        if r is not None:
            rows.append(r)
            print(r["impl"], v, f"{r['iters_per_s']:.0f} it/s", flush=True)
    meta = {"mode": "quick" if args.quick else "full", "iterations": iters, "repeats": reps,
            "device": f"{jax.devices()[0].device_kind} {platform.machine()}, {os.cpu_count()} cores (shared)",
            "jax": jax.__version__, "attack": "inverting_gradients, MLP 13,700 params, batch 1, 16x16",
            "commit": commit}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attack_throughput.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = ["# Attack throughput (Inverting Gradients, paper-001 MLP, batch 1)\n",
             f"Mode {meta['mode']}: {iters} iterations, median of {reps}; device {meta['device']}; "
             "timings on a CPU shared with other jobs are noisy. Produced by `benchmarks/attack_throughput.py` "
             f"at commit {short_commit(commit)}.\n",
             "| implementation | victims | median seconds | attack iterations / s |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['impl']} | {r['victims']} | {r['seconds_median']:.2f} | {r['iters_per_s']:.0f} |")
    jax64 = [r for r in rows if r["victims"] == 64 and r["impl"].startswith("jax vmap")]
    torch64 = [r for r in rows if r["victims"] == 64 and r["impl"].startswith("pytorch")]
    if jax64 and torch64:
        best = max(jax64, key=lambda r: r["iters_per_s"])
        ratio = best["iters_per_s"] / torch64[0]["iters_per_s"]
        lines += ["", f"Acceptance (64 victims, same run): {best['impl']} / PyTorch loop = "
                  f"{ratio:.1f}× victim-iterations per second "
                  f"({'PASS' if ratio >= 5 else 'FAIL'}: ≥ 5×). Load average at the end: "
                  f"{os.getloadavg()[0]:.1f}."]
    (out / "attack_throughput.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
