"""``fedsim attack CONFIG``: simulate, observe chosen uploads, attack them, score.

The config is an ordinary simulation config (``configs/*.yaml``) with an
``observer`` section (which clients in which rounds the server records) and
an ``attack`` mapping::

    attack:
      name: inverting_gradients       # a key of attacks.ATTACK_REGISTRY
      grants: {batch_size: true}      # threat model: labels, batch_size,
                                      # num_examples, local_steps (default none)
      config: {iterations: 1000}      # the attack's own hyper-parameters

Every observed upload is stripped to the granted fields
(:func:`fedsim.observer.restrict`), attacked (all victims of one round in one
vmapped run where the attack supports it), and scored against the client's
true data after Hungarian matching. Writes ``RUN_DIR/attack_summary.json``
(``{"victims": [...], "mean": {mse, psnr, ssim, nmi, label_acc}, "scored" (victims
per mean: NaN scores are left out), "mean_by_round",
"seconds", ...}``) and
``RUN_DIR/attack_grid.png`` (targets above reconstructions).

With ``--grid KEY=V1,V2`` it runs a sweep (:mod:`fedsim.sweep`) of such runs
and tabulates each cell's accuracy beside its attack's means
(:func:`run_attack_sweep`).

The attack key is ``fold_in(key(seed), 0xA77AC)``: a stream of its own, so
attacking never changes the simulation's numbers. Run as
``python -m fedsim attack CONFIG`` (installed entry point) or
``python -m attacks.cli CONFIG``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import jax
import numpy as np

from fedsim import distributed
from fedsim.config import Config, ConfigError, load_config
from fedsim.observer import GRANTS, ObservedUpload, restrict
from fedsim.provenance import environment
from fedsim.suggest import did_you_mean, did_you_mean_each
from fedsim.sweep import TABLE_FIELDS

ATTACK_KEYS = ("name", "grants", "config")
ATTACK_STREAM = 0xA77AC
ATTACK_MEANS = ("psnr", "ssim", "nmi", "mse", "label_acc", "ami")  # averaged over victims


def validate_attack_section(cfg: Config) -> dict:
    """Check ``cfg.attack`` and ``cfg.observer``; return the attack section.

    Raises:
      ConfigError: naming the offending key, also one of ``attack.config``
        (the attack's ``check_config``, where it has one).
    """
    from attacks import ATTACK_REGISTRY

    section = cfg.attack
    if not isinstance(section, dict) or "name" not in section:
        raise ConfigError("config key 'attack': expected a mapping with at least 'name' "
                          f"(one of: {', '.join(sorted(ATTACK_REGISTRY))})")
    unknown = set(section) - set(ATTACK_KEYS)
    if unknown:
        raise ConfigError(f"config key 'attack': unknown key(s) {sorted(unknown)}; "
                          f"allowed: {', '.join(ATTACK_KEYS)}{did_you_mean_each(unknown, ATTACK_KEYS)}")
    if not isinstance(section["name"], str) or section["name"] not in ATTACK_REGISTRY:
        raise ConfigError(f"config key 'attack.name': {section['name']!r} is not allowed; "
                          f"allowed values: {', '.join(sorted(ATTACK_REGISTRY))}"
                          f"{did_you_mean(section['name'], ATTACK_REGISTRY)}")
    grants = section.get("grants") or {}
    if not isinstance(grants, dict) or set(grants) - set(GRANTS) or \
            not all(isinstance(v, bool) for v in grants.values()):
        unknown = set(grants) - set(GRANTS) if isinstance(grants, dict) else set()
        raise ConfigError(f"config key 'attack.grants': expected a mapping of {', '.join(GRANTS)} "
                          f"to true/false, got {grants!r}{did_you_mean_each(unknown, GRANTS)}")
    if not isinstance(section.get("config") or {}, dict):
        raise ConfigError("config key 'attack.config': expected a mapping")
    # The attack's own settings, before anything is simulated: a bad value
    # otherwise surfaced only once the observed rounds had been trained.
    check = getattr(ATTACK_REGISTRY[section["name"]], "check_config", None)
    if check is not None:
        # The run's algorithm, to the checks that read it (what a FedAvg upload
        # needs granted differs from a FedSGD one's).
        extra = ({"algorithm": cfg.training.algorithm}
                 if "algorithm" in inspect.signature(check).parameters else {})
        check(dict(section.get("config") or {}), grants, **extra)
    # After the attack's own checks, which name a bad setting more precisely.
    if not getattr(ATTACK_REGISTRY[section["name"]], "reconstructs_batch", True):
        raise ConfigError(
            f"config key 'attack.name': {section['name']!r} does not reconstruct the client's "
            "batch (it returns one image per class), and `fedsim attack` scores batch "
            "reconstructions against the client's images; call the attack's run() directly "
            "and score it with its own metric (attacks.model_inversion.class_centre_mse)")
    if cfg.data.normalize:
        # The attacks' box constraint and uniform start, and the metrics, take
        # [0, 1] images; the observed clients' images would be standardised, and
        # a [0, 1] reconstruction was scored against them (PSNR ~3 dB whatever
        # the attack recovered).
        raise ConfigError("config key 'data.normalize': true standardises the inputs, but "
                          "`fedsim attack` reconstructs and scores [0, 1] images (the attacks' "
                          "box constraint and start, PSNR/SSIM/NMI); attack a run with "
                          "data.normalize: false")
    if not cfg.observer.clients or not cfg.observer.rounds:
        raise ConfigError("config keys 'observer.clients' and 'observer.rounds' must name at "
                          "least one client and one round to attack")
    if max(cfg.observer.rounds) >= cfg.training.rounds:
        raise ConfigError(f"config key 'observer.rounds': {max(cfg.observer.rounds)} is not "
                          f"< training.rounds = {cfg.training.rounds}")
    return {"name": section["name"], "grants": grants, "config": dict(section.get("config") or {})}


def attack_uploads(uploads: list[ObservedUpload], section: dict, key) -> list[dict]:
    """Attack observed uploads (grouped by round for one vmapped run each) and score them."""
    from attacks import ATTACK_REGISTRY
    from attacks.metrics import score_batch

    fn = ATTACK_REGISTRY[section["name"]]
    by_round = defaultdict(list)
    for u in uploads:
        by_round[u.observation.round].append(u)
    results = []
    for rnd, group in sorted(by_round.items()):
        obs = [restrict(u.observation, section["grants"]) for u in group]
        k = jax.random.fold_in(key, rnd)
        t0 = time.perf_counter()
        # Each client's key is its id's, as it would be attacked alone: its
        # numbers do not depend on which other clients are observed with it.
        keys = [jax.random.fold_in(k, o.client_id) for o in obs]
        if hasattr(fn, "run_many"):
            recs = fn.run_many(obs, section["config"], keys)
        else:
            recs = [fn(o, section["config"], kc) for o, kc in zip(obs, keys)]
        seconds = (time.perf_counter() - t0) / len(group)
        for u, r in zip(group, recs):
            x_rec = np.asarray(r.x)
            if x_rec.shape != u.x.shape:
                # The batch the attack assumed is not what the client holds (a
                # traceback before): name the settings that set it.
                raise ConfigError(
                    f"attack {section['name']!r} returned x of shape {x_rec.shape} for client "
                    f"{u.observation.client_id} holding {u.x.shape}: the batch it reconstructs "
                    f"({x_rec.shape[0]}) is not the client's {u.x.shape[0]} examples; check "
                    f"attack.config.batch_size / num_examples against attack.grants and the "
                    f"data (data.examples_per_client)")
            s = score_batch(x_rec, u.x, np.asarray(r.labels), u.y).as_dict()
            results.append({"client": u.observation.client_id, "round": rnd, **s,
                            "loss": float(r.loss), "seconds": seconds,
                            # the split of this round's victims into calls: pin it with
                            # attack.config.victims_per_call to repeat the numbers exactly
                            "victims_per_call": (r.extras or {}).get("victims_per_call"),
                            # devices each call's victims were split over (attack.shard_victims)
                            "victim_devices": (r.extras or {}).get("victim_devices"),
                            # slots a closed-form attack marks as read off exactly
                            # (attacks.analytic); absent for the others
                            **({"marked_exact": int(np.sum(r.extras["exact"]))}
                               if isinstance(r.extras, dict) and "exact" in r.extras else {}),
                            "labels_true": u.y.tolist(), "labels_rec": np.asarray(r.labels).tolist(),
                            "_x": u.x, "_rec": np.clip(x_rec, 0, 1)})
    return results


def save_grid(results: list[dict], path: Path, max_images: int = 8) -> None:
    """PNG grid: per victim, up to ``max_images`` targets (top) over reconstructions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attacks.metrics import match_reconstructions

    cols = []
    for r in results:
        perm = match_reconstructions(r["_rec"], r["_x"])
        for i in range(min(max_images, len(r["_x"]))):
            cols.append((r["_x"][i], r["_rec"][perm[i]], f"c{r['client']} r{r['round']}"))
    fig, axes = plt.subplots(2, len(cols), figsize=(1.3 * len(cols), 2.8), squeeze=False)
    for j, (x, rec, title) in enumerate(cols):
        for row, img in enumerate((x, rec)):
            ax = axes[row, j]
            ax.imshow(img.squeeze(-1) if img.shape[-1] == 1 else img, cmap="gray", vmin=0, vmax=1)
            ax.axis("off")
        axes[0, j].set_title(title, fontsize=7)
    axes[0, 0].text(-0.3, 0.5, "target", transform=axes[0, 0].transAxes, rotation=90, va="center")
    axes[1, 0].text(-0.3, 0.5, "attack", transform=axes[1, 0].transAxes, rotation=90, va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _stored_uploads(cfg: Config, sim) -> tuple[list[ObservedUpload], list[int]]:
    """The observed rounds a resumed run will not simulate again, read from disk.

    ``run_simulation`` resumes from the newest checkpoint (``output.checkpoint_every``)
    and does not simulate the rounds before it again; their observed uploads
    were written to ``RUN_DIR/observations`` when they were simulated
    (:mod:`fedsim.observation_store`).

    Returns:
      The stored uploads, and the rounds they come from (empty without a
      checkpoint past an observed round).

    Raises:
      ConfigError: an observed round before the checkpoint has no readable
        stored observations; names the checkpoint, the round and what to do.
    """
    from fedsim import checkpoint, observation_store
    from fedsim.run import run_dir_for

    out = run_dir_for(cfg)
    ckpt_dir = out / "checkpoints"
    meta = checkpoint.read_meta(ckpt_dir) if cfg.output.checkpoint_every else None
    if meta is None or meta.get("config_fingerprint") not in checkpoint.accepted_fingerprints(cfg):
        return [], []  # starts from round 0, or run_simulation refuses the checkpoint by name
    ck = checkpoint.Checkpointer(ckpt_dir)
    try:
        done = ck.latest_round()
    finally:
        ck.close()
    rounds = sorted(r for r in cfg.observer.rounds if r < done)
    params_like = jax.eval_shape(sim.init_state).params
    uploads = []
    for r in rounds:
        try:
            uploads += observation_store.load_round(
                out / "observations", r, checkpoint.accepted_fingerprints(cfg), params_like,
                sim.apply_fn, sorted(cfg.observer.clients))
        except observation_store.ObservationStoreError as e:
            raise ConfigError(
                f"{ckpt_dir} holds a checkpoint after {done} rounds, past observed round {r} "
                f"(observer.rounds), and that round's stored observations cannot be read: {e}. "
                "Resuming would not simulate the round again. Delete the checkpoints or choose "
                "another output.dir to attack from the first round") from None
    return uploads, rounds


def run_attack_experiment(cfg: Config, quiet: bool = False) -> dict:
    """Simulate ``cfg``, attack its observed uploads, write the summary and grid.

    With ``output.checkpoint_every`` the observed uploads are written to
    ``RUN_DIR/observations`` as they are simulated, so a rerun resumes: it
    simulates from the newest checkpoint on and reads the observed rounds
    before it from disk. A finished run simulates nothing and attacks again,
    with the ``attack`` section as it is now (it is not in the checkpoint's
    config fingerprint).

    Returns:
      The attack summary (also written to ``RUN_DIR/attack_summary.json``).
    """
    return _simulate_and_attack(cfg, quiet)[1]


def _simulate_and_attack(cfg: Config, quiet: bool) -> tuple[dict, dict]:
    """:func:`run_attack_experiment`; the simulation's summary and the attack's."""
    from fedsim import checkpoint, observation_store
    from fedsim.results import write_json
    from fedsim.run import run_dir_for, run_simulation
    from fedsim.simulation import Simulation

    section = validate_attack_section(cfg)
    out = run_dir_for(cfg)
    primary = distributed.is_primary()  # several processes: process 0 writes, as fedsim run
    every = cfg.output.checkpoint_every
    meta = checkpoint.read_meta(out / "checkpoints") if every else None
    # No buffer donation: observations hold the round's global params, which a
    # donating round step would free before the attack reads them. A resumed
    # run keeps its strategy, as run_simulation's own simulation does.
    sim = Simulation(cfg, donate=False, strategy=(meta or {}).get("strategy"))
    uploads, stored_rounds = _stored_uploads(cfg, sim)
    fingerprint = checkpoint.config_fingerprint(cfg)

    def record(res, row):
        uploads.extend(res.observed)
        # Written before the checkpoint after this round, so no checkpoint is
        # ever past an observed round whose uploads are not on disk.
        if every and primary and res.observed:
            observation_store.save_round(out / "observations", res.observed, fingerprint)

    simulated = run_simulation(cfg, sim=sim, on_round=record, quiet=quiet)
    simulated.pop("final_state", None)
    if not uploads:
        raise ConfigError("no upload was observed: do observer.clients take part in observer.rounds?")
    if primary:
        # run_simulation has just written this attack's config.yaml: an attack
        # that now fails must not leave the last attack's numbers beside it, which
        # `fedsim report`/`compare` and a sweep (done = this file) would take for
        # this config's.
        for stale in ("attack_summary.json", "attack_grid.png"):
            (out / stale).unlink(missing_ok=True)
    t0 = time.perf_counter()
    key = jax.random.fold_in(jax.random.key(cfg.seed), ATTACK_STREAM)
    # The simulation's float32 precision for the attack too (on a GPU, XLA's
    # default would match gradients in TF32; docs/scale.md, "Precision").
    with jax.default_matmul_precision(cfg.training.matmul_precision):
        results = attack_uploads(uploads, section, key)
    seconds = time.perf_counter() - t0
    if primary:
        save_grid(results, out / "attack_grid.png")
    victims = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
    rounds = sorted({v["round"] for v in victims})
    summary = {"attack": section["name"], "grants": section["grants"], "config": section["config"],
               "victims": victims, "mean": _means(victims),
               # how many victims each mean is over: a NaN score (e.g. NMI of a
               # constant reconstruction) is left out of it
               "scored": _scored(victims), "seconds": seconds,
               # how leakage moves with training: the means of each observed round
               "mean_by_round": {str(r): _means([v for v in victims if v["round"] == r])
                                 for r in rounds},
               # observed rounds read from RUN_DIR/observations instead of simulated again
               "rounds_from_disk": stored_rounds,
               # the code, JAX, device and convolution rule the attack ran with
               # (summation order alone moved a victim's PSNR by up to 0.5 dB:
               # benchmarks/results/chu2023_attack_drift.md)
               "environment": environment()}
    if primary:
        write_json(out / "attack_summary.json", summary)
    return simulated, summary


def _means(victims: list[dict]) -> dict:
    """:data:`ATTACK_MEANS` over victims, NaNs left out (NaN where all are;
    :func:`_scored` counts the victims each is over)."""
    nan = float("nan")  # a summary written before a metric existed lacks it
    return {k: float(np.nanmean([v.get(k, nan) for v in victims])) if not all(
        np.isnan(v.get(k, nan)) for v in victims) else nan for k in ATTACK_MEANS}


def _scored(victims: list[dict]) -> dict:
    """Per :data:`ATTACK_MEANS` metric, how many victims have a number (not NaN)."""
    return {k: int(sum(not np.isnan(v.get(k, float("nan"))) for v in victims))
            for k in ATTACK_MEANS}


def _short_means(summary: dict) -> str:
    """The metrics whose mean leaves NaN-scored victims out, e.g. "nmi over 2 of 3"
    ("" if none; summaries written before ``scored`` existed give "")."""
    n = len(summary["victims"])
    short = {k: c for k, c in summary.get("scored", {}).items() if c < n}
    return ", ".join(f"{k} over {c} of {n}" for k, c in short.items())


def _left_out(summary: dict) -> str:
    """A note of the metrics whose mean leaves NaN-scored victims out ("" if none)."""
    short = _short_means(summary)
    return f" (NaN scores left out: {short})" if short else ""


# A sweep's table: the simulation's columns, then the attack's means over victims
# (and, in a cell where some mean leaves NaN-scored victims out, which and how many).
ATTACK_TABLE_FIELDS = (TABLE_FIELDS + tuple(f"attack_{k}" for k in ATTACK_MEANS)
                       + ("attack_seconds", "attack_left_out"))


def _sweep_row(simulated: dict, attacked: dict) -> dict:
    """One sweep cell's summary: the run's, plus ``attack_<mean>``, ``attack_seconds``
    and, where a mean is over fewer than all victims, ``attack_left_out``."""
    short = _short_means(attacked)
    return {**simulated, **{f"attack_{k}": attacked["mean"].get(k) for k in ATTACK_MEANS},
            "attack_seconds": attacked["seconds"], **({"attack_left_out": short} if short else {})}


def run_attack_sweep(config_path, grid_items: list[str], out_dir,
                     overrides: list[str] | None = None, log=print) -> list[dict]:
    """``fedsim sweep`` whose cells are ``fedsim attack`` runs.

    Every cell simulates, attacks and writes its ``attack_summary.json`` in
    ``SWEEP_DIR/cells/<cell>/``; the table adds the attack's means over victims
    to the run's columns: a privacy–utility curve over the grid (e.g. a
    defense's noise). A cell is done once its ``attack_summary.json`` exists;
    a cell killed while simulating resumes from its checkpoint and stored
    observations, one killed while attacking attacks again without simulating.
    Every cell's attack section is checked before any cell runs.
    """
    from fedsim.sweep import run_sweep

    def read_done(cell_dir: Path) -> dict:
        return _sweep_row(json.loads((cell_dir / "summary.json").read_text()),
                          json.loads((cell_dir / "attack_summary.json").read_text()))

    def run_cell(cfg: Config) -> dict:
        # Across processes a copy by process 0 would race the others' resume.
        started = None if distributed.joined() else start_from_a_sibling(cfg, Path(out_dir) / "cells")
        if started is not None:
            sibling, done = started
            line = f"starts from cell {sibling.name}'s simulation ({done} rounds done)"
            log(f"  {Path(cfg.output.dir).name}: {line}")
            with open(Path(cfg.output.dir) / "run.log", "a") as f:
                f.write(time.strftime("%Y-%m-%d %H:%M:%S ") + line + "\n")
        return _sweep_row(*_simulate_and_attack(cfg, quiet=True))

    rows = run_sweep(config_path, grid_items, out_dir, overrides, run_fn=run_cell,
                     log=log, done_file="attack_summary.json", read_done=read_done,
                     table_fields=ATTACK_TABLE_FIELDS, check_cell=validate_attack_section)
    if distributed.is_primary():
        from fedsim.sweep import parse_grid

        plot_privacy_utility(rows, [k for k, _ in parse_grid(grid_items)],
                             Path(out_dir) / "privacy_utility.png")
    return rows


# What a cell's simulation leaves that a resumed one reads (run_simulation, _stored_uploads).
_SIMULATION_FILES = ("checkpoints", "observations", "metrics.jsonl")


def start_from_a_sibling(cfg: Config, cells: Path) -> tuple[Path, int] | None:
    """Give a cell that has not started the simulation another cell already ran.

    Cells that differ only in ``attack`` (or in ``training.rounds``) have the
    same config fingerprint, so one's checkpoints and stored observations are
    a valid start for the other: it resumes from them and, once the
    simulation is done, only attacks. The sibling with the most rounds done,
    at most ``cfg.training.rounds``, and every observed round before them
    stored, is copied (not linked: a resumed run appends to its metrics).

    Returns:
      The cell directory copied from and its rounds done, or None (the cell
      already has checkpoints, or no sibling fits).
    """
    import shutil

    from fedsim import checkpoint, observation_store

    out = Path(cfg.output.dir)
    if (out / "checkpoints").exists() or not cells.is_dir():
        return None
    accepted, best = checkpoint.accepted_fingerprints(cfg), (0, None)
    for sibling in sorted(cells.iterdir()):
        ckpt_dir = sibling / "checkpoints"
        if sibling == out or not ckpt_dir.is_dir():
            continue
        try:
            meta = checkpoint.read_meta(ckpt_dir)
            if meta is None or meta.get("config_fingerprint") not in accepted:
                continue
            ck = checkpoint.Checkpointer(ckpt_dir)
            try:
                done = ck.latest_round() or 0
            finally:
                ck.close()
        except checkpoint.CheckpointError:
            continue  # an unreadable sibling is no start
        stored = all(observation_store.round_path(sibling / "observations", r).is_file()
                     for r in cfg.observer.rounds if r < done)
        if stored and best[0] < done <= cfg.training.rounds:
            best = (done, sibling)
    if best[1] is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    for name in _SIMULATION_FILES:
        src = best[1] / name
        if src.is_dir():
            # dirs_exist_ok: a cell killed before its first checkpoint may
            # have stored round 0 already; the sibling's copy is the same.
            shutil.copytree(src, out / name, dirs_exist_ok=True)
        elif src.is_file():
            shutil.copy2(src, out / name)
    return best[1], best[0]


def plot_privacy_utility(rows: list[dict], keys: list[str], path: Path) -> None:
    """Test accuracy against the attack's PSNR, one point per finished cell.

    Each point is labelled with its cell's grid values (``keys`` in order).
    Lower PSNR is more privacy; a defense is worth its cost where accuracy
    stays up as PSNR falls. Cells without both numbers are left out.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [r for r in rows if r.get("test_accuracy") is not None
              and np.isfinite(r.get("attack_psnr", np.nan))]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([r["attack_psnr"] for r in points], [r["test_accuracy"] for r in points])
    for r in points:
        ax.annotate(", ".join(str(r[k]) for k in keys), (r["attack_psnr"], r["test_accuracy"]),
                    fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("attack PSNR, mean over victims (dB; lower = more private)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"privacy-utility per sweep cell ({', '.join(keys)})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _cmd_attack(args) -> int:
    if args.grid:
        return _cmd_attack_sweep(args)
    if args.out is not None:
        raise ConfigError("--out names a sweep's directory: it takes --grid (a single run "
                          "writes to output.dir)")
    cfg = load_config(args.config, args.overrides)
    distributed.initialize_from_args(args)  # before anything touches a device
    summary = run_attack_experiment(cfg, quiet=args.quiet)
    if not distributed.is_primary():
        return 0
    m = summary["mean"]
    for v in summary["victims"]:
        print(f"client {v['client']:4d} round {v['round']:3d}: PSNR {v['psnr']:6.2f} dB  SSIM "
              f"{v['ssim']:.3f}  MSE {v['mse']:.2e}  label acc {v['label_acc']:.2f}")
    if len(summary["mean_by_round"]) > 1:
        for r, mr in summary["mean_by_round"].items():
            print(f"round {int(r):3d} mean: PSNR {mr['psnr']:6.2f} dB  SSIM {mr['ssim']:.3f}  "
                  f"NMI {mr['nmi']:.3f}  MSE {mr['mse']:.2e}")
    print(f"mean over {len(summary['victims'])} victims: PSNR {m['psnr']:.2f} dB, SSIM {m['ssim']:.3f}, "
          f"NMI {m['nmi']:.3f} (AMI {m['ami']:.3f}), MSE {m['mse']:.2e}, "
          f"label acc {m['label_acc']:.2f} "
          f"({summary['seconds']:.1f} s attacking){_left_out(summary)}")
    from fedsim.run import run_dir_for

    if summary["rounds_from_disk"]:
        print(f"observed rounds {summary['rounds_from_disk']} were read from "
              f"{run_dir_for(cfg)}/observations (not simulated again)", file=sys.stderr)
    print(f"wrote {run_dir_for(cfg)}/attack_summary.json and attack_grid.png", file=sys.stderr)
    return 0


def _cmd_attack_sweep(args) -> int:
    from fedsim.cli import run_sweep_command

    return run_sweep_command(args, run_attack_sweep)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config with observer and attack sections "
                                  "(e.g. configs/attack_quickstart.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (e.g. attack.config.iterations=200)")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="run a sweep of attack runs over this grid axis (repeatable; KEY as "
                        "for --set, or defenses[i].PARAM), as `fedsim sweep` does")
    p.add_argument("--out", default=None,
                   help="the sweep's directory, with --grid (default sweeps/<config name>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    distributed.add_arguments(p)
    p.set_defaults(func=_cmd_attack)


def register(subparsers) -> None:
    """Entry point (``fedsim.commands``): add the ``attack`` sub-command."""
    _add_arguments(subparsers.add_parser(
        "attack", help="simulate, attack observed uploads, score the reconstructions"))


def main(argv: list[str] | None = None) -> int:
    """``python -m attacks.cli CONFIG [--set k=v ...]``."""
    p = argparse.ArgumentParser(prog="python -m attacks.cli", description=__doc__.splitlines()[0])
    _add_arguments(p)
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ValueError, FloatingPointError) as e:
        print(f"attack: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
