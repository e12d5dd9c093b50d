"""Engine round time vs a PyTorch sequential loop (issue 9 §7, issue 2).

One FedAvg round of LeNet-5 (``lenet5``, 32×32×1 inputs, 61,706 params),
64 examples per client, 2 local SGD steps of batch 32, for cohorts of
10/100/500/1,000 clients, for each implementation:

* ``fedsim-auto`` / ``fedsim-loop`` / ``fedsim-map`` / ``fedsim-vmap`` /
  ``fedsim-chunked``: the engine (``Simulation.run_round``) with that
  ``client_parallelism``; ``fedsim-auto`` runs its calibration first (fresh
  cache, time recorded separately as ``calibration_seconds``, not in the
  round time). A ``:rule`` suffix (``fedsim-vmap:rule``, opt-in) runs it with
  ``fedsim.models.VMAPPED_IM2COL_MAX_BATCH = 0``: the convolutions of vmapped
  clients as the batch rule alone traces them, as before
  ``models.vmapped_instances`` existed.
* ``torch-loop``: the same model and local training as a plain PyTorch loop
  over clients (copy global weights, 2 SGD steps, weighted sum of deltas),
  with ``torch.set_num_threads(1)`` and again with 2 threads (``threads``).

Every (impl, cohort) is measured in a fresh subprocess so ``peak_rss_mb`` is
that implementation's own peak; the first round (compilation / warm-up) is
excluded and ``seconds_per_round`` is the median of ``--repeats`` rounds.
Impls are interleaved per cohort size so machine-load drift hits all of them
alike; the load average is recorded per row. Data are synthetic images (the
cost does not depend on pixel values; Fashion-MNIST has only 60,000 training
images, fewer than 1,000 × 64).

Usage::

    python benchmarks/engine_throughput.py            # full: 10/100/500/1000
    python benchmarks/engine_throughput.py --quick    # 10/100/500, 2 repeats

On a GPU (a CUDA jax and torch installed)::

    python benchmarks/engine_throughput.py --torch-device cuda --torch-threads 1 \
        --clients 10 100 1000 5000 --impl-max-clients fedsim-loop=1000 \
        fedsim-map=1000 torch-loop=1000 --out benchmarks/results/engine_throughput_gpu

``device`` in the JSON records the accelerator; ``fedsim-auto`` calibrates
there as everywhere. On a GPU each row also records the accelerator's peak
memory (JAX's ``peak_bytes_in_use``, torch's ``max_memory_allocated``).
Writes ``benchmarks/results/engine_throughput.{json,md}`` unless ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's fedsim, not an installed one
from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from benchmarks.worker_rows import run_worker, worker_env  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
EXAMPLES, BATCH, LR, IMAGE = 64, 32, 0.05, 32
FEDSIM_IMPLS = ("fedsim-auto", "fedsim-loop", "fedsim-map", "fedsim-vmap", "fedsim-chunked")
RULE_SUFFIX = ":rule"  # fedsim-X:rule: fedsim-X with the vmapped-im2col hint off
MIN_CLIENT_TRAININGS = 200


def peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# --- workers (run in a fresh subprocess) ------------------------------------

def jax_device_peak_mb() -> float | None:
    """Peak accelerator memory of this process (MiB); None on the CPU."""
    import jax
    dev = jax.devices()[0]
    if dev.platform == "cpu":
        return None
    stats = dev.memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else peak / 2**20


def device_round_growth_mb(sim, state, round_index: int) -> float | None:
    """The accelerator memory one more (untimed) round takes above what is
    resident (MiB), compilation's peak kept out by a ballast
    (:func:`benchmarks.device_memory.device_growth`); None where it could not
    be measured. The round is run after the timed ones, so it changes no
    timing."""
    import jax

    from benchmarks.device_memory import device_growth

    def one_round():
        new_state, result = sim.run_round(state, round_index)
        jax.block_until_ready(new_state.params)
        return result
    record = {}
    grown = device_growth(one_round, jax.devices()[0], record=record)[2]
    print(f"device_round_growth_mb: ballast {record.get('ballast_bytes', 0) / 2**20:.0f} MiB, "
          f"growth {'–' if grown is None else f'{grown / 2**20:.0f}'} MiB", flush=True)
    return None if grown is None else grown / 2**20


def workload(clients: int, strategy: str, precision: str | None = None):
    """The benchmark's (config, dataset): ``clients`` LeNet-5 clients, all in
    every round, each with EXAMPLES synthetic examples and one epoch of batch
    BATCH."""
    from fedsim.config import load_config
    from fedsim.data import synthetic_dataset

    ds = synthetic_dataset(seed=0, image_size=IMAGE, num_train=EXAMPLES * clients, num_test=100)
    cfg = load_config(None, [
        "data.dataset=synthetic", f"data.num_clients={clients}", "data.partition=iid",
        f"data.examples_per_client={EXAMPLES}", "model.name=lenet5",
        f"training.clients_per_round={clients}", "training.local_epochs=1",
        f"training.batch_size={BATCH}", f"training.lr={LR}",
        f"training.client_parallelism={strategy}", "output.progress=false"]
        + ([f"training.matmul_precision={precision}"] if precision else []))
    return cfg, ds


def fedsim_worker(impl: str, clients: int, repeats: int, precision: str | None = None) -> dict:
    import jax

    from fedsim import models
    from fedsim.simulation import Simulation

    name, rule_only = impl.removesuffix(RULE_SUFFIX), impl.endswith(RULE_SUFFIX)
    if rule_only:  # read when the cohort step is traced, i.e. in this process's rounds
        models.VMAPPED_IM2COL_MAX_BATCH = 0
    strategy = name.split("-", 1)[1]
    cfg, ds = workload(clients, strategy, precision)
    t0 = time.perf_counter()
    sim = Simulation(cfg, dataset=ds, donate=True)
    calibration = time.perf_counter() - t0
    state = sim.init_state()
    t0 = time.perf_counter()
    state, _ = sim.run_round(state, 0)  # compile + warm-up
    first = time.perf_counter() - t0
    times = []
    for r in range(1, repeats + 1):
        state, res = sim.run_round(state, r)
        times.append(res.seconds)
    n_params = int(sum(x.size for x in jax.tree_util.tree_leaves(state.params)))
    peak_mb = jax_device_peak_mb()  # before the measured round's ballast
    return {"seconds_per_round": statistics.median(times), "round_seconds": times,
            "first_round_seconds": first, "strategy": sim.strategy,
            "device_peak_mb": peak_mb,
            "device_round_growth_mb": (None if peak_mb is None else
                                       device_round_growth_mb(sim, state, repeats + 1)),
            # XLA's plan for the cohort step, where a memory check made one
            # (fedsim.memory): to set beside the measured peaks.
            "memory_plan": getattr(sim, "memory_plan", None),
            "strategy_reason": sim.strategy_reason,
            "matmul_precision": cfg.training.matmul_precision,
            "calibration_seconds": calibration if strategy == "auto" else None,
            "backend": jax.default_backend(), "n_params": n_params}


def torch_worker(clients: int, repeats: int, threads: int, device: str = "cpu") -> dict:
    import numpy as np
    import torch
    import torch.nn as tnn
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dev = torch.device(device)
    # On a GPU, time what the GPU did: wait for its queued kernels.
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    class LeNet5(tnn.Module):  # same layers as fedsim.models.LeNet5 at 32×32
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = tnn.Conv2d(1, 6, 5), tnn.Conv2d(6, 16, 5)
            self.f1, self.f2, self.f3 = tnn.Linear(400, 120), tnn.Linear(120, 84), tnn.Linear(84, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.c1(x)), 2)
            x = F.max_pool2d(F.relu(self.c2(x)), 2).flatten(1)
            return self.f3(F.relu(self.f2(F.relu(self.f1(x)))))

    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.uniform(0, 1, (clients * EXAMPLES, 1, IMAGE, IMAGE)).astype(np.float32)).to(dev)
    y = torch.from_numpy(rng.integers(0, 10, clients * EXAMPLES)).to(dev)
    global_model, local = LeNet5().to(dev), LeNet5().to(dev)
    gen = torch.Generator().manual_seed(0)  # batch order drawn on the host, as fedsim's is

    def one_round():
        t0 = time.perf_counter()
        g = [p.detach().clone() for p in global_model.parameters()]
        wsum = [torch.zeros_like(p) for p in g]
        for c in range(clients):
            with torch.no_grad():
                for p, q in zip(local.parameters(), g):
                    p.copy_(q)
            opt = torch.optim.SGD(local.parameters(), lr=LR)
            xc, yc = x[c * EXAMPLES:(c + 1) * EXAMPLES], y[c * EXAMPLES:(c + 1) * EXAMPLES]
            order = torch.randperm(EXAMPLES, generator=gen).to(dev)
            for s in range(EXAMPLES // BATCH):
                b = order[s * BATCH:(s + 1) * BATCH]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(local(xc[b]), yc[b]).backward()
                opt.step()
            with torch.no_grad():
                for w, p, q in zip(wsum, local.parameters(), g):
                    w.add_(p - q, alpha=float(EXAMPLES))
        with torch.no_grad():
            for p, w in zip(global_model.parameters(), wsum):
                p.add_(w / (EXAMPLES * clients))
        sync()
        return time.perf_counter() - t0

    first = one_round()
    times = [one_round() for _ in range(repeats)]
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else None
    return {"seconds_per_round": statistics.median(times), "round_seconds": times,
            "first_round_seconds": first, "threads": threads, "torch": torch.__version__,
            "torch_device": device, "device_peak_mb": peak}


# --- driver -----------------------------------------------------------------

def run_one(impl: str, clients: int, repeats: int, threads: int, cache_dir: str,
            timeout: float, torch_device: str = "cpu", precision: str | None = None) -> dict:
    # XLA_PYTHON_CLIENT_PREALLOCATE=false: on a GPU, JAX takes what it uses
    # rather than 75 % of the card, so its peak memory is its own.
    env = worker_env(FEDSIM_CACHE_DIR=cache_dir, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", ""),
                     XLA_PYTHON_CLIENT_PREALLOCATE="false")
    if not env["JAX_PLATFORMS"]:
        env.pop("JAX_PLATFORMS")
    cmd = [sys.executable, __file__, "--worker", impl, "--clients", str(clients),
           "--repeats", str(repeats), "--threads", str(threads),
           "--torch-device", torch_device] + (["--precision", precision] if precision else [])
    load = os.getloadavg()[0]
    row = {"impl": impl, "clients": clients, "loadavg_1min_before": load}
    run_worker(cmd, row, timeout, env)
    row.setdefault("seconds_per_round", None)
    row.setdefault("peak_rss_mb", None)
    print(json.dumps({k: row[k] for k in ("impl", "clients", "seconds_per_round", "peak_rss_mb")}
                     | ({"threads": row["threads"]} if "threads" in row else {})
                     | ({"error": row["error"]} if "error" in row else {})), flush=True)
    return row


def device_description() -> str:
    import jax
    d = jax.devices()[0]
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{jax.default_backend()}: {getattr(d, 'device_kind', d)}; {cpu}; {os.cpu_count()} cores"


def markdown(result: dict) -> str:
    rows = result["rows"]
    cohorts = sorted({r["clients"] for r in rows})
    impls = list(dict.fromkeys(label(r) for r in rows))
    on_device = any(r.get("device_peak_mb") is not None for r in rows)
    cell = {(label(r), r["clients"]): r for r in rows}
    fmt = lambda v: "–" if v is None else f"{v:.3f}"
    precisions = sorted({r["matmul_precision"] for r in rows if r.get("matmul_precision")})
    out = [f"# Engine round time vs PyTorch sequential loop ({result['mode']} mode)", "",
           f"Device: {result['device']}. jax {result['jax']}, torch {result.get('torch', '?')}.",
           f"LeNet-5 (61,706 params), {EXAMPLES} examples/client, 2 local SGD steps of batch "
           f"{BATCH}; median of the timed rounds ({result['repeats']} per process, more for small "
           f"cohorts: at least {MIN_CLIENT_TRAININGS} client trainings) after a warm-up round; "
           f"each row a fresh process per pass, {result['passes']} pass(es) pooled. Both sides run the same LeNet-5: PyTorch with its standard layers "
           "(`nn.Conv2d`, `F.max_pool2d`), fedsim with its model registry's `lenet5` "
           + ("(phase-packed conv→ReLU→pool, see docs/scale.md). " if result["device"].startswith("cpu")
              else "(XLA's convolution and pooling: the phase packing is CPU-only). ")
           + "Load average (1 min) during the run: "
           f"{min(r['loadavg_1min_before'] for r in rows):.1f}–"
           f"{max(r['loadavg_1min_before'] for r in rows):.1f}"
           + (" (shared 2-core machine: noisy)." if result["device"].startswith("cpu") else
              " (host CPU; the rounds run on the accelerator)."),
           *([f"fedsim's float32 matrix products and convolutions ran at XLA precision "
              f"{', '.join(f'`{p}`' for p in precisions)} (`training.matmul_precision`)."]
             if precisions else []),
           f"Produced by `python benchmarks/engine_throughput.py {' '.join(result['argv'])}` on {result['date']} "
           f"at commit {short_commit(result['commit'])}.",
           *( [f"Not run (capped by `--slow-impls-max-clients` / `--impl-max-clients`, to bound the run's time): {', '.join(result['skipped'])}."] if result["skipped"] else []),
           "", "## Seconds per round (peak RSS MiB" + ("; peak accelerator MiB)" if on_device else ")"), "",
           "| impl | " + " | ".join(f"N={c}" for c in cohorts) + " |",
           "|---" * (len(cohorts) + 1) + "|"]
    for i in impls:
        cells = []
        for c in cohorts:
            r = cell.get((i, c))
            if r is None:
                cells.append("")
            elif r.get("error"):
                cells.append("error")
            else:
                mem = f"{r['peak_rss_mb']:.0f}"
                if r.get("device_peak_mb") is not None:
                    mem += f"; {r['device_peak_mb']:.0f}"
                cells.append(f"{fmt(r['seconds_per_round'])} ({mem})")
        out.append(f"| {i} | " + " | ".join(cells) + " |")
    out += ["", "## Acceptance checks (from the rows above)", ""]
    for chk in result["checks"]:
        out.append(f"- {chk}")
    measured = [r for r in rows if r.get("device_peak_mb") is not None and not r.get("error")
                and r["impl"] != "torch-loop"]
    if measured:
        out += ["", "## Accelerator memory of one round against the plan", "",
                "peak: the process's allocator peak after the timed rounds (compilation "
                "included); one round: what one more round took above the resident bytes, "
                "a ballast having lifted them to that peak first (`benchmarks.device_memory`); "
                "plan: XLA's plan of the cohort step (`fedsim.memory`, temporaries + outputs), "
                "where a memory check made one.", "",
                "| impl | N | strategy | peak MiB | one round MiB | plan MiB | one round ÷ plan |",
                "|---|---|---|---|---|---|---|"]
        for r in measured:
            grown = r.get("device_round_growth_mb")
            planned = (r.get("memory_plan") or {}).get("planned_bytes")
            plan_mb = None if planned is None else planned / 2**20
            ratio = (f"{grown / plan_mb:.2f}" if grown is not None and plan_mb else "–")
            out.append(f"| {r['impl']} | {r['clients']} | {r.get('strategy', '–')} | "
                       f"{r['device_peak_mb']:.0f} | {'–' if grown is None else f'{grown:.0f}'} | "
                       f"{'–' if plan_mb is None else f'{plan_mb:.0f}'} | {ratio} |")
    autos = [r for r in rows if r["impl"] == "fedsim-auto" and r.get("strategy_reason")]
    if autos:
        out += ["", "## What `auto` chose", ""]
        out += [f"- N={r['clients']}: {r['strategy_reason']} (calibration {r['calibration_seconds']:.1f} s)"
                for r in autos]
    return "\n".join(out) + "\n"


def label(row: dict) -> str:
    """A row's name in the tables: torch rows say their threads, or their device."""
    if row["impl"] != "torch-loop":
        return row["impl"]
    device = row.get("torch_device", "cpu")
    return f"torch-loop ({row['threads']} thr)" if device == "cpu" else f"torch-loop ({device})"


def checks(rows: list[dict]) -> list[str]:
    ok = lambda r: r.get("seconds_per_round") is not None
    by = {(label(r), r["clients"]): r for r in rows if ok(r)}
    torch_labels = list(dict.fromkeys(label(r) for r in rows if r["impl"] == "torch-loop"))
    lines = []
    for c in sorted({r["clients"] for r in rows}):
        auto = by.get(("fedsim-auto", c))
        fixed = [by[(i, c)] for i in FEDSIM_IMPLS[1:] if (i, c) in by]
        if auto and fixed:
            best = min(fixed, key=lambda r: r["seconds_per_round"])
            ratio = auto["seconds_per_round"] / best["seconds_per_round"]
            lines.append(f"N={c}: auto/best fixed ({best['impl']}) = {ratio:.2f} "
                         f"({'PASS' if ratio <= 1.10 else 'FAIL'}: ≤ 1.10)")
        for impl in FEDSIM_IMPLS:
            old, new = by.get((impl + RULE_SUFFIX, c)), by.get((impl, c))
            if old and new:
                lines.append(f"N={c}: {impl}{RULE_SUFFIX}/{impl} = "
                             f"{old['seconds_per_round'] / new['seconds_per_round']:.2f}× "
                             "(information: the vmapped-im2col hint's effect)")
        for name in torch_labels:
            t = by.get((name, c))
            if auto and t:
                sp = t["seconds_per_round"] / auto["seconds_per_round"]
                need = c in (100, 500)
                lines.append(f"N={c}: {name}/fedsim-auto = {sp:.2f}×"
                             + (f" ({'PASS' if sp >= 1.5 else 'FAIL'}: ≥ 1.5×)" if need else ""))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="cohorts 10/100/500, 2 repeats")
    ap.add_argument("--clients", type=int, nargs="*", default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--impls", nargs="*", default=None)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--passes", type=int, default=1,
                    help="run the whole plan this many times, pooling each row's rounds")
    ap.add_argument("--slow-impls-max-clients", type=int, default=None,
                    help="skip fedsim-map/fedsim-vmap above this cohort size (time budget)")
    ap.add_argument("--impl-max-clients", nargs="*", default=[], metavar="IMPL=N",
                    help="skip IMPL above N clients, e.g. torch-loop=1000 (time budget)")
    ap.add_argument("--torch-threads", type=int, nargs="+", default=[1, 2],
                    help="torch-loop rows, one per thread count")
    ap.add_argument("--torch-device", default="cpu", choices=("cpu", "cuda"),
                    help="where torch-loop runs")
    ap.add_argument("--precision", default=None, choices=("highest", "high", "default"),
                    help="the fedsim rows' training.matmul_precision (default: the config's)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(RESULTS / "engine_throughput"))
    args = ap.parse_args()
    if args.worker:
        clients = args.clients[0]
        if args.worker == "torch-loop":
            row = torch_worker(clients, args.repeats, args.threads, args.torch_device)
        else:
            row = fedsim_worker(args.worker, clients, args.repeats, args.precision)
        row["peak_rss_mb"] = peak_rss_mb()
        print("ROW " + json.dumps(row), flush=True)
        return
    commit = git_commit()  # at start: the code this process loaded
    cohorts = args.clients or ([10, 100, 500] if args.quick else [10, 100, 500, 1000])
    repeats = args.repeats or (2 if args.quick else 3)
    impls = args.impls or list(FEDSIM_IMPLS) + ["torch-loop"]
    known = set(FEDSIM_IMPLS) | {i + RULE_SUFFIX for i in FEDSIM_IMPLS} | {"torch-loop"}
    unknown = [i for i in impls if i not in known]
    if unknown:
        ap.error(f"--impls: unknown {unknown}; choose from {', '.join(FEDSIM_IMPLS)}, "
                 f"torch-loop, or a fedsim impl with the suffix {RULE_SUFFIX!r}")
    if any(t < 1 for t in args.torch_threads):
        ap.error(f"--torch-threads must be >= 1, got {args.torch_threads}")
    if any(c < 1 for c in cohorts):
        ap.error(f"--clients must be >= 1, got {cohorts}")
    caps = parse_caps(args.impl_max_clients, impls)
    if args.slow_impls_max_clients is not None:
        for impl in impls:
            if impl.removesuffix(RULE_SUFFIX) in ("fedsim-map", "fedsim-vmap"):
                caps.setdefault(impl, args.slow_impls_max_clients)
    plan, skipped = build_plan(cohorts, impls, caps, args.torch_threads)
    # Each pass runs the whole plan again in fresh processes; a row's rounds
    # from all passes are pooled, so slow drifts of the machine's load hit
    # every implementation alike.
    runs = []
    for pass_idx in range(args.passes):
        for i, (impl, c, thr) in enumerate(plan):
            # Small cohorts' rounds are short and noisy: time at least
            # MIN_CLIENT_TRAININGS client trainings per row.
            reps = max(repeats, -(-MIN_CLIENT_TRAININGS // c))
            with tempfile.TemporaryDirectory() as cache_dir:  # auto calibrates afresh
                runs.append(run_one(impl, c, reps, thr, cache_dir, args.timeout,
                                    args.torch_device, args.precision) | {"repeats": reps})
            # Written after every row, so an interrupted run still leaves its rows.
            done = pass_idx == args.passes - 1 and i == len(plan) - 1
            write_results(args, pool_passes(runs), repeats, skipped, commit, done=done)


def parse_caps(specs: list[str], impls: list[str]) -> dict[str, int]:
    """``["torch-loop=1000", ...]`` → ``{"torch-loop": 1000}``; names what is wrong."""
    caps = {}
    for spec in specs:
        impl, sep, n = spec.partition("=")
        if not sep or not n.isdigit():
            raise SystemExit(f"--impl-max-clients: expected IMPL=N, got {spec!r}")
        if impl not in impls:
            raise SystemExit(f"--impl-max-clients: unknown impl {impl!r} (running: {', '.join(impls)})")
        caps[impl] = int(n)
    return caps


def build_plan(cohorts: list[int], impls: list[str], caps: dict[str, int],
               torch_threads: list[int]) -> tuple[list[tuple[str, int, int]], list[str]]:
    """(impl, clients, threads) rows to run, and the "impl at N=c" rows capped away."""
    plan, skipped = [], []
    for c in cohorts:
        for impl in impls:
            if impl in caps and c > caps[impl]:
                skipped.append(f"{impl} at N={c}")
                continue
            for thr in (torch_threads if impl == "torch-loop" else (1,)):
                plan.append((impl, c, thr))
    return plan, skipped


def pool_passes(runs: list[dict]) -> list[dict]:
    """One row per (impl, clients, threads): rounds of all passes pooled."""
    rows: dict[tuple, dict] = {}
    for r in runs:
        k = (r["impl"], r["clients"], r.get("threads"))
        if k not in rows:
            rows[k] = dict(r, passes=1)
            continue
        row = rows[k]
        row["passes"] += 1
        if r.get("error") or row.get("error"):
            row.setdefault("error", r.get("error"))
            continue
        row["round_seconds"] = row["round_seconds"] + r["round_seconds"]
        row["seconds_per_round"] = statistics.median(row["round_seconds"])
        row["peak_rss_mb"] = max(row["peak_rss_mb"], r["peak_rss_mb"])
        for key in ("device_peak_mb", "device_round_growth_mb"):
            if row.get(key) is not None and r.get(key) is not None:
                row[key] = max(row[key], r[key])
        row["loadavg_1min_before"] = max(row["loadavg_1min_before"], r["loadavg_1min_before"])
        row.setdefault("strategy_reasons", [row.get("strategy_reason")])
        row["strategy_reasons"].append(r.get("strategy_reason"))
    return list(rows.values())


def write_results(args, rows, repeats, skipped, commit: str, done: bool) -> None:
    import jax
    result = {"rows": rows, "device": device_description(), "jax": jax.__version__,
              "mode": ("quick" if args.quick else "full") + ("" if done else " (partial: still running)"),
              "repeats": repeats, "passes": args.passes, "argv": sys.argv[1:], "skipped": skipped,
              "commit": commit,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "loadavg_end": os.getloadavg()}
    try:
        import torch
        result["torch"] = torch.__version__
    except ImportError:
        pass
    result["checks"] = checks(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from fedsim.results import atomic_write_text
    atomic_write_text(out.with_suffix(".json"), json.dumps(result, indent=1) + "\n")
    atomic_write_text(out.with_suffix(".md"), markdown(result))
    if done:
        print("\n".join(result["checks"]))


if __name__ == "__main__":
    main()
