"""``client_parallelism: auto``: pick the fastest cohort strategy by measuring.

Which strategy is fastest depends on the backend and the model: on a 2-core
XLA:CPU a vmapped LeNet cohort ran 2.5–3.5× slower per client than a Python
loop over one jitted client (per-client weights turn convolutions into grouped
convolutions), while on accelerators vmap is usually best. Rather than guess,
:func:`choose_strategy` times each candidate on a short cohort of the real
simulation (same model, data shapes, local training, defenses), after one
warm-up (compile) call, and takes the lowest median seconds per client.

The result is cached in ``$FEDSIM_CACHE_DIR/calibration.json`` (default
``~/.cache/fedsim``) keyed by backend, device kind and count, jax version,
model, input shape, padded client size, local-training settings, defenses,
cohort size and chunk size, so it is measured once per setting. The choice
and the timings behind it are returned as a one-line explanation that the
run log records.
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

from fedsim.results import atomic_write_text

CANDIDATES = ("loop", "vmap", "map", "chunked")
CALIBRATION_CLIENTS = 16  # cohort measured (capped by the real cohort size)
REPEATS = 3


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
        "defenses": [{k: str(v) for k, v in d.items()} for d in sim.cfg.defenses],
    }
    text = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16] + " " + text


def _load_cache() -> dict:
    try:
        return json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}  # a missing or torn cache only costs a re-measurement


def measure(sim, candidates=CANDIDATES, clients: int | None = None,
            repeats: int = REPEATS) -> dict[str, float]:
    """Median seconds per client of one cohort step for each candidate.

    Mutates ``sim.strategy`` while measuring; the caller sets the final one.
    Uses round 0's cohort (truncated) and fresh initial states, so the real
    run's state and randomness are untouched.
    """
    C = min(clients or CALIBRATION_CLIENTS, sim.cfg.training.clients_per_round)
    ids = np.asarray(sim.cohort(0))[:C]
    _, ckey = sim.round_keys(0)
    timings: dict[str, float] = {}
    best = float("inf")
    for name in candidates:
        sim.strategy = name
        sim._compile(reuse=True)  # the run reuses the winner's compiled pieces
        try:
            out = sim._train_cohort(sim.init_state(), ids, ckey, 0)  # compile + warm-up
            jax.block_until_ready(out[0].params)
            runs = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = sim._train_cohort(sim.init_state(), ids, ckey, 0)
                jax.block_until_ready(out[0].params)
                runs.append((time.perf_counter() - t0) / C)
                if runs[-1] > 3 * best:  # clearly losing: stop spending time on it
                    break
        except Exception as e:  # a strategy that cannot run here is simply not chosen
            timings[name] = float("inf")
            print(f"fedsim: calibration: {name} failed ({type(e).__name__}: {e})")
            continue
        timings[name] = statistics.median(runs)
        best = min(best, timings[name])
    return timings


def choose_strategy(sim, use_cache: bool = True) -> tuple[str, str]:
    """The fastest strategy for ``sim`` and a one-line explanation.

    Returns:
      (strategy, reason), e.g. ("loop", "auto -> loop: measured s/client
      loop 0.0061, vmap 0.0187, ... (16 clients, cpu); cached").
    """
    key = calibration_key(sim)
    cache = _load_cache() if use_cache else {}
    hit = cache.get(key)
    if hit and hit.get("choice") in CANDIDATES:
        timings, source = hit["timings"], f"cached in {cache_file()}"
    else:
        timings = measure(sim)
        source = "measured now"
        if use_cache:
            cache = _load_cache()
            cache[key] = {"choice": min(timings, key=timings.get), "timings": timings,
                          "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
            try:
                atomic_write_text(cache_file(), json.dumps(cache, indent=1))
            except OSError:
                source += " (cache not writable)"
    choice = min(timings, key=timings.get)
    ranked = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in sorted(timings.items(), key=lambda kv: kv[1]))
    reason = (f"client_parallelism=auto -> {choice}: fastest measured ms/client on "
              f"{jax.default_backend()} ({sim.cfg.model.name}): {ranked}; {source}")
    return choice, reason
