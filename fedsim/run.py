"""Run a configured simulation end to end, writing the run directory."""

from __future__ import annotations

import inspect
import math
import resource
import sys
import time
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from fedsim import checkpoint, distributed, preemption
from fedsim.config import Config, dump_config
from fedsim.provenance import environment
from fedsim.results import MetricsLog, atomic_write_text, plot_learning_curve, write_json
from fedsim.simulation import RoundResult, Simulation


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB (Linux ru_maxrss is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_dir_for(cfg: Config) -> Path:
    return Path(cfg.output.dir or f"runs/{cfg.name}")


def run_simulation(cfg: Config, *, sim: Simulation | None = None,
                   on_round: Callable[[RoundResult, dict], None] | None = None,
                   quiet: bool = False) -> dict:
    """Run all rounds of ``cfg``; write config.yaml, metrics.jsonl, summary.json, PNG.

    With several processes (:mod:`fedsim.distributed`) every process runs this;
    only process 0 writes the run directory's files and shows progress, and all
    of them take part in checkpoint saves.

    Args:
      cfg: validated config.
      sim: a prebuilt simulation (else built from cfg).
      on_round: called after each round with its result and metrics row (the
        attack harness uses it to receive observed uploads).
      quiet: no progress bar.

    Returns:
      The summary dict (also written to RUN_DIR/summary.json).
    """
    t_start = time.perf_counter()
    out = run_dir_for(cfg)
    primary = distributed.is_primary()
    quiet = quiet or not primary
    if primary:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "config.yaml", dump_config(cfg))
    ckpt_dir = out / "checkpoints"
    every = cfg.output.checkpoint_every
    meta = checkpoint.read_meta(ckpt_dir) if every else None
    # A resumed run keeps the strategy it started with (same numbers).
    sim = sim or Simulation(cfg, donate=True, strategy=(meta or {}).get("strategy"))
    log_line = ((lambda text, echo=True: _log_line(out, text, quiet or not echo)) if primary
                else (lambda text, echo=True: None))
    log_line(sim.strategy_reason)
    note = pruning_schedule_note(cfg)
    if note is not None:
        log_line(note)
    state, start = sim.init_state(), 0
    ckpt = checkpoint.Checkpointer(ckpt_dir) if every else None
    if meta is not None:
        state, meta = ckpt.restore(state, checkpoint.accepted_fingerprints(cfg))
        sim.adopt(state)  # a pruning mask re-made before the checkpoint
        start = int(state.round)
        checkpoint.load_callback_states(sim.round_callbacks, meta.get("callbacks"))
        log_line(f"resumed from {ckpt_dir}: {start} rounds done")
    log = MetricsLog(out / "metrics.jsonl", keep_rounds_below=start if start else None,
                     write=primary)
    rounds = cfg.training.rounds
    progress = _progress(rounds, cfg.output.progress and not quiet, desc=cfg.name)
    if progress is not None:
        progress.update(min(start, rounds))
    evals = [row for row in log.rows if row.get("test_accuracy") is not None]
    acc, loss = (evals[-1]["test_accuracy"], evals[-1]["test_loss"]) if evals else (None, None)
    watch = preemption.Watch(handle_signal=ckpt is not None)
    with watch:
        state, acc, loss = _run_rounds(cfg, sim, state, start, log, ckpt, watch, progress,
                                       on_round, acc, loss, log_line)
    if progress is not None:
        progress.close()
    if ckpt is not None:
        ckpt.close()
    summary = {
        "name": cfg.name,
        "test_accuracy": acc,
        "test_loss": loss,
        "final_train_loss": log.rows[-1]["train_loss"],
        "rounds": rounds,
        "num_clients": sim.num_clients,
        "clients_per_round": cfg.training.clients_per_round,
        "model": cfg.model.name,
        "dataset": cfg.data.dataset,
        "client_parallelism": sim.strategy,
        "seed": cfg.seed,
        "seconds": time.perf_counter() - t_start,
        "peak_rss_mb": peak_rss_mb(),
        # the code, JAX and device the numbers came from (same config and seed on
        # another of these can differ in the last bits, which training amplifies)
        "environment": environment(),
    }
    for key in ("epsilon", "delta", "leakage_total"):
        if key in log.rows[-1]:
            summary[key] = log.rows[-1][key]
    if sim.global_mask is not None:  # pruned FL: the share of the model's weights kept
        leaves = jax.tree_util.tree_leaves(sim.global_mask)
        summary["mask_density"] = float(sum(np.sum(np.asarray(m)) for m in leaves)
                                        / sum(m.size for m in leaves))
    if primary:
        write_json(out / "summary.json", summary)
    if primary and cfg.output.plots:
        plot_learning_curve(log.rows, out / "learning_curve.png")
    summary["final_state"] = state
    return summary


def _run_rounds(cfg, sim, state, start, log, ckpt, watch, progress, on_round, acc, loss,
                log_line):
    """Rounds ``start`` to the end; the final state and last evaluation.

    Raises:
      preemption.Preempted: SIGTERM asked to stop (after saving a checkpoint
        of the rounds done, where checkpoints are on).
    """
    rounds, every = cfg.training.rounds, cfg.output.checkpoint_every
    for r in range(start, rounds):
        state, res = sim.run_round(state, r)
        # null (not NaN, which is not JSON) for a round in which every client was skipped.
        row = {"round": r,
               "train_loss": res.train_loss if math.isfinite(res.train_loss) else None,
               "seconds": res.seconds, "clients": len(res.cohort)}
        if res.skipped_clients:
            row["skipped_clients"] = res.skipped_clients
        if (r + 1) % cfg.eval.every == 0 or r == rounds - 1:
            acc, loss = sim.evaluate(state.params)
            row["test_accuracy"], row["test_loss"] = acc, loss
        for cb in sim.round_callbacks:
            row.update(_call_round_callback(cb, r, row, state) or {})
        log.append(row)
        if on_round is not None:
            on_round(res, row)
        stop = r < rounds - 1 and watch.stop_after(r + 1)
        if ckpt is not None and ((r + 1) % every == 0 or r == rounds - 1 or stop):
            ckpt.save(r + 1, state, checkpoint.make_meta(cfg, sim, state))
        if progress is not None:
            progress.set_postfix(loss=f"{res.train_loss:.3f}",  # "nan": all skipped
                                 acc="-" if acc is None else f"{acc:.3f}")
            progress.update(1)
        if stop:
            if progress is not None:
                progress.close()
            if ckpt is not None:
                ckpt.close()  # waits for the save
            error = preemption.Preempted(r + 1, ckpt is not None)
            log_line(f"{error}", echo=False)  # the command prints it as it exits
            raise error
    return state, acc, loss


def pruning_schedule_note(cfg: Config) -> str | None:
    """A warning when ``training.rounds`` cuts the mask schedule of ``cfg.pruning``
    short (fewer masks than ``pruning.reconfigurations``: PruneFL then never
    reaches its rate p); None when the run makes every mask. Not an error: a
    finished run may be extended to more rounds later."""
    pc, rounds = cfg.pruning, cfg.training.rounds
    if pc.scheme is None or pc.reconfigurations == 1:
        return None
    made = min(pc.reconfigurations, -(-rounds // pc.reconfigure_every))
    if made == pc.reconfigurations:
        return None
    return (f"warning: pruning: {rounds} rounds make {made} of the "
            f"{pc.reconfigurations} masks pruning.reconfigurations asks for (one every "
            f"{pc.reconfigure_every} rounds, the last at round "
            f"{(pc.reconfigurations - 1) * pc.reconfigure_every}); {pc.scheme} stops short of "
            "its schedule")


def _call_round_callback(cb, round_idx: int, row: dict, state) -> dict | None:
    """``cb(round, row)``, or ``cb(round, row, state=...)`` where it takes the
    server state after the round (e.g. to report the clients' defense states)."""
    try:
        takes_state = "state" in inspect.signature(cb).parameters
    except (TypeError, ValueError):  # a callable without a signature
        takes_state = False
    return cb(round_idx, row, state=state) if takes_state else cb(round_idx, row)


def _log_line(out: Path, text: str, quiet: bool) -> None:
    """Append a line to RUN_DIR/run.log (and stderr unless quiet)."""
    with open(out / "run.log", "a") as f:
        f.write(time.strftime("%Y-%m-%d %H:%M:%S ") + text + "\n")
    if not quiet:
        print(f"fedsim: {text}", file=sys.stderr)


def _progress(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="round", file=sys.stderr, dynamic_ncols=True)
