"""XLA's planned memory of a cohort step against the memory a round really takes.

``client_parallelism: auto`` skips a strategy whose cohort step, compiled for
the real cohort, plans more bytes than are free (:mod:`fedsim.memory`). This
checks that estimate on the host: for each (strategy, clients), in a fresh
process on the engine-throughput benchmark's LeNet-5 workload,

1. ``planned``: :func:`fedsim.memory.cohort_step_bytes` (compiled, not run);
2. ``measured``: the growth of the process's resident memory during round 0,
   whose cohort step the plan compiled: the peak (``VmHWM``, reset through
   ``/proc/self/clear_refs`` just before the round) less the resident memory at
   its start, after glibc's ``malloc_trim(0)``; and the same for round 1.

A run whose plan exceeds the free memory is refused before its first round
(:class:`fedsim.memory.InsufficientMemoryError`), as it would be for a user,
and its row says so (the default ``vmap:5000`` plans ~25 GiB on a 24 GiB
machine).

Linux only (``/proc``); the measurement is the host's, so on an accelerator
it measures nothing of the device and the script refuses to run there.

``sharded`` rows (``sharded:CLIENTS:DEVICES``) run on ``DEVICES`` forced CPU
devices (``--xla_force_host_platform_device_count``) in one process: they share
the host's memory, and the plan counts one device's share once per device.

``--malloc-arena-max N`` runs the workers with ``MALLOC_ARENA_MAX=N``: glibc
then gives the device threads no arenas of their own, whose freed pages the
measurement would otherwise count (``sharded`` on two forced devices).

Usage: ``python -m benchmarks.cohort_step_memory [--runs vmap:16 vmap:256 sharded:1000:2 ...]
[--malloc-arena-max N]``
Writes ``benchmarks/results/cohort_step_memory.{json,md}`` (with
``--malloc-arena-max N``: ``cohort_step_memory_arena<N>.{json,md}``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shlex
import sys
import time

from benchmarks.provenance import ROOT, git_commit, short_commit
from benchmarks.results_io import write_json_and_markdown
from benchmarks.worker_rows import run_worker, worker_env

DEFAULT_RUNS = ("vmap:16", "vmap:256", "vmap:1000", "chunked:1000", "map:1000",
                "sharded:1000:1", "sharded:250:2", "sharded:1000:2", "sharded:4000:2", "vmap:5000")
STRATEGIES = ("vmap", "chunked", "map", "sharded")


def _status_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def worker(strategy: str, clients: int, devices: int = 1) -> dict:
    import jax

    from benchmarks.engine_throughput import workload
    from fedsim import memory
    from fedsim.simulation import Simulation

    if jax.default_backend() != "cpu":
        raise SystemExit("cohort_step_memory measures host memory: run it with JAX_PLATFORMS=cpu")
    if jax.device_count() != devices:
        raise SystemExit(f"expected {devices} CPU devices, got {jax.device_count()}")
    cfg, ds = workload(clients, strategy)
    sim = Simulation(cfg, dataset=ds, donate=True)
    planned = memory.cohort_step_bytes(sim, clients)
    row = {"strategy": strategy, "clients": clients, "devices": devices, "planned_bytes": planned,
           "worker_malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
           "available_bytes": memory.available_bytes()}
    state = jax.block_until_ready(sim.init_state())
    try:
        # The plan compiled the cohort step, and the round reuses it: round 0's
        # growth is the step's memory on a fresh heap.
        state, seconds0, grown0 = _measured_round(sim, state, 0)
    except memory.InsufficientMemoryError as e:  # what a user of this strategy gets
        return row | {"refused": str(e)}
    state, seconds1, grown1 = _measured_round(sim, state, 1)
    return row | {"measured_bytes": grown0, "round_seconds": seconds0,
                  "measured_round1_bytes": grown1, "round1_seconds": seconds1}


def _measured_round(sim, state, round_idx: int):
    """(state, seconds, resident-memory growth in bytes) of one round."""
    (state, _), seconds, grown = resident_growth(lambda: sim.run_round(state, round_idx))
    return state, seconds, grown


def resident_growth(call):
    """(call's result, seconds, growth of resident memory in bytes while it ran).

    The peak (``VmHWM``) is reset through ``/proc/self/clear_refs`` first, and
    glibc's ``malloc_trim(0)`` hands freed heap back to the kernel: without it,
    round 1 reused pages round 0 had freed, and its growth depended on whether
    they had been returned (vmap at 256 clients: 1.42 GiB in one run, 0.15 GiB
    in the next; ``cohort_step_memory_round1_untrimmed.md``).
    """
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak resident set (VmHWM) to the current one
    start = _status_kib("VmRSS")
    t0 = time.perf_counter()
    out = call()
    seconds = time.perf_counter() - t0
    return out, seconds, (_status_kib("VmHWM") - start) * 1024


def run_one(strategy: str, clients: int, devices: int, timeout: float,
            arena_max: int | None = None) -> dict:
    extra = {} if arena_max is None else {"MALLOC_ARENA_MAX": str(arena_max)}
    env = worker_env(JAX_PLATFORMS="cpu",
                     XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", **extra)
    cmd = [sys.executable, "-m", "benchmarks.cohort_step_memory", "--worker",
           f"{strategy}:{clients}" + (f":{devices}" if strategy == "sharded" else "")]
    row = {"strategy": strategy, "clients": clients, "devices": devices}
    run_worker(cmd, row, timeout, env)
    print(json.dumps(row), flush=True)
    return row


def parse_run(text: str) -> tuple[str, int, int]:
    """``"vmap:1000"`` -> ("vmap", 1000, 1), ``"sharded:1000:2"`` -> ("sharded", 1000, 2)
    (the last: forced CPU devices, sharded only), with an error naming what is wrong."""
    parts = text.split(":")
    strategy = parts[0]
    numbers = parts[1:]
    ok = (strategy in STRATEGIES and len(numbers) in (1, 2)
          and all(n.isdigit() and int(n) >= 1 for n in numbers)
          and (len(numbers) == 1 or strategy == "sharded"))
    if not ok:
        raise argparse.ArgumentTypeError(
            f"--runs entry {text!r}: expected STRATEGY:CLIENTS with STRATEGY one of "
            f"{', '.join(STRATEGIES)} and CLIENTS a positive integer, or "
            "sharded:CLIENTS:DEVICES (forced CPU devices)")
    return strategy, int(numbers[0]), int(numbers[1]) if len(numbers) == 2 else 1


def markdown(result: dict) -> str:
    gib = lambda b: "–" if b is None else f"{b / 2**30:.3f}"
    lines = [
        "# Cohort step memory: XLA's plan vs a warm round's resident-memory growth",
        "",
        f"Commit {short_commit(result['commit'])}; {result['device']}; "
        f"`{result.get('command', 'python -m benchmarks.cohort_step_memory')}`. LeNet-5, the engine-throughput "
        "workload (`benchmarks/engine_throughput.workload`); each row a fresh process.",
        "",
        "planned: `fedsim.memory.cohort_step_bytes` (temporaries + outputs − donated "
        "aliases of the compiled step); measured: peak resident memory during the round "
        "less the resident memory at its start (after `malloc_trim(0)`); round 0 reuses "
        "the plan's executable"
        + (f"; workers ran with `MALLOC_ARENA_MAX={result['malloc_arena_max']}`"
           if result.get("malloc_arena_max") is not None else "")
        + ". `auto` skips a strategy whose planned bytes exceed "
        f"{result['headroom']:.0%} of the free memory; a fixed strategy whose plan exceeds "
        "the free memory is refused. `sharded` runs on forced CPU devices in one process, "
        "which share the host's memory: its plan is one device's share times the devices.",
        "",
        "| strategy | clients | planned GiB | measured GiB, round 0 | round 0 / planned | "
        "measured GiB, round 1 | round 1 / planned | round 1 s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if r.get("devices", 1) > 1:
            r = dict(r, strategy=f"{r['strategy']} ({r['devices']} CPU devices)")
        if "error" in r:
            lines.append(f"| {r['strategy']} | {r['clients']} | error: {r['error']} |"
                         + " |" * 5)
            continue
        if "refused" in r:
            lines.append(f"| {r['strategy']} | {r['clients']} | {gib(r['planned_bytes'])} | "
                         f"refused before round 0 ({gib(r['available_bytes'])} GiB free) |"
                         + " – |" * 4)
            continue
        ratio = lambda b: f"{b / r['planned_bytes']:.2f}" if r["planned_bytes"] else "–"
        lines.append(f"| {r['strategy']} | {r['clients']} | {gib(r['planned_bytes'])} | "
                     f"{gib(r['measured_bytes'])} | {ratio(r['measured_bytes'])} | "
                     f"{gib(r['measured_round1_bytes'])} | {ratio(r['measured_round1_bytes'])} | "
                     f"{r['round1_seconds']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", type=parse_run, help=argparse.SUPPRESS)
    ap.add_argument("--runs", nargs="+", type=parse_run,
                    default=[parse_run(r) for r in DEFAULT_RUNS],
                    help="STRATEGY:CLIENTS pairs, each measured in a fresh process")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--malloc-arena-max", type=int, default=None, metavar="N",
                    help="run the workers with MALLOC_ARENA_MAX=N (glibc's arenas)")
    args = ap.parse_args(argv)
    if not args.timeout > 0:
        ap.error(f"--timeout must be > 0 seconds, got {args.timeout}")
    if args.malloc_arena_max is not None and args.malloc_arena_max < 1:
        ap.error(f"--malloc-arena-max must be >= 1, got {args.malloc_arena_max}")
    if args.worker:
        print("ROW " + json.dumps(worker(*args.worker)), flush=True)
        return
    from benchmarks.engine_throughput import device_description
    from fedsim.memory import HEADROOM

    arena = args.malloc_arena_max
    command = " ".join(["python -m benchmarks.cohort_step_memory",
                        *(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))])
    result = {"commit": git_commit(), "device": device_description(), "headroom": HEADROOM,
              "command": command, "malloc_arena_max": arena,
              "rows": [run_one(s, n, d, args.timeout, arena) for s, n, d in args.runs]}
    name = "cohort_step_memory" + ("" if arena is None else f"_arena{arena}")
    write_json_and_markdown(args.out, name, result, markdown(result))


if __name__ == "__main__":
    main()
