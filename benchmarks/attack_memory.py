"""XLA's planned memory of a vmapped gradient-inversion call against what it takes.

The gradient-matching attacks split victims into calls that fit in memory
(:func:`attacks.gradient_inversion.choose_victims_per_call`), sized from XLA's plan for
the call. This checks that plan on the host, as ``cohort_step_memory`` does for
the engine's cohort step: in a fresh process per row, Inverting Gradients on
V victims (Conv-2, 16×16×1 inputs, batch B, shared global model, 20
iterations; the memory does not grow with the iterations, which a ``lax.scan``
runs), then

1. ``planned``: :func:`fedsim.memory.planned_bytes` of the call (compiled, not run);
2. ``measured``: the growth of resident memory during the call
   (:func:`benchmarks.cohort_step_memory.resident_growth`), for the first call
   (which reuses the plan's executable) and a second one.

On the CPU (default) the growth is of resident memory, Linux only, as in
``cohort_step_memory``. With ``--device gpu`` it is the accelerator's: its
``peak_bytes_in_use`` after the call less its ``bytes_in_use`` before
(:func:`benchmarks.device_memory.device_growth`). That peak cannot be reset
and compilation sets it first, so a ballast buffer lifts ``bytes_in_use`` to
the peak before each call: then the call's allocations raise it.

With ``--pretend-free-gib G`` an extra row attacks the last count of victims
with the attack told that only G GiB are free, so that it splits them into
calls: its growth shows what a split call really takes against G.

Usage: ``python -m benchmarks.attack_memory [--runs 1 8 32] [--batch 8]
[--pretend-free-gib 0.6] [--device gpu]``
Writes ``benchmarks/results/attack_memory.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from benchmarks.device_memory import device_growth
from benchmarks.provenance import ROOT, git_commit, short_commit
from benchmarks.results_io import write_json_and_markdown
from benchmarks.worker_rows import run_worker, worker_env

DEFAULT_VICTIMS = (1, 8, 32)
SHAPE = (16, 16, 1)
ITERATIONS = 20
PLATFORMS = {"cpu": "cpu", "gpu": "cuda"}  # --device -> JAX_PLATFORMS


def worker(victims: int, batch: int, pretend_free_gib: float | None = None,
           iterations: int = ITERATIONS) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from attacks import gradient_inversion as GI
    from benchmarks.cohort_step_memory import resident_growth
    from benchmarks.engine_throughput import device_description
    from fedsim import memory
    from fedsim.client import masked_mean_loss
    from fedsim.models import build_model, init_params, make_apply_fn

    on_cpu = jax.default_backend() == "cpu"
    model = build_model("conv2")
    apply_fn = make_apply_fn(model)
    params = init_params(model, SHAPE, jax.random.key(0))
    rng = np.random.default_rng(0)
    grad = jax.jit(jax.grad(masked_mean_loss, argnums=1), static_argnums=0)
    targets = []
    for _ in range(victims):
        x = jnp.asarray(rng.random((batch, *SHAPE)), jnp.float32)
        y = jnp.asarray(rng.integers(0, 10, batch), jnp.int32)
        targets.append(grad(apply_fn, params, x, y, jnp.ones(batch)))
    targets = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *targets)
    labels = jnp.zeros((victims, batch), jnp.int32)
    keys = jax.random.split(jax.random.key(1), victims)
    if pretend_free_gib is not None:  # as if only this much were free: forces a split
        memory.available_bytes = lambda: int(pretend_free_gib * 2**30)
    cfg = GI.InversionConfig(iterations=iterations, restarts=1)
    fn = GI._compiled(apply_fn, cfg, batch, SHAPE, 10, True)
    planned = memory.planned_bytes(fn, params, targets, labels, keys)
    kw = dict(batch_size=batch, input_shape=SHAPE, num_classes=10, shared_params=True)
    call = lambda: GI.invert_victims(apply_fn, cfg, params, targets, labels, keys, **kw)
    first, second = {}, {}  # the ballasts' sizes on a device
    if on_cpu:
        out, seconds0, grown0 = resident_growth(call)
        _, seconds1, grown1 = resident_growth(call)
    else:  # a ballast lifts the allocator's in-use bytes to its peak first
        out, seconds0, grown0 = device_growth(call, jax.local_devices()[0], record=first)
        _, seconds1, grown1 = device_growth(call, jax.local_devices()[0], record=second)
    k = out["victims_per_call"]
    # A split call's own plan (after the measured calls, so its compile does not
    # disturb them): the split sized each call from it.
    per_call = (planned if k >= victims else memory.planned_bytes(
        fn, params, jax.tree_util.tree_map(lambda t: t[:k], targets), labels[:k], keys[:k]))
    return {"victims": victims, "batch": batch, "planned_bytes": planned,
            "planned_per_call_bytes": per_call,
            "pretend_free_bytes": (None if pretend_free_gib is None
                                   else int(pretend_free_gib * 2**30)),
            "available_bytes": memory.available_bytes(),
            "victims_per_call": out["victims_per_call"],
            "device": device_description(),
            "measured_bytes": grown0, "seconds": seconds0,
            "measured_second_bytes": grown1, "second_seconds": seconds1,
            "ballast_bytes": first.get("ballast_bytes"),
            "second_ballast_bytes": second.get("ballast_bytes")}


def run_one(victims: int, batch: int, timeout: float,
            pretend_free_gib: float | None = None, iterations: int = ITERATIONS,
            device: str = "cpu") -> dict:
    env = worker_env(JAX_PLATFORMS=PLATFORMS[device])
    cmd = [sys.executable, "-m", "benchmarks.attack_memory", "--worker", str(victims),
           "--batch", str(batch), "--iterations", str(iterations)] + ([] if pretend_free_gib is None
                                     else ["--pretend-free-gib", str(pretend_free_gib)])
    row = {"victims": victims, "batch": batch}
    run_worker(cmd, row, timeout, env)
    print(json.dumps(row), flush=True)
    return row


def markdown(result: dict) -> str:
    gib = lambda b: "–" if b is None else f"{b / 2**30:.3f}"
    on_gpu = result.get("measured_on") == "gpu"
    measured = ("measured: the accelerator's peak allocated bytes after the call less "
                "those allocated before it (JAX's `memory_stats`), a ballast buffer having "
                "lifted the bytes in use to the process's earlier peak (set by compilation) "
                "so that the call's own allocations raise it (`benchmarks.device_memory`); "
                "– where no ballast could lift them; "
                if on_gpu else
                "measured: peak resident memory during the call less the resident memory at "
                "its start (after `malloc_trim(0)`); ")
    lines = [
        "# Attack memory: XLA's plan vs a vmapped inversion call's "
        + ("accelerator-memory growth" if on_gpu else "resident-memory growth"),
        "",
        f"Commit {short_commit(result['commit'])}; {result['device']}; "
        "`python -m benchmarks.attack_memory`. Inverting Gradients, Conv-2, 16×16×1, "
        f"shared global model, {result.get('iterations', ITERATIONS)} iterations, 1 restart; "
        f"XLA_FLAGS `{result.get('xla_flags') or '(none)'}`; each row a fresh process.",
        "",
        "planned: `fedsim.memory.planned_bytes` of the call (temporaries + outputs); "
        + measured + "the first call reuses the plan's executable. "
        "Victims are split into calls where the plan times the measured margin "
        f"({result.get('plan_margin', '–')}) exceeds {result['headroom']:.0%} of the free "
        "memory. A row with \"free (pretended)\" told the attack only that much was free, "
        "to make it split; its planned GiB is the whole call's.",
        "",
        "| victims | B | free (pretended) GiB | planned GiB | first call GiB | ÷ plan | "
        "second call GiB | ÷ plan | victims per call | one call's plan GiB | "
        "second ÷ one call's plan | second call s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['victims']} | {r['batch']} | error: {r['error']} |" + " |" * 9)
            continue
        ratio = lambda b: f"{b / r['planned_bytes']:.2f}" if r["planned_bytes"] and b is not None else "–"
        per_call = lambda b: (f"{b / r['planned_per_call_bytes']:.2f}"
                              if r.get("planned_per_call_bytes") and b is not None else "–")
        pretend = r.get("pretend_free_bytes")
        lines.append(f"| {r['victims']} | {r['batch']} | "
                     f"{'–' if pretend is None else gib(pretend)} | {gib(r['planned_bytes'])} | "
                     f"{gib(r['measured_bytes'])} | {ratio(r['measured_bytes'])} | "
                     f"{gib(r['measured_second_bytes'])} | {ratio(r['measured_second_bytes'])} | "
                     f"{r['victims_per_call']} | {gib(r.get('planned_per_call_bytes'))} | "
                     f"{per_call(r['measured_second_bytes'])} | {r['second_seconds']:.2f} |")
    return "\n".join(lines) + "\n"


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", type=positive, help=argparse.SUPPRESS)
    ap.add_argument("--runs", nargs="+", type=positive, default=list(DEFAULT_VICTIMS),
                    help="victim counts, each measured in a fresh process")
    ap.add_argument("--batch", type=positive, default=8, help="the victims' batch size B")
    ap.add_argument("--iterations", type=positive, default=ITERATIONS,
                    help="attack iterations (the scan's length)")
    ap.add_argument("--name", default="attack_memory", help="output file name (no suffix)")
    ap.add_argument("--pretend-free-gib", type=float, default=None,
                    help="an extra row: the last --runs count with the attack told only "
                         "this much memory is free, so that it splits the victims")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    ap.add_argument("--device", choices=tuple(PLATFORMS), default="cpu",
                    help="measure host memory (cpu) or the accelerator's (gpu)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    if not args.timeout > 0:
        ap.error(f"--timeout must be > 0 seconds, got {args.timeout}")
    if args.pretend_free_gib is not None and not args.pretend_free_gib > 0:
        ap.error(f"--pretend-free-gib must be > 0, got {args.pretend_free_gib}")
    if args.worker:
        print("ROW " + json.dumps(worker(args.worker, args.batch, args.pretend_free_gib,
                                         args.iterations)), flush=True)
        return
    from attacks.gradient_inversion import PLAN_MARGIN
    from fedsim.memory import HEADROOM

    # This process never touches a device: on a GPU it would hold memory the
    # workers then lack. The workers name the device.
    result = {"commit": git_commit(), "headroom": HEADROOM, "measured_on": args.device,
              "plan_margin": PLAN_MARGIN, "iterations": args.iterations,
              "xla_flags": os.environ.get("XLA_FLAGS", ""), "rows": []}
    plan = [(v, None) for v in args.runs]
    if args.pretend_free_gib is not None:
        plan.append((args.runs[-1], args.pretend_free_gib))
    for victims, pretend in plan:  # written after every row: a step limit keeps the rows done
        result["rows"].append(run_one(victims, args.batch, args.timeout, pretend,
                                      args.iterations, args.device))
        result["device"] = next((r["device"] for r in result["rows"] if "device" in r),
                                f"{args.device} (no worker row)")
        write_json_and_markdown(args.out, args.name, result, markdown(result))


if __name__ == "__main__":
    main()
