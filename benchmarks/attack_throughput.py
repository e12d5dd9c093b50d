"""Attack throughput: vmapped JAX Inverting Gradients vs a loop, vs a PyTorch loop.

Inverting Gradients (cosine + TV, signed Adam, box) at batch 1 against an
untrained model (random targets: speed does not depend on the data):

- ``--model mlp`` (default): the paper-001 MLP (13,700 params), 16×16×1 inputs;
- ``--model lenet``: the DLG LeNet (4 sigmoid 5×5 convs of 12 channels + one FC
  layer), ``--image-size`` × ``--image-size`` × ``--channels`` inputs (default
  32×32×3, DLG's CIFAR setting).

Measures attack iterations per second (victims × iterations / wall seconds,
compile excluded, median of ``--repeats``) for each of ``--victims`` (default
1, 8, 64) in one vmapped jitted scan; a one-by-one loop of the same jitted
single-victim attack (V = 8); and, if PyTorch is importable, the same attack
written the usual PyTorch way (one victim at a time,
``torch.autograd.grad(create_graph=True)``) on ``--torch-device`` (cpu with
``--torch-threads`` threads, default 1, or cuda, synchronised by reading each
victim's final loss). The PyTorch model carries the JAX model's weights, and its
targets are its own gradients of the same victim data.

Writes benchmarks/results/<--name>.json (+ .md), default ``attack_throughput``.
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
from fedsim.models import build_model, count_params, init_params, make_apply_fn  # noqa: E402

SHAPE = (16, 16, 1)
MODELS = ("mlp", "lenet")
# The loop and the PyTorch loop run victims one after the other: at this many
# victims and above they are timed once (minutes), not --repeats times.
ONE_REPEAT_FROM = 64


def setup(victims: int, seed: int = 0, model_name: str = "mlp", shape=SHAPE):
    model = build_model(model_name)
    f = make_apply_fn(model)
    p = init_params(model, shape, jax.random.key(0))
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.random((victims, 1, *shape)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, (victims, 1)), jnp.int32)
    g = jax.vmap(lambda xi, yi: jax.grad(masked_mean_loss, argnums=1)(f, p, xi, yi, jnp.ones(1)))(x, y)
    params = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (victims, *a.shape)), p)
    return f, p, params, g, y, np.asarray(x)


def time_jax(victims: int, iterations: int, repeats: int, shared: bool = True,
             model_name: str = "mlp", shape=SHAPE) -> dict:
    f, p, params, targets, labels, _ = setup(victims, model_name=model_name, shape=shape)
    if shared:
        params = p
    cfg = InversionConfig(iterations=iterations, tv=1e-6)
    keys = jax.random.split(jax.random.key(1), victims)
    kw = dict(batch_size=1, input_shape=shape, num_classes=10)
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


def time_jax_loop(victims: int, iterations: int, repeats: int, model_name: str = "mlp",
                  shape=SHAPE) -> dict:
    f, _, params, targets, labels, _ = setup(victims, model_name=model_name, shape=shape)
    cfg = InversionConfig(iterations=iterations, tv=1e-6)
    keys = jax.random.split(jax.random.key(1), victims)
    kw = dict(batch_size=1, input_shape=shape, num_classes=10)
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


def torch_model(p, model_name: str, torch, device):
    """(weights, forward) of ``model_name`` in PyTorch, carrying the JAX params ``p``.

    Inputs stay NHWC as in JAX; the LeNet's convolutions run NCHW and its
    features are put back in NHWC order before the FC layer, so that the FC
    kernel's rows line up with flax's flatten.
    """
    t = lambda a: torch.tensor(np.asarray(a), device=device)
    if model_name == "mlp":
        ws = [t(np.asarray(p[f"Dense_{i}"]["kernel"]).T.copy()) for i in range(3)]

        def forward(x):
            h = x.reshape(x.shape[0], -1)
            h = torch.sigmoid(h @ ws[0].T)
            h = torch.sigmoid(h @ ws[1].T)
            return h @ ws[2].T
        return ws, forward
    convs = [(t(np.asarray(p[f"Conv_{i}"]["kernel"]).transpose(3, 2, 0, 1).copy()),
              t(p[f"Conv_{i}"]["bias"])) for i in range(4)]
    fc = (t(np.asarray(p["Dense_0"]["kernel"]).T.copy()), t(p["Dense_0"]["bias"]))
    ws = [w for pair in convs for w in pair] + list(fc)

    def forward(x):
        h = x.permute(0, 3, 1, 2)
        for (w, b), stride in zip(convs, (2, 2, 1, 1)):
            h = torch.sigmoid(torch.nn.functional.conv2d(h, w, b, stride=stride, padding=2))
        h = h.permute(0, 2, 3, 1).reshape(h.shape[0], -1)
        return h @ fc[0].T + fc[1]
    return ws, forward


def time_torch(victims: int, iterations: int, repeats: int, model_name: str = "mlp",
               shape=SHAPE, device: str = "cpu", threads: int = 1) -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    _, p, _, _, labels, x_true = setup(victims, model_name=model_name, shape=shape)
    ws, forward = torch_model(p, model_name, torch, device)
    for w in ws:
        w.requires_grad_(True)
    lab = torch.tensor(np.asarray(labels), dtype=torch.long, device=device)
    tgt = []
    for v in range(victims):  # each victim's gradient, as the attacker observes it
        loss = torch.nn.functional.cross_entropy(
            forward(torch.tensor(x_true[v], device=device)), lab[v])
        tgt.append([g.detach() for g in torch.autograd.grad(loss, ws)])

    def attack_one(v):
        gen = torch.Generator(device=device).manual_seed(v)
        x = torch.rand((1, *shape), generator=gen, device=device, requires_grad=True)
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
        return float(loss.detach())  # on cuda this waits for the victim's last step

    attack_one(0)  # warm-up (allocator, autograd graph caches), not timed
    times, final = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        final = [attack_one(v) for v in range(victims)]
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    where = f"{threads} thread{'s' if threads > 1 else ''}" if device == "cpu" else device
    return {"impl": f"pytorch loop (torch {torch.__version__}, {where})", "victims": victims,
            "iterations": iterations, "seconds_median": med, "seconds_all": times,
            "iters_per_s": victims * iterations / med, "final_losses": final}


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 iterations, 2 repeats")
    ap.add_argument("--iterations", type=positive, default=None)
    ap.add_argument("--repeats", type=positive, default=None)
    ap.add_argument("--model", choices=MODELS, default="mlp")
    ap.add_argument("--image-size", type=positive, default=None,
                    help="lenet only: input height and width (default 32)")
    ap.add_argument("--channels", type=positive, default=None,
                    help="lenet only: input channels (default 3)")
    ap.add_argument("--victims", type=positive, nargs="+", default=[1, 8, 64],
                    help="victim counts of the vmapped and PyTorch rows")
    ap.add_argument("--torch-device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--torch-max-victims", type=positive, default=None,
                    help="skip the PyTorch rows above this many victims (its loop's rate "
                         "per victim does not depend on the count)")
    ap.add_argument("--torch-threads", type=positive, default=1,
                    help="PyTorch's CPU threads (torch.set_num_threads)")
    ap.add_argument("--name", default="attack_throughput", help="output file name (no suffix)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    if args.model == "mlp" and (args.image_size or args.channels):
        ap.error("--image-size and --channels apply to --model lenet (the MLP takes 16×16×1)")
    if args.model == "lenet" and (args.image_size or 32) < 4:
        # Two stride-2 convolutions with padding 2 need at least 4 pixels to leave one.
        ap.error(f"--image-size must be at least 4 for the LeNet, got {args.image_size}")
    if args.torch_device == "cuda":
        try:
            import torch
        except ImportError:
            torch = None
        if torch is None or not torch.cuda.is_available():
            ap.error("--torch-device cuda: PyTorch with CUDA is not available here")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    commit = git_commit()  # at start: the code this process loaded
    iters = args.iterations or (100 if args.quick else 300)
    reps = args.repeats or (2 if args.quick else 3)
    shape = (SHAPE if args.model == "mlp" else
             (args.image_size or 32, args.image_size or 32, args.channels or 3))
    victims = sorted(set(args.victims))
    kw = dict(model_name=args.model, shape=shape)
    n_params = count_params(init_params(build_model(args.model), shape, jax.random.key(0)))
    what = ("MLP" if args.model == "mlp" else "DLG LeNet") + f" {n_params:,} params"
    meta = {"mode": "quick" if args.quick else "full", "iterations": iters, "repeats": reps,
            "device": f"{jax.devices()[0].device_kind} {platform.machine()}, {os.cpu_count()} cores (shared)",
            "jax": jax.__version__, "model": args.model, "input_shape": list(shape),
            "torch_device": args.torch_device, "torch_threads": args.torch_threads,
            "attack": f"Inverting Gradients, {what}, batch 1, {'x'.join(map(str, shape))}",
            "commit": commit}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []

    def add(row: dict | None) -> None:
        # Written after every row, so a run cut short keeps what it measured.
        if row is None:
            return
        rows.append(row)
        print(row["impl"], row["victims"], f"{row['iters_per_s']:.0f} it/s", flush=True)
        (out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        (out / f"{args.name}.md").write_text(markdown(meta, rows, victims))

    for shared in (True, False):
        for v in victims:
            add(time_jax(v, iters, reps, shared, **kw))
    add(time_jax_loop(8, iters, reps, **kw))
    for v in (v for v in victims if v <= (args.torch_max_victims or v)):
        add(time_torch(v, iters, reps if v < ONE_REPEAT_FROM else 1, device=args.torch_device,
                       threads=args.torch_threads, **kw))
    return 0


def markdown(meta: dict, rows: list[dict], victims: list[int]) -> str:
    """The results table and the same-run acceptance ratio at the largest victim
    count that has both a vmapped and a PyTorch row."""
    lines = [f"# Attack throughput ({meta['attack']})\n",
             f"Mode {meta['mode']}: {meta['iterations']} iterations, median of {meta['repeats']} "
             f"(one run from {ONE_REPEAT_FROM} victims in the loops); device {meta['device']}; "
             "timings on a shared machine are noisy. Produced by "
             f"`benchmarks/attack_throughput.py` at commit {short_commit(meta['commit'])}.\n",
             "| implementation | victims | median seconds | attack iterations / s |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['impl']} | {r['victims']} | {r['seconds_median']:.2f} | {r['iters_per_s']:.0f} |")
    has = lambda v, kind: any(r["victims"] == v and r["impl"].startswith(kind) for r in rows)
    top = max((v for v in victims if has(v, "jax vmap") and has(v, "pytorch")), default=None)
    best_at = lambda v: max((r for r in rows if r["victims"] == v and r["impl"].startswith("jax vmap")),
                            key=lambda r: r["iters_per_s"])
    if top is not None:
        best = best_at(top)
        torch_top = next(r for r in rows if r["victims"] == top and r["impl"].startswith("pytorch"))
        ratio = best["iters_per_s"] / torch_top["iters_per_s"]
        lines += ["", f"Acceptance ({top} victims, same run): {best['impl']} / PyTorch loop = "
                  f"{ratio:.1f}× victim-iterations per second "
                  f"({'PASS' if ratio >= 5 else 'FAIL'}: ≥ 5×). Load average at the end: "
                  f"{os.getloadavg()[0]:.1f}."]
        most = max(v for v in victims if has(v, "jax vmap"))
        if most > top:  # the loop's rate per victim does not grow with the count
            best = best_at(most)
            lines.append(f"At {most} victims, {best['impl']} reaches "
                         f"{best['iters_per_s'] / torch_top['iters_per_s']:.1f}× the PyTorch "
                         f"loop's rate at {top}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
