"""``client_parallelism: auto``: pick the fastest cohort strategy by measuring.

Which strategy is fastest depends on the backend and the model: on a 2-core
XLA:CPU the loop and chunked vmap came within 10 % of each other at 500 and
1,000 LeNet-5 clients and vmap of the whole cohort 1.2–2.1× behind the loop
at 10–1,000 clients (``benchmarks/results/engine_throughput.md``; with the
convolutions of vmapped clients as im2col GEMMs; as XLA's grouped
convolutions vmap ran 2.5–3.5× slower than the loop), while on accelerators
vmap is usually best. Rather than guess, :func:`choose_strategy` times each
candidate on a short cohort of the real simulation (same model, data shapes,
local training, defenses), after one warm-up (compile) call each, and takes
the lowest median seconds per client (:func:`measure`).

A short cohort can rank the strategies wrongly for a large one: a round has
costs that do not grow with the cohort, spread over few clients in a short
one, and each strategy's cost per client falls with the cohort at its own
rate. On an H200 the four strategies measured 1.55–2.01 ms per client on 16
clients; on the real 1,000 clients vmap took 0.12 ms per client and the loop
0.37 ms, and vmap's rounds were 2.9× faster than those of the 16-client
choice, map (``benchmarks/results/gpu_session_h200/README.md``). So where more than one
candidate comes within :data:`CONTENDER_FACTOR` of the best on the short
cohort and the real cohort is larger, those contenders are timed again on the
real cohort and the choice is made among them. Where one strategy wins the
short cohort clearly, the second stage is skipped.

The second stage times at most :data:`COHORT_CALIBRATION_CLIENTS` clients of
the real cohort. Timing vmap on a whole cohort of 1,000 LeNet-5 clients on the
2-core CPU raised the process's peak memory to 7 GB, and the chosen
strategy's next rounds ran slower: `auto`'s rounds at 1,000 clients took 1.59×
those of its choice in a fresh process (stop 37's ``engine_throughput.md``),
and in one process chunked's 4 rounds took a median 1.21× as long after vmap
had been timed on 1,000 clients as before it (1.08× after vmap on 256 clients,
1.06× after the loop on 1,000; ``benchmarks/results/auto_after_calibration.md``).
Four later runs of that measurement gave 1.05, 1.28, 1.04 and 0.78 after vmap
on 1,000 clients, inside the machine's drift (docs/scale.md), so the slowdown
is not established; the cap stands for the memory alone.
That stage also times more calls per contender (:data:`COHORT_REPEATS`), since it
has to separate strategies within ~10 % of each other. Whether 256 clients rank
the strategies as the whole cohort does is checked for the CPU and the H200 in
docs/scale.md ("`auto` on accelerators", "Status of the issue-9 acceptance").

vmap's memory grows with the cohort, and the second stage sees at most 256
clients of it: on the 2-core CPU vmap's step plans 5.07 GiB for 1,000 LeNet-5
clients against 1.30 GiB for 256
(``benchmarks/results/cohort_step_memory.md``). So a choice that has not run
on the whole cohort (other than the loop, whose step does not grow) is
compiled for the real cohort, not run, and XLA's planned bytes are checked
against the memory free now (:mod:`fedsim.memory`); one that does not fit
gives way to the next fastest, and the reason line says so.

Where one process sees several devices (several GPUs of one host, or forced
CPU devices), ``sharded`` is timed beside the others (:func:`strategies_to_time`),
so that ``auto`` can spread the cohort over the devices when that is faster.

The result is cached in ``$FEDSIM_CACHE_DIR/calibration.json`` (default
``~/.cache/fedsim``) keyed by backend, device kind and count, jax version,
model, input shape, padded client size, local-training settings, defenses,
cohort size, chunk size, matmul precision and the convolution rule
(:mod:`fedsim.models`), so it is measured once per
setting. The choice and the timings behind it are returned as a one-line
explanation that the run log records.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import jax
import numpy as np

from fedsim import memory, models
from fedsim.config import UNROLL_STEPS
from fedsim.results import atomic_write_text

CANDIDATES = ("loop", "vmap", "map", "chunked")
#: Timed beside :data:`CANDIDATES` where one process sees several devices
#: (:func:`strategies_to_time`): several GPUs of one host, or forced CPU devices.
SHARDED = "sharded"
CALIBRATION_CLIENTS = 16  # cohort measured (capped by the real cohort size)
REPEATS = 3
# Candidates within this factor of the best on the short cohort are timed
# again on the real one. 1.5: on the H200 the four strategies came within
# 1.18–1.46× of each other on 16 clients at every cohort size measured (and
# ranked wrongly for 1,000 and 5,000 clients). On the 2-core CPU vmap was
# 1.9–2.2× behind the loop until vmapped clients' convolutions took im2col; now
# loop, chunked and vmap come within 1.5× there too and the second stage runs
# (docs/scale.md, "Status of the issue-9 acceptance"). A device where
# vmap is more than 1.5× behind on 16 clients yet wins on the real cohort
# would still be misjudged; the reason line shows what was measured.
CONTENDER_FACTOR = 1.5
# The second stage's cohort: the real one, truncated to this many clients, so
# that timing vmap on it bounds calibration's memory (module docstring).
COHORT_CALIBRATION_CLIENTS = 256
# Timed calls per contender in the second stage, which has to separate
# strategies within ~10 % of each other (loop and chunked on the 2-core CPU).
COHORT_REPEATS = 5


def cache_file() -> Path:
    """Where measured choices are cached (override with ``FEDSIM_CACHE_DIR``)."""
    root = os.environ.get("FEDSIM_CACHE_DIR") or os.path.join("~", ".cache", "fedsim")
    return Path(root).expanduser() / "calibration.json"


def calibration_key(sim) -> str:
    """What the fastest strategy can depend on, as a stable string."""
    t = sim.cfg.training
    dev = jax.devices()[0]
    parts = {
        "backend": jax.default_backend(), "device_kind": getattr(dev, "device_kind", "?"),
        "device_count": jax.device_count(), "jax": jax.__version__,
        "model": sim.cfg.model.name, "input_shape": list(sim.dataset.input_shape),
        "num_classes": sim.dataset.num_classes, "n_max": int(sim.n_max),
        "algorithm": t.algorithm, "local_epochs": t.local_epochs, "batch_size": t.batch_size,
        "optimizer": t.optimizer, "cohort": t.clients_per_round, "chunk_size": t.chunk_size,
        "loop_clients_per_call": t.loop_clients_per_call,
        "matmul_precision": t.matmul_precision,
        # Conv's implementation rule, which sets what vmap and chunked cost on CPU.
        "conv_rule": [models.CONV_IMPLEMENTATION, models.IM2COL_MAX_BATCH,
                      models.VMAPPED_IM2COL_MAX_BATCH],
        "defenses": [{k: str(v) for k, v in d.items()} for d in sim.cfg.defenses],
    }
    if t.unroll_steps != UNROLL_STEPS:  # a key only where set, so earlier choices stay valid
        parts["unroll_steps"] = t.unroll_steps
    if t.dtype != "float32":  # likewise
        parts["dtype"] = t.dtype
    from fedsim.checkpoint import hand_defense_specs

    hand = hand_defense_specs(sim)
    if hand:  # Simulation(defenses=...): not in the config; absent otherwise, so keys stay
        parts["hand_defenses"] = hand
    text = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16] + " " + text


def _load_cache() -> dict:
    try:
        return json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}  # a missing or torn cache only costs a re-measurement


def strategies_to_time() -> tuple[str, ...]:
    """The strategies ``auto`` times here: :data:`CANDIDATES`, and ``sharded``
    where this one process has several devices (several processes never
    calibrate: ``auto`` is ``sharded`` there, :func:`fedsim.distributed.check_strategy`).

    Without it a host with several GPUs ran ``auto`` on one of them.
    """
    if jax.device_count() > 1 and jax.process_count() == 1:
        return (*CANDIDATES, SHARDED)
    return CANDIDATES


def measure(sim, candidates=None, clients: int | None = None,
            repeats: int = REPEATS) -> dict[str, float]:
    """Median seconds per client of one cohort step for each candidate
    (default: :func:`strategies_to_time`).

    Each candidate is compiled and warmed up first; then the timed calls go
    round-robin over the candidates, ``repeats`` rounds, so a drift of the
    machine's speed while measuring hits every candidate alike instead of the
    one measured at the time (timed one after another, loop and chunked
    swapped places on this noisy 2-core CPU where they differ by ~10 %:
    docs/scale.md). A candidate more than 3× slower than the best median so
    far is dropped after its first timed call.

    A vmap, map, chunked or sharded step whose memory plan does not fit the free memory
    is not run and counts as failed (:func:`_too_big_to_time`).

    Mutates ``sim.strategy`` while measuring; the caller sets the final one.
    Uses round 0's cohort (truncated) and fresh initial states, so the real
    run's state and randomness are untouched.
    """
    candidates = strategies_to_time() if candidates is None else tuple(candidates)
    C = min(clients or CALIBRATION_CLIENTS, sim.cfg.training.clients_per_round)
    ids = np.asarray(sim.cohort(0))[:C]
    _, ckey = sim.round_keys(0)
    timings: dict[str, float] = {}

    def call(name: str) -> float:
        sim.strategy = name
        sim._compile(reuse=True)  # the run reuses the winner's compiled pieces
        state = sim.init_state()
        t0 = time.perf_counter()
        # Traced under the run's precision, so the run reuses these executables.
        with sim.numerics():
            out = sim._train_cohort(state, ids, ckey, 0)
        jax.block_until_ready(out[0].params)
        return (time.perf_counter() - t0) / C

    def failed(name: str, e: Exception) -> None:
        # A strategy that cannot run here (e.g. out of memory) is simply not chosen.
        timings[name] = float("inf")
        print(f"fedsim: calibration: {name} failed ({type(e).__name__}: {e})")

    runs: dict[str, list[float]] = {}
    for name in candidates:
        too_big = _too_big_to_time(sim, name, C)
        if too_big:  # on a CPU, running it could get the process killed
            failed(name, MemoryError(too_big))
            continue
        try:
            call(name)  # compile + warm-up
            runs[name] = []
        except Exception as e:
            failed(name, e)
    for _ in range(repeats):
        for name in list(runs):
            try:
                runs[name].append(call(name))
            except Exception as e:
                runs.pop(name)
                failed(name, e)
                continue
            best = min(statistics.median(r) for r in runs.values() if r)
            if runs[name][-1] > 3 * best:  # clearly losing: stop spending time on it
                timings[name] = statistics.median(runs.pop(name))
    timings.update({name: statistics.median(r) for name, r in runs.items()})
    return {name: timings[name] for name in candidates}


def _too_big_to_time(sim, name: str, clients: int) -> str | None:
    """Why ``name``'s step on ``clients`` clients must not be timed, or None.

    Plans the step first (:mod:`fedsim.memory`; the warm-up call reuses the
    compile). A plan above :data:`fedsim.memory.HEADROOM` of the free memory is
    not run: out of host memory, the kernel kills the process without an error
    for ``measure`` to catch. Where the plan cannot be made, the warm-up call
    decides, as before.
    """
    if name not in memory.COHORT_STEP_STRATEGIES or not memory.check_enabled():
        return None
    sim.strategy = name
    try:
        need = memory.cohort_step_bytes(sim, clients)
    except Exception:  # no plan: the warm-up call will say what is wrong
        return None
    free = memory.available_bytes()
    if memory.fits(need, free):
        return None
    return (f"its {clients}-client step plans {memory.gib(need)}, more than "
            f"{memory.HEADROOM:.0%} of the {memory.gib(free)} free; not run")


def contenders(timings: dict[str, float], factor: float | None = None) -> list[str]:
    """Candidates within ``factor`` (default :data:`CONTENDER_FACTOR`) of the fastest
    (finite timings only), fastest first."""
    factor = CONTENDER_FACTOR if factor is None else factor
    finite = {k: v for k, v in timings.items() if np.isfinite(v)}
    if not finite:
        return []
    best = min(finite.values())
    return sorted((k for k, v in finite.items() if v <= factor * best), key=finite.get)


def _ranked(timings: dict[str, float]) -> str:
    return ", ".join(f"{k} {v * 1e3:.2f}" for k, v in sorted(timings.items(), key=lambda kv: kv[1]))


def choose_strategy(sim, use_cache: bool = True) -> tuple[str, str]:
    """The fastest strategy for ``sim`` and a one-line explanation.

    Times every candidate on a short cohort (:data:`CALIBRATION_CLIENTS`); where
    several come within :data:`CONTENDER_FACTOR` of the best and the real
    cohort is larger, times those again on the real cohort, truncated to
    :data:`COHORT_CALIBRATION_CLIENTS`, and chooses among them (see the module
    docstring for why).

    Returns:
      (strategy, reason), e.g. ("loop", "auto -> loop: fastest measured
      ms/client on cpu (lenet5): loop 6.10, vmap 18.70, ...; measured now").
    """
    key = calibration_key(sim)
    cache = _load_cache() if use_cache else {}
    hit = cache.get(key)
    cohort = sim.cfg.training.clients_per_round
    short = min(CALIBRATION_CLIENTS, cohort)
    second = min(COHORT_CALIBRATION_CLIENTS, cohort)
    if hit and hit.get("choice") in (*CANDIDATES, SHARDED):
        timings, source = hit["timings"], f"cached in {cache_file()}"
        cohort_timings = hit.get("cohort_timings") or {}
        # Entries cached before the second stage was capped timed the whole cohort.
        second = hit.get("cohort_clients", cohort)
    else:
        timings = measure(sim)
        cohort_timings = {}
        close = contenders(timings)
        if len(close) > 1 and second > short:
            cohort_timings = measure(sim, candidates=close, clients=second,
                                     repeats=COHORT_REPEATS)
        source = "measured now"
        if use_cache:
            cache = _load_cache()
            final = cohort_timings or timings
            cache[key] = {"choice": min(final, key=final.get),
                          "timings": timings, "cohort_timings": cohort_timings,
                          "cohort_clients": second,
                          "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
            try:
                atomic_write_text(cache_file(), json.dumps(cache, indent=1))
            except OSError:
                source += " (cache not writable)"
    final = cohort_timings or timings
    # Fastest first: the second stage's ranking, then the rest of the first stage's.
    ranked = sorted((k for k, v in final.items() if np.isfinite(v)), key=final.get)
    ranked += sorted((k for k, v in timings.items() if np.isfinite(v) and k not in ranked),
                     key=timings.get)
    if not ranked:
        raise RuntimeError("client_parallelism=auto: every strategy failed while calibrating "
                           f"({_ranked(timings)}); see the errors printed above")
    timed_on = {k: (second if k in cohort_timings else short) for k in ranked}
    choice, memory_note = _first_that_fits(sim, ranked, timed_on, cohort)
    measured = _ranked(timings)
    if cohort_timings:
        of = "the" if second == cohort else f"{second} clients of the"
        measured = (f"on {short} clients {_ranked(timings)}; the contenders again on {of} "
                    f"{cohort}-client cohort {_ranked(cohort_timings)}")
    fastest = ("fastest measured" if choice == ranked[0]
               else "fastest measured that fits in memory")
    # The strategies agree up to float rounding, which training can grow: the
    # choice is part of what gives the run's numbers, so say how to repeat it.
    reason = (f"client_parallelism=auto -> {choice}: {fastest} ms/client on "
              f"{jax.default_backend()} ({sim.cfg.model.name}): {measured}; {source}"
              f"{memory_note}; set training.client_parallelism: {choice} to repeat this "
              "run's numbers where auto may choose otherwise")
    return choice, reason


def _first_that_fits(sim, ranked: list[str], timed_on: dict[str, int],
                     cohort: int) -> tuple[str, str]:
    """The first of ``ranked`` whose cohort step fits the real cohort in memory.

    A strategy already run on the whole cohort and the loop (whose per-client
    step does not grow with the cohort) are not checked. Any other (``sharded``
    included: one device's share, times the devices that share the host's
    memory on a CPU) is compiled for the real cohort, without running it, and
    XLA's planned bytes compared with the memory free now (:mod:`fedsim.memory`).
    Not cached: what is free changes between runs.

    Returns:
      (strategy, note for the reason line: "" where nothing was checked).

    Raises:
      RuntimeError: no measured strategy fits.
    """
    notes = []
    for name in ranked:
        if name == "loop" or cohort <= timed_on[name]:
            return name, "".join(f"; {n}" for n in notes)
        sim.strategy = name
        try:
            need = memory.cohort_step_bytes(sim, cohort)
        except Exception as e:  # a step that does not even compile does not fit
            notes.append(f"{name} skipped: its {cohort}-client step failed to compile "
                         f"({type(e).__name__}: {e})")
            continue
        free = memory.available_bytes()
        memory.record_plan(sim, cohort, need, free)
        if need is None or free is None:
            notes.append(f"{name}'s memory on the {cohort}-client cohort not checked "
                         f"(the backend reports no {'estimate' if need is None else 'free memory'})")
            return name, "".join(f"; {n}" for n in notes)
        if memory.fits(need, free):
            # Checked here against the same plan: the first round need not again.
            sim.__dict__.setdefault("_memory_checked", set()).add(name)
            notes.append(f"{name}'s step on the {cohort}-client cohort plans "
                         f"{memory.gib(need)}, {memory.gib(free)} free")
            return name, "".join(f"; {n}" for n in notes)
        notes.append(f"{name} skipped: its step on the {cohort}-client cohort plans "
                     f"{memory.gib(need)}, more than {memory.HEADROOM:.0%} of the "
                     f"{memory.gib(free)} free")
    raise RuntimeError("client_parallelism=auto: no measured strategy fits the "
                       f"{cohort}-client cohort in memory: " + "; ".join(notes)
                       + "; set training.clients_per_round lower or "
                       "training.client_parallelism=loop")
