"""Sweeps: run a grid of configs, skip finished cells, resume partial ones.

``fedsim sweep CONFIG --grid KEY=V1,V2 [--grid ...]`` runs the Cartesian
product of the grid values over the base config. Keys are the ``--set`` keys
(dotted paths or unique leaf names, e.g. ``seed``, ``model.name``) plus
``defenses[i].PARAM`` for a defense hyper-parameter (e.g. PriPrune's κ:
``defenses[0].kappa=0.1,0.3``). Values are parsed as YAML.

Each cell runs in ``SWEEP_DIR/cells/<cell-name>/`` with checkpoints every
round (unless the config sets ``output.checkpoint_every``), so:

* a cell whose ``summary.json`` exists is finished and skipped;
* a cell killed mid-way resumes from its last checkpoint;
* a cell that fails (bad value, NaN) is recorded as failed with its error and
  the sweep goes on.

After every cell the table ``SWEEP_DIR/results.json`` and ``results.md`` is
rewritten atomically (temporary file + rename), like every cell's own
``summary.json``, so no reader ever sees a half-written result.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from pathlib import Path

from fedsim.config import (Config, ConfigError, apply_overrides, from_dict, read_raw_config,
                           validate, yaml_load)
from fedsim.preemption import Preempted
from fedsim.results import atomic_write_text, finite_number, write_json

TABLE_FIELDS = ("test_accuracy", "test_loss", "final_train_loss", "epsilon", "leakage_total",
                "client_parallelism", "seconds")
_DEFENSE_KEY = re.compile(r"^defenses\[(\d+)\]\.(\w+)$")


def parse_grid(items: list[str]) -> list[tuple[str, list]]:
    """``["seed=0,1", "model.name=mlp,lenet5"]`` -> [(key, [values]), ...].

    Raises:
      ConfigError: an item without ``=`` or without values, a repeated key or
        value, or a key the sweep sets itself (:data:`SWEEP_SETS`).
    """
    grid, seen = [], set()
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--grid {item!r}: expected KEY=V1,V2,...")
        key, text = (s.strip() for s in item.split("=", 1))
        values = [v.strip() for v in text.split(",") if v.strip()]
        if not key or not values:
            raise ConfigError(f"--grid {item!r}: expected KEY=V1,V2,... with at least one value")
        if key in seen:
            raise ConfigError(f"--grid: key {key!r} given twice")
        if key in SWEEP_SETS:
            raise ConfigError(f"--grid {key}: the sweep sets it for every cell "
                              f"({SWEEP_SETS[key]}), so a grid over it would be ignored")
        seen.add(key)
        parsed = [yaml_load(v) for v in values]
        repeated = [v for i, v in enumerate(parsed) if v in parsed[:i]]
        if repeated:  # the second cell would be the first one's, skipped as done
            raise ConfigError(f"--grid {key}: value {repeated[0]!r} given twice")
        grid.append((key, parsed))
    return grid


#: Config keys the sweep sets in every cell (:func:`cell_config`), which a grid
#: therefore cannot vary.
SWEEP_SETS = {"output.dir": "OUT/cells/<cell>", "output.progress": "false"}


def cell_name(assignment: dict) -> str:
    """A file-system-safe, readable, unique name for one grid cell."""
    text = "__".join(f"{k}={v}" for k, v in assignment.items())
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", text) or "base"


def cell_config(raw: dict, assignment: dict, out_dir: Path, name: str) -> Config:
    """The validated config of one cell (its own output dir, checkpointed)."""
    raw = json.loads(json.dumps(raw))  # deep copy of plain YAML data
    plain = []
    for key, value in assignment.items():
        m = _DEFENSE_KEY.match(key)
        if m:
            i, param = int(m.group(1)), m.group(2)
            defs = raw.get("defenses") or []
            if i >= len(defs) or not isinstance(defs[i], dict):
                raise ConfigError(f"--grid {key}: the config has no defenses[{i}]")
            defs[i][param] = value
        else:
            plain.append(f"{key}={json.dumps(value) if not isinstance(value, str) else value}")
    raw = apply_overrides(raw, plain)
    raw["name"] = f"{raw.get('name', 'sweep')}-{name}"
    out = raw.setdefault("output", {})
    out["dir"] = str(out_dir / "cells" / name)
    out.setdefault("checkpoint_every", 1)
    out["progress"] = False
    cfg = from_dict(Config, raw)
    validate(cfg)
    return cfg


def run_sweep(config_path, grid_items: list[str], out_dir, overrides: list[str] | None = None,
              run_fn=None, log=print, *, done_file: str = "summary.json", read_done=None,
              table_fields: tuple[str, ...] = TABLE_FIELDS, check_cell=None) -> list[dict]:
    """Run every cell of the grid; returns the table rows (also written to disk).

    Args:
      config_path: base YAML config.
      grid_items: ``KEY=V1,V2`` strings.
      out_dir: the sweep directory.
      overrides: ``--set`` overrides applied to every cell.
      run_fn: ``run_fn(cfg) -> summary`` (default :func:`fedsim.run.run_simulation`).
      log: where the per-cell progress lines go.
      done_file: the file in a cell's directory whose presence marks the cell
        finished (``run_fn`` writes it last).
      read_done: ``read_done(cell_dir) -> summary`` of a finished cell (default:
        its ``summary.json``).
      table_fields: the summary keys the table shows.
      check_cell: ``check_cell(cfg)`` raises ``ConfigError`` for a cell that
        cannot run; called on every cell before any runs.

    In a multi-process run (:mod:`fedsim.distributed`) every process runs every
    cell, process 0 decides which cells are done, and only it logs and writes
    the table. After each cell the processes compare how it ended: a failure
    they all share (the same message) is recorded and the sweep goes on, as in
    one process; a cell that failed in some processes only ends the sweep.

    Raises:
      fedsim.distributed.PeerFailure: a cell ended differently in the processes
        (recorded as failed in the table first).
    """
    from fedsim import distributed
    from fedsim.run import run_simulation

    run_fn = run_fn or (lambda cfg: run_simulation(cfg, quiet=True))
    read_done = read_done or (lambda cell_dir: json.loads((cell_dir / "summary.json").read_text()))
    primary = distributed.is_primary()
    raw = apply_overrides(read_raw_config(config_path), overrides or [])
    grid = parse_grid(grid_items)
    keys = [k for k, _ in grid]
    out_dir = Path(out_dir)
    cells = [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in grid))]
    configs = [(a, cell_name(a)) for a in cells]
    # Validate every cell before running any, so a typo fails fast.
    built = [(a, n, cell_config(raw, a, out_dir, n)) for a, n in configs]
    for _, _, cfg in built:
        if check_cell is not None:
            check_cell(cfg)
    rows = []
    for i, (assignment, name, cfg) in enumerate(built):
        done_path = Path(cfg.output.dir) / done_file
        row = {"cell": name, **assignment}
        error = stop = None
        # Across processes, process 0's view decides, so that no process skips a
        # cell the others train (and waits on their collectives forever).
        if distributed.agree(done_path.exists()):
            status = "done (skipped)"
            summary = read_done(done_path.parent) if done_path.exists() else {}
        else:
            try:
                summary = run_fn(cfg)
                summary.pop("final_state", None)
            except Preempted:  # SIGTERM stops the sweep; a rerun resumes this cell
                raise
            except Exception as e:  # one bad cell must not kill the sweep
                error, summary = f"{type(e).__name__}: {str(e)[:200]}", {}
            status = "done" if error is None else f"failed: {error}"
            try:  # a cell that failed in some processes only leaves them out of step
                distributed.check_in_step(f"sweep cell {name}", error)
            except distributed.PeerFailure as e:
                stop, status, summary = e, f"failed: {e}", {}
        row["status"] = status
        row.update({k: summary[k] for k in table_fields if k in summary})
        rows.append(row)
        if primary:  # the process that writes the cells' run directories
            log(f"[{i + 1}/{len(built)}] {name}: {status}")
            write_table(out_dir, keys, rows, table_fields)
        if stop is not None:
            raise stop
    if primary and built and built[0][2].output.plots:
        plot_cells(out_dir, [Path(cfg.output.dir) for _, _, cfg in built])
    return rows


def plot_cells(out_dir: Path, cell_dirs: list[Path]) -> None:
    """``OUT/learning_curves.png``: every cell's test accuracy and train loss per round
    (:func:`fedsim.compare.plot_learning_curves`), for the cells that have rows."""
    from fedsim.compare import load_run, plot_learning_curves

    dirs = [d for d in cell_dirs if (d / "metrics.jsonl").is_file()]
    if dirs:
        plot_learning_curves([d.name for d in dirs], [load_run(d) for d in dirs],
                             Path(out_dir) / "learning_curves.png")


def over_seeds(keys: list[str], rows: list[dict],
               table_fields: tuple[str, ...] = TABLE_FIELDS) -> list[dict]:
    """Each numeric field's mean, sample standard deviation and count over the seeds.

    One entry per setting of the grid's other keys (in the order the cells
    ran), over its finished cells; empty unless ``seed`` is a grid key with
    at least two values. A field a cell lacks, or holds as NaN/inf, is left
    out of that cell's count.
    """
    if "seed" not in keys or len({r["seed"] for r in rows}) < 2:
        return []
    others = [k for k in keys if k != "seed"]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(json.dumps([r[k] for k in others]), []).append(r)
    entries = []
    for members in groups.values():
        done = [m for m in members if m["status"].startswith("done")]
        entry = {**{k: members[0][k] for k in others}, "cells": len(members), "done": len(done)}
        for field in table_fields:
            values = [m[field] for m in done if finite_number(m.get(field)) is not None]
            if values:
                entry[field] = {"mean": statistics.fmean(values), "n": len(values),
                                "std": statistics.stdev(values) if len(values) > 1 else None}
        entries.append(entry)
    return entries


def write_table(out_dir: Path, keys: list[str], rows: list[dict],
                table_fields: tuple[str, ...] = TABLE_FIELDS) -> None:
    """results.json and results.md of the sweep (atomic).

    With a ``seed`` axis, both also summarise every other setting over its
    seeds (:func:`over_seeds`): ``over_seeds`` in the JSON, a second table in
    the markdown.
    """
    seeds = over_seeds(keys, rows, table_fields)
    write_json(out_dir / "results.json", {"grid_keys": keys, "rows": rows,
                                          **({"over_seeds": seeds} if seeds else {})})
    cols = ["cell", *keys, "status", *[f for f in table_fields if any(f in r for r in rows)]]
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))
    lines = ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    if seeds:
        fields = [f for f in table_fields if any(f in e for e in seeds)]
        cols = [k for k in keys if k != "seed"] + ["done / cells", *fields]
        stat = lambda d: ("" if d is None else f"{d['mean']:.4g}" + (
            "" if d["std"] is None else f" ± {d['std']:.2g}") + f" ({d['n']})")
        lines += ["", "Over seeds: mean ± sample standard deviation (finished cells counted)", "",
                  "| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
        lines += ["| " + " | ".join([*(fmt(e[k]) for k in keys if k != "seed"),
                                     f"{e['done']} / {e['cells']}",
                                     *(stat(e.get(f)) for f in fields)]) + " |" for e in seeds]
    atomic_write_text(out_dir / "results.md", "\n".join(lines) + "\n")
