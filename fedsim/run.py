"""Run a configured simulation end to end, writing the run directory."""

from __future__ import annotations

import inspect
import json
import math
import resource
import sys
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedsim import checkpoint, distributed, preemption
from fedsim.config import Config, dump_config
from fedsim.provenance import environment
from fedsim.results import (MetricsLog, OutputPathError, RunFileError, atomic_write_text, make_dir,
                            plot_learning_curve, read_metrics, write_json)
from fedsim.simulation import NonFiniteError, RoundResult, Simulation


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
      sim: a prebuilt simulation (else built from cfg), built from ``cfg`` up to
        the keys the config fingerprint leaves out (another config is refused:
        its numbers would be recorded as cfg's). A
        checkpoint written under defenses given to it by hand
        (``Simulation(defenses=...)``) resumes only under defenses of the same
        specs (:func:`fedsim.checkpoint.check_hand_defenses`); the run's
        config.yaml, run.log and summary.json name them.
      on_round: called after each round with its result and metrics row (the
        attack harness uses it to receive observed uploads).
      quiet: no progress bar.

    Nothing in the run directory but ``run.log`` changes before the checkpoint
    (if any) is accepted. A run that trains a round first deletes the files a
    finished run leaves (:data:`STALE_ON_RERUN`), so only a run that ends has
    a ``summary.json``.

    Returns:
      The summary dict (also written to RUN_DIR/summary.json).

    Raises:
      OutputPathError: ``output.dir`` cannot be a directory (names it).
      CheckpointError: a checkpoint of another config or other hand-given
        defenses, unreadable, or with more rounds done than ``training.rounds``.
      ValueError: ``sim`` built from another config than ``cfg`` (names the keys).
      RunFileError: metrics.jsonl lacks rows of rounds the checkpoint has done.
      NonFiniteError: NaN/Inf from a client, the server step or an evaluation.
      preemption.Preempted: SIGTERM asked to stop.
    """
    if sim is not None and (checkpoint.config_fingerprint(sim.cfg)
                            != checkpoint.config_fingerprint(cfg)):
        # Keys the fingerprint leaves out (output.*, name, attack, training.rounds)
        # change no number of the simulation, so they may differ.
        raise ValueError(f"run_simulation: sim was built from another config than cfg "
                         f"(they differ in {', '.join(_differing_keys(sim.cfg, cfg))}); its "
                         "numbers would be recorded under cfg")
    t_start = time.perf_counter()
    out = run_dir_for(cfg)
    primary = distributed.is_primary()
    quiet = quiet or not primary
    ckpt_dir = out / "checkpoints"
    if primary:
        make_dir(out, "output.dir")
        # The files a run writes or reads there must be files (and checkpoints a
        # directory): one that is not ended in an IsADirectoryError or orbax's
        # NotADirectoryError, after the simulation was built.
        for name in ("config.yaml", "metrics.jsonl", "summary.json", "run.log"):
            if (out / name).is_dir():
                raise OutputPathError(f"output.dir {out}: {name} there is a directory, not the "
                                      "run's file; move it away or choose another output.dir")
        if cfg.output.checkpoint_every and ckpt_dir.exists() and not ckpt_dir.is_dir():
            raise OutputPathError(f"output.dir {out}: checkpoints there is a file, not the run's "
                                  "checkpoint directory; move it away or choose another output.dir")
    every = cfg.output.checkpoint_every
    rounds = cfg.training.rounds
    meta = checkpoint.read_meta(ckpt_dir) if every else None
    # A resumed run keeps the strategy it started with (same numbers).
    sim = sim or Simulation(cfg, donate=True, strategy=(meta or {}).get("strategy"))
    log_line = ((lambda text, echo=True: _log_line(out, text, quiet or not echo)) if primary
                else (lambda text, echo=True: None))
    log_line(sim.strategy_reason)
    if sim.memory_note is not None:
        log_line(sim.memory_note)
    note = pruning_schedule_note(cfg)
    if note is not None:
        log_line(note)
    state, start = sim.init_state(), 0
    ckpt = checkpoint.Checkpointer(ckpt_dir) if every else None
    if meta is not None:
        try:
            state, meta = ckpt.restore(state, checkpoint.accepted_fingerprints(cfg))
            checkpoint.check_hand_defenses(meta, sim, ckpt_dir)
            start = int(state.round)
            _check_resumable(out, ckpt_dir, start, rounds)
            _check_rows_kept(out / "metrics.jsonl", ckpt_dir, start)
        except BaseException:
            ckpt.close()
            raise
        sim.adopt(state)  # a pruning mask re-made before the checkpoint
        checkpoint.load_callback_states(sim.round_callbacks, meta.get("callbacks"))
    # Only now, with the checkpoint accepted, does this config own the run
    # directory: a refused rerun used to leave its config.yaml beside the
    # finished run's checkpoints, metrics and summary.
    if primary:
        if start < rounds:
            _drop_stale_results(out)  # before a new row is written
        atomic_write_text(out / "config.yaml", _hand_defenses_comment(sim) + dump_config(cfg))
    hand = checkpoint.hand_defense_names(sim)
    if hand:
        log_line("defenses given by hand, not in config.yaml: "
                 + ", ".join(f"{stage}: {name}" for stage, name in hand.items()))
    if meta is not None:
        log_line(f"resumed from {ckpt_dir}: {start} rounds done")
    log = MetricsLog(out / "metrics.jsonl", keep_rounds_below=start if start else None,
                     write=primary)
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
    kept = _kept_summary(out) if primary and start >= rounds else None
    if kept is not None:
        # A finished run run again trains no round: its summary stays as the
        # training wrote it. Rewritten, it held this command's few seconds and
        # its environment, which trained nothing (`fedsim compare` shows both).
        kept["final_state"] = state
        return kept
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
        # what the final model's floats are, read off it (training.dtype asks)
        "params_dtype": ",".join(sorted({str(a.dtype) for a in jax.tree_util.tree_leaves(
            state.params) if jnp.issubdtype(a.dtype, jnp.floating)})),
        # this command's time and the rounds it trained (fewer than "rounds"
        # where it resumed from a checkpoint)
        "seconds": time.perf_counter() - t_start,
        "rounds_trained": rounds - start,
        "peak_rss_mb": peak_rss_mb(),
        # the code, JAX and device the numbers came from (same config and seed on
        # another of these can differ in the last bits, which training amplifies)
        "environment": environment(),
    }
    for key in ("epsilon", "delta", "client_level_epsilon", "client_level_delta",
                "local_epsilon", "local_delta", "leakage_total", "adaptive_clip_norm"):
        if key in log.rows[-1]:
            summary[key] = log.rows[-1][key]
    if hand:  # in no config: the summary is the only record of what ran
        summary["hand_defenses"] = hand
        summary["hand_defense_specs"] = checkpoint.hand_defense_specs(sim)
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


def _hand_defenses_comment(sim) -> str:
    """YAML comment lines naming the defenses ``sim`` was given by hand ("" for
    none): config.yaml alone would read as a run without them, and a rerun of it
    would be one."""
    hand = checkpoint.hand_defense_names(sim)
    if not hand:
        return ""
    lines = ["# This run's defenses were given by hand (Simulation(defenses=...)), not by",
             "# this config; a run of this file alone runs without them:",
             *(f"#   {stage}: {name}" for stage, name in hand.items()),
             "# summary.json's hand_defense_specs says what each was built from."]
    return "\n".join(lines) + "\n"


#: What a run writes from its rounds' results once they are done, and the attack
#: harness (attacks/cli.py) after it: stale as soon as a rerun trains a round.
#: ``summary.json`` (``attack_summary.json`` for an attack run) also marks a run
#: (a sweep's cell) as finished.
STALE_ON_RERUN = ("summary.json", "learning_curve.png", "attack_summary.json",
                  "attack_grid.png")


def _differing_keys(a: Config, b: Config) -> list[str]:
    """The dotted config keys whose values differ between ``a`` and ``b``."""
    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            if isinstance(v, dict) and v:
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    fa, fb = flat(a.to_dict()), flat(b.to_dict())
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))


def _kept_summary(out: Path) -> dict | None:
    """The ``summary.json`` a finished run left in ``out``, or None where there
    is none to keep (missing, or not a JSON object: then it is written anew)."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def _drop_stale_results(out: Path) -> None:
    """Delete the files of :data:`STALE_ON_RERUN` in run directory ``out``.

    Called before a (re)run writes the row of a round the files do not
    cover: a rerun from round 0 used to empty metrics.jsonl and leave the old
    run's summary.json beside it, and if it failed, ``fedsim compare`` called
    it finished and a sweep skipped it as done. Each unlink is atomic, and the
    new run writes its own files when it ends.
    """
    for name in STALE_ON_RERUN:
        (out / name).unlink(missing_ok=True)


def _check_resumable(out: Path, ckpt_dir: Path, done: int, rounds: int) -> None:
    """Refuse a checkpoint past ``training.rounds``.

    A run cannot be shortened: nothing would train, and the summary would
    call the longer run's results those of ``rounds`` rounds (orbax keeps only
    the newest checkpoints, so the one of round ``rounds`` is usually gone).

    Raises:
      CheckpointError: naming ``training.rounds``, the checkpoint and the run
        directory.
    """
    if done > rounds:
        raise checkpoint.CheckpointError(
            f"training.rounds is {rounds}, but the checkpoint {ckpt_dir / str(done)} of run "
            f"directory {out} has {done} rounds done: a run cannot be shortened. Set "
            f"training.rounds to {done} or more, use another output.dir, or delete the "
            "checkpoints to start over")


def _check_rows_kept(path: Path, ckpt_dir: Path, done: int) -> None:
    """Check that metrics file ``path`` has the rows of every round a checkpoint did.

    A resumed run trains only the rounds after the checkpoint; the rows
    before come from the file. Without this, a lost metrics.jsonl ended in a
    bare IndexError, and a run extended past it wrote a metrics.jsonl and a
    summary without those rounds.

    Raises:
      RunFileError: naming the file, the missing rounds and the checkpoint.
    """
    have = {row["round"] for row in read_metrics(path)}
    missing = [r for r in range(done) if r not in have]
    if not missing:
        return
    shown = ", ".join(map(str, missing[:10])) + (f", ... ({len(missing)} in all)"
                                                 if len(missing) > 10 else "")
    rows = f"rows of rounds {shown}" if len(missing) > 1 else f"row of round {shown}"
    raise RunFileError(
        f"{path} lacks the {rows}{'' if path.exists() else ' (the file does not exist)'}, "
        f"which the checkpoint {ckpt_dir / str(done)} has done: a resumed run trains only the "
        "rounds after it, so the metrics and the summary would leave them out. Restore the "
        f"file, or delete {ckpt_dir} to start over")


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
            _check_evaluation(cfg, r, acc, loss)  # before the row: no Infinity in the files
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


def _check_evaluation(cfg: Config, round_idx: int, acc: float, loss: float) -> None:
    """Stop a run whose global model evaluates to NaN/Inf.

    The engine stops a round whose server step makes the params NaN/Inf
    (:meth:`Simulation.run_round`); finite params can still be so large that
    the model's outputs overflow (server_lr 1e38 left weights near 1e37). Such
    a run used to end with exit 0 and ``"test_loss": Infinity`` in
    metrics.jsonl and summary.json (not JSON that strict parsers read).

    Raises:
      NonFiniteError: naming the round and the settings that move the model.
    """
    if math.isfinite(acc) and math.isfinite(loss):
        return
    t = cfg.training
    raise NonFiniteError(
        f"round {round_idx}: evaluating the global model after the round gave test loss "
        f"{loss} (accuracy {acc}): its weights are so large that its outputs overflow. The "
        f"server step moved it too far: lower training.server_lr ({t.server_lr}, "
        f"training.server_optimizer {t.server_optimizer}) or training.lr ({t.lr})")


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
