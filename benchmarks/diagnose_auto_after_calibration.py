"""Why ``auto``'s rounds at 1,000 LeNet-5 clients ran slower than the same
strategy in a fresh process (``engine_throughput.md``, stop 37).

One process, one simulation with a fixed strategy (``--strategy``, default
``chunked``), the engine-throughput benchmark's workload. It times that
strategy's rounds, then runs other strategies' cohort steps the way
calibration does (:func:`fedsim.calibrate.measure`), then times the same
strategy's rounds again, after each disturbance in turn:

1. ``fresh``: rounds with nothing else run before;
2. ``after <s> on N``: rounds after calibration timed strategy ``s`` on
   N clients (``--disturb``, e.g. ``loop:1000 vmap:1000 vmap:256``).

Each phase is ``--rounds`` timed rounds; the process's peak RSS is recorded
after each. If the rounds after a disturbance are slower than fresh ones, the
disturbance is what slows ``auto``'s rounds.

Usage: ``python -m benchmarks.diagnose_auto_after_calibration [--clients 1000]``
Writes ``benchmarks/results/auto_after_calibration.{json,md}``.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

from benchmarks.engine_throughput import peak_rss_mb, workload
from benchmarks.provenance import git_commit
from benchmarks.results_io import write_json_and_markdown


def time_rounds(sim, state, first_round: int, rounds: int):
    times = []
    for r in range(first_round, first_round + rounds):
        state, res = sim.run_round(state, r)
        times.append(res.seconds)
    return state, times


def main() -> None:
    from fedsim import calibrate
    from fedsim.simulation import Simulation

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--strategy", default="chunked")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--disturb", nargs="*", default=["loop:1000", "vmap:1000"],
                    help="STRATEGY:CLIENTS timed the way calibration does, in order")
    ap.add_argument("--malloc-trim", action="store_true",
                    help="call glibc's malloc_trim(0) after each disturbance")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--name", default="auto_after_calibration")
    args = ap.parse_args()
    if args.clients < 1 or args.rounds < 1:
        ap.error(f"--clients and --rounds must be >= 1, got {args.clients} and {args.rounds}")
    if args.strategy not in calibrate.CANDIDATES:
        ap.error(f"--strategy {args.strategy!r}: expected one of {calibrate.CANDIDATES}")
    disturb = []
    for spec in args.disturb:
        name, _, n = spec.partition(":")
        if name not in calibrate.CANDIDATES or not n.isdigit():
            ap.error(f"--disturb {spec!r}: expected STRATEGY:CLIENTS with STRATEGY in "
                     f"{calibrate.CANDIDATES}")
        disturb.append((name, int(n)))

    commit = git_commit()
    cfg, ds = workload(args.clients, args.strategy)
    sim = Simulation(cfg, dataset=ds, donate=True)
    state = sim.init_state()
    state, _ = sim.run_round(state, 0)  # compile + warm-up
    next_round = 1
    phases = []

    def phase(label: str):
        nonlocal state, next_round
        state, times = time_rounds(sim, state, next_round, args.rounds)
        next_round += args.rounds
        phases.append({"phase": label, "round_seconds": times,
                       "median": statistics.median(times), "peak_rss_mb": peak_rss_mb()})
        print(f"{label}: {', '.join(f'{t:.3f}' for t in times)} s "
              f"(peak RSS {phases[-1]['peak_rss_mb']:.0f} MiB)", flush=True)

    phase("fresh")
    for name, n in disturb:
        t0 = time.perf_counter()
        timing = calibrate.measure(sim, candidates=(name,), clients=n)
        sim.strategy = args.strategy
        sim._compile(reuse=True)
        if args.malloc_trim:  # hand the freed heap back to the OS, as a test of the cause
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        print(f"  calibration-style timing of {name} on {n}: {timing[name] * 1e3:.2f} ms/client "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
        phase(f"after {name} on {n}")

    fresh = phases[0]["median"]
    lines = [
        "# `auto`'s rounds after calibration: does timing other strategies slow the chosen one?",
        "",
        f"Produced by `python -m benchmarks.diagnose_auto_after_calibration --clients {args.clients} "
        f"--strategy {args.strategy} --rounds {args.rounds} --disturb {' '.join(args.disturb)}"
        f"{' --malloc-trim' if args.malloc_trim else ''}` "
        f"at commit {commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "One process; LeNet-5, 64 examples per client, 2 SGD steps of batch 32 (the "
        "engine-throughput workload). Each phase: the listed rounds of the fixed strategy.",
        "",
        "| phase | rounds (s) | median (s) | / fresh | peak RSS so far (MiB) |",
        "|---|---|---|---|---|",
    ]
    for p in phases:
        lines.append(f"| {p['phase']} | {', '.join(f'{t:.3f}' for t in p['round_seconds'])} | "
                     f"{p['median']:.3f} | {p['median'] / fresh:.2f} | {p['peak_rss_mb']:.0f} |")
    write_json_and_markdown(args.out, args.name, {"commit": commit, "args": vars(args), "phases": phases},
                            "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
