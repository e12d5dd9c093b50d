"""Sweeps: run a grid of configs, skip finished cells, resume partial ones.

``fedsim sweep CONFIG --grid KEY=V1,V2 [--grid ...]`` runs the Cartesian
product of the grid values over the base config. Keys are the ``--set`` keys
(dotted paths or unique leaf names, e.g. ``seed``, ``model.name``, and
``defenses[i].PARAM`` for a defense hyper-parameter, e.g. PriPrune's κ:
``defenses[0].kappa=0.1,0.3``). Values are parsed as YAML and separated by
commas outside brackets and quotes (``observer.clients=[0,1],[2,3]``).

Each cell runs in ``SWEEP_DIR/cells/<cell-name>/`` with checkpoints every
round (unless the config sets ``output.checkpoint_every``), so:

* a cell whose ``summary.json`` exists is finished and skipped, provided the
  config it recorded (its ``config.yaml``) is this cell's config; a finished
  cell whose config differs (another base config, ``--set`` or code default)
  is refused by name (:func:`recorded_config_differences`), since its numbers
  would be reported as the new config's;
* a cell killed mid-way resumes from its last checkpoint;
* a cell that fails (bad value, NaN) is recorded as failed with its error and
  the sweep goes on.

After every cell the table ``SWEEP_DIR/results.json`` and ``results.md`` is
rewritten atomically (temporary file + rename), like every cell's own
``summary.json``, so no reader ever sees a half-written result.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import re
import statistics
from pathlib import Path

import yaml

from fedsim.config import (DEFENSE_KEY, Config, ConfigError, apply_overrides, from_dict,
                           read_raw_config, set_defense_param, validate, yaml_load)
from fedsim import preemption
from fedsim.preemption import Preempted
from fedsim.results import atomic_write_text, finite_number, write_json

# A column shows only where some cell's summary has the field (write_table).
TABLE_FIELDS = ("test_accuracy", "test_loss", "final_train_loss", "epsilon",
                "client_level_epsilon", "local_epsilon", "adaptive_clip_norm", "leakage_total",
                "client_parallelism", "seconds")


def parse_grid(items: list[str]) -> list[tuple[str, list]]:
    """``["seed=0,1", "model.name=mlp,lenet5"]`` -> [(key, [values]), ...].

    Keys are returned as given (they name the cells and the table's columns),
    but compared by the config key they stand for (:func:`canonical_key`), so
    ``lr`` next to ``training.lr`` is a repeated key and ``dir`` is refused as
    ``output.dir`` is. Values are split on commas, except inside brackets or
    quotes: ``observer.clients=[0,1],[2,3]`` has two list values.

    Raises:
      ConfigError: an item without ``=`` or without values, an unknown key, a
        repeated key or value, a value that is not valid YAML, or a key the
        sweep sets itself (:data:`SWEEP_SETS`).
    """
    grid, seen = [], {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--grid {item!r}: expected KEY=V1,V2,...")
        key, text = (s.strip() for s in item.split("=", 1))
        if not key:
            raise ConfigError(f"--grid {item!r}: expected KEY=V1,V2,... with at least one value")
        canonical = canonical_key(key)
        if canonical in seen:
            if seen[canonical] == key:
                raise ConfigError(f"--grid: key {key!r} given twice")
            raise ConfigError(f"--grid: keys {seen[canonical]!r} and {key!r} both set "
                              f"{canonical}")
        if canonical in SWEEP_SETS:
            raise ConfigError(f"--grid {key}: the sweep sets it for every cell ({canonical} = "
                              f"{SWEEP_SETS[canonical]}), so a grid over it would be ignored")
        seen[canonical] = key
        parsed = _grid_values(key, text)
        if not parsed:
            raise ConfigError(f"--grid {item!r}: expected KEY=V1,V2,... with at least one value")
        repeated = [v for i, v in enumerate(parsed) if v in parsed[:i]]
        if repeated:  # the second cell would be the first one's, skipped as done
            raise ConfigError(f"--grid {key}: value {repeated[0]!r} given twice")
        grid.append((key, parsed))
    return grid


def canonical_key(key: str) -> str:
    """The dotted config key that grid key ``key`` sets (``lr`` -> ``training.lr``).

    Resolved as ``--set`` resolves it (:func:`fedsim.config.apply_overrides`),
    so the two cannot disagree; ``defenses[i].PARAM`` is its own canonical form.

    Raises:
      ConfigError: an unknown key, naming it as a ``--grid`` key.
    """
    if DEFENSE_KEY.match(key):
        return key
    try:
        node = apply_overrides({}, [f"{key}=0"])
    except ConfigError as e:
        # apply_overrides words it for --set; the user typed --grid.
        raise ConfigError(re.sub(r"^--set ", "--grid ", str(e))) from None
    parts = []
    while isinstance(node, dict) and len(node) == 1:  # the one path it created
        (part, node), = node.items()
        parts.append(part)
    return ".".join(parts)


def _grid_values(key: str, text: str) -> list:
    """The YAML values of one ``--grid`` axis, split on the commas between them.

    A value that opens a bracket or a quote takes in the following pieces
    until it parses, so list, mapping and quoted values may hold commas.

    Raises:
      ConfigError: a value that is not valid YAML, naming the key.
    """
    if not text.strip():
        return []
    pieces, values, i = text.split(","), [], 0
    while i < len(pieces):
        item, i = pieces[i], i + 1
        while item.strip()[:1] in ("[", "{", "'", '"') and i < len(pieces) \
                and not _is_yaml(item):
            item, i = item + "," + pieces[i], i + 1
        item = item.strip()
        if not item:
            # Was dropped: "seed=0," swept one seed without a word.
            raise ConfigError(f"--grid {key}: an empty value in {text!r} (a stray comma?); "
                              "write null for a null value")
        try:
            values.append(yaml_load(item))
        except yaml.YAMLError as e:
            raise ConfigError(
                f"--grid {key}: value {item!r} is not valid YAML ({str(e).splitlines()[0]}); "
                f"values are separated by commas, and a list is written in brackets "
                f"(e.g. --grid 'observer.clients=[0,1],[2,3]')") from None
    return values


def _is_yaml(text: str) -> bool:
    try:
        yaml_load(text)
    except yaml.YAMLError:
        return False
    return True


#: Config keys the sweep sets in every cell (:func:`cell_config`), which a grid
#: therefore cannot vary.
SWEEP_SETS = {"output.dir": "OUT/cells/<cell>", "output.progress": "false"}


def cell_name(assignment: dict) -> str:
    """A file-system-safe, readable name for one grid cell.

    Characters outside ``[A-Za-z0-9_.=+-]`` become ``_``, so two cells can
    get one name (``/d/a b`` and ``/d/a_b``); :func:`cell_names` makes the
    names of a grid unique.
    """
    text = "__".join(f"{k}={v}" for k, v in assignment.items())
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", text) or "base"


def cell_names(assignments: list[dict]) -> list[str]:
    """Unique directory names for the cells of one grid.

    A name that :func:`cell_name` gives to more than one cell (compared
    without case, for case-insensitive file systems) gets a suffix hashed
    from the cell's exact values in every cell that has it. Otherwise the
    second cell would run in the first one's directory, be skipped as done
    and report the first one's numbers. Names that do not collide stay as
    they were, so an existing sweep directory is still found.

    Raises:
      ConfigError: names that still collide (not expected: the suffix
        differs for different values).
    """
    names = [cell_name(a) for a in assignments]
    counts = collections.Counter(n.casefold() for n in names)
    names = [f"{n}__{_digest(a)}" if counts[n.casefold()] > 1 else n
             for n, a in zip(names, assignments)]
    counts = collections.Counter(n.casefold() for n in names)
    clash = [n for n in names if counts[n.casefold()] > 1]
    if clash:
        raise ConfigError(f"--grid: two cells would share the directory name {clash[0]!r}")
    return names


def _digest(assignment: dict) -> str:
    text = json.dumps(list(assignment.items()), default=repr)  # str 1 != int 1
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def cell_config(raw: dict, assignment: dict, out_dir: Path, name: str) -> Config:
    """The validated config of one cell (its own output dir, checkpointed).

    Raises:
      ConfigError: an invalid cell config, naming the key; a
        ``defenses[i].PARAM`` key with no ``defenses[i]``; an ``output``
        entry that is not a mapping.
    """
    raw = json.loads(json.dumps(raw))  # deep copy of plain YAML data
    for key, value in assignment.items():
        if DEFENSE_KEY.match(key):
            set_defense_param(raw, key, value, flag="--grid")
        else:
            # The parsed value itself, not its text: written out and parsed
            # again, the string '1e5' or 'true' would come back as a number or
            # a bool.
            _set_path(raw, canonical_key(key), value)
    raw["name"] = f"{raw.get('name', 'sweep')}-{name}"
    out = raw.get("output")
    if out is None and "output" not in raw:
        out = raw["output"] = {}
    if not isinstance(out, dict):  # as `fedsim run` words it (fedsim.config.from_dict)
        raise ConfigError(f"config key 'output': expected a mapping, got {out!r}")
    out["dir"] = str(out_dir / "cells" / name)
    out.setdefault("checkpoint_every", 1)
    out["progress"] = False
    cfg = from_dict(Config, raw)
    validate(cfg)
    return cfg


def _check_cell_defenses(built) -> None:
    """Build each cell's defenses once per distinct spec, before any cell runs.

    A defense's parameters are checked when it is built: a grid value the
    defense refuses (``defenses[0].p=abc``) or a misspelt parameter used to
    fail only in its cell's run, after the cells before it had run.

    Raises:
      ConfigError: naming the cell and the defense's config key.
    """
    from fedsim.simulation import build_defenses, on_run_data

    seen = set()
    for _, name, cfg in built:
        if not cfg.defenses:
            continue
        specs = on_run_data(cfg.defenses, cfg)
        key = json.dumps(specs, sort_keys=True, default=repr)
        if key in seen:
            continue
        seen.add(key)
        try:
            build_defenses(specs)
        except ConfigError as e:
            raise ConfigError(f"sweep cell {name}: {e}") from None


def _set_path(raw: dict, dotted: str, value) -> None:
    """``raw[a][b][c] = value`` for ``"a.b.c"``, making (or replacing by) a mapping
    at every level above, as ``--set`` does (:func:`fedsim.config.apply_overrides`)."""
    node, parts = raw, dotted.split(".")
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


#: The file in a cell's directory that holds the config the cell ran with
#: (:func:`fedsim.run.run_simulation` writes it before the cell's first round).
CELL_CONFIG = "config.yaml"

#: Top-level config keys that do not change a cell's results: a label, and
#: where and how often the cell writes its files (``output.dir`` moves with
#: the sweep directory).
_NOT_COMPARED = ("name", "output")


def recorded_config_differences(cell_dir: Path, cfg: Config) -> list[tuple[str, object, object]]:
    """How the config recorded in ``cell_dir`` differs from ``cfg``.

    Compares every key but :data:`_NOT_COMPARED`, ``training.rounds``
    included (a 2-round cell is not a 4-round cell's result). Keys a recorded
    config lacks (written before they existed) take their defaults.

    Returns:
      ``(key, recorded, now)`` per differing key, with ``defenses[i].PARAM``
      for a defense argument and ``(absent)`` for a side that lacks the key;
      empty when the configs agree.

    Raises:
      ConfigError: ``cell_dir`` has no readable :data:`CELL_CONFIG`.
    """
    path = Path(cell_dir) / CELL_CONFIG
    try:
        # safe_load, not yaml_load: the file is yaml.safe_dump's output
        # (fedsim.config.dump_config), which round-trips exactly through it.
        recorded = from_dict(Config, yaml.safe_load(path.read_text()) or {})
    except FileNotFoundError:
        raise ConfigError(f"{path} is missing, so the config that produced the cell's "
                          f"results cannot be checked") from None
    except (OSError, yaml.YAMLError, ConfigError) as e:
        raise ConfigError(f"{path} cannot be read as a config: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    before, now = (_flatten({k: v for k, v in c.to_dict().items() if k not in _NOT_COMPARED})
                   for c in (recorded, cfg))
    diffs = []
    for key in [*now, *(k for k in before if k not in now)]:
        old, new = before.get(key, _ABSENT), now.get(key, _ABSENT)
        if not _same(old, new):
            diffs.append((key, old, new))
    return diffs


class _Absent:
    """A key one of two configs lacks (a defense argument only one of them sets)."""

    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()


def _flatten(value, prefix: str = "") -> dict:
    """``{"a": {"b": 1}, "defenses": [{"k": 2}]}`` -> ``{"a.b": 1, "defenses[0].k": 2}``;
    lists without mappings (``observer.clients``) stay whole values."""
    if isinstance(value, dict) and value:
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def _same(a, b) -> bool:
    # 1 == 1.0 is the same setting (a defense argument written either way),
    # but True == 1 is not.
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _refuse_changed_cell(name: str, cell_dir: Path, done_file: str, cfg: Config) -> str | None:
    """Why finished cell ``name`` cannot stand for ``cfg``, or None if it can."""
    fix = f"use another --out, or delete {cell_dir} to run the cell again"
    try:
        diffs = recorded_config_differences(cell_dir, cfg)
    except ConfigError as e:
        return f"sweep cell {name!r} is finished ({done_file}), but {e}: {fix}"
    if not diffs:
        return None
    shown = "; ".join(f"{k}: {old!r} there, {new!r} now" for k, old, new in diffs[:6])
    more = f"; and {len(diffs) - 6} more" if len(diffs) > 6 else ""
    return (f"sweep cell {name!r} finished under another config than this sweep gives it "
            f"({shown}{more}; recorded in {cell_dir / CELL_CONFIG}). Its results would be "
            f"reported as this config's: {fix}")


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

    A cell is done when ``done_file`` exists and the config ``run_fn`` recorded
    in the cell's :data:`CELL_CONFIG` (as :func:`fedsim.run.run_simulation`
    does) is the cell's config now, up to ``name`` and ``output``.

    In a multi-process run (:mod:`fedsim.distributed`) every process runs every
    cell, process 0 decides which cells are done, and only it logs and writes
    the table. After each cell the processes compare how it ended: a failure
    they all share (the same message) is recorded and the sweep goes on, as in
    one process; a cell that failed in some processes only ends the sweep.

    Raises:
      ConfigError: an invalid cell, or a finished cell whose recorded config
        differs from its config now (or cannot be read), naming the cell and
        the differing keys; raised before any cell runs.
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
    _check_sweep_dir(out_dir)
    cells = [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in grid))]
    configs = list(zip(cells, cell_names(cells)))
    # Validate every cell before running any, so a typo fails fast.
    built = [(a, n, cell_config(raw, a, out_dir, n)) for a, n in configs]
    from fedsim.simulation import check_float64

    for _, _, cfg in built:
        check_float64(cfg)  # a float64 cell needs JAX_ENABLE_X64=1: said before any cell runs
        if check_cell is not None:
            check_cell(cfg)
    _check_cell_defenses(built)
    # A finished cell is reused only if it ran with its config now; another
    # base config or --set would otherwise put the old numbers in the table
    # under the new settings. Checked before any cell runs, by process 0 (the
    # one that wrote the cells), and refused in every process alike.
    refusal = None
    if primary:
        refused = [(name, why) for _, name, cfg in built
                   if (Path(cfg.output.dir) / done_file).exists()
                   and (why := _refuse_changed_cell(name, Path(cfg.output.dir), done_file, cfg))]
        if refused:  # the first in full; the others by name, to delete or keep at once
            others = [name for name, _ in refused[1:]]
            refusal = refused[0][1] + (f" ({len(others)} more finished cell(s) differ too: "
                                       f"{', '.join(others)})" if others else "")
    if distributed.agree(refusal is not None):
        raise ConfigError(refusal or "process 0 found a finished sweep cell that ran with "
                                     "another config (its error names the cell)")
    rows = []
    # SIGTERM between cells, or in a cell's last round (which its run finishes
    # rather than stop), stops the sweep before the next cell. Before, the
    # signal was swallowed and the sweep went on. Only where every cell
    # checkpoints (without, SIGTERM ends the process as before) and in one
    # process (across processes the cells' own runs stop at a sync point).
    handle = not distributed.joined() and all(cfg.output.checkpoint_every > 0
                                              for _, _, cfg in built)
    with preemption.Watch(handle_signal=handle) as watch:
        _run_cells(built, keys, rows, out_dir, run_fn, read_done, done_file, table_fields,
                   primary, log, watch if handle else None)
    if primary and built and built[0][2].output.plots:
        plot_cells(out_dir, [Path(cfg.output.dir) for _, _, cfg in built])
    return rows


def _run_cells(built, keys, rows, out_dir, run_fn, read_done, done_file, table_fields,
               primary, log, watch) -> None:
    """The loop of :func:`run_sweep` over its cells, appending to ``rows``."""
    from fedsim import distributed

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
        _release_compiled_programs_near_map_limit(i, len(built), primary, log)
        if watch is not None and i < len(built) - 1 and watch.stop_after(i + 1):
            if primary:
                log(f"stopped by SIGTERM after cell {i + 1} of {len(built)}")
            raise preemption.SweepPreempted(i + 1, len(built))


def _release_compiled_programs_near_map_limit(i: int, cells: int, primary: bool, log) -> None:
    """Drop JAX's compiled programs after cell ``i`` (not the last) where the
    process nears the kernel's limit on memory mappings
    (:func:`fedsim.memory.release_compiled_programs_near_map_limit`): each cell
    compiles its own programs, and JAX keeps them all."""
    from fedsim import memory

    if i < cells - 1:
        line = memory.release_compiled_programs_near_map_limit(f"after cell {i + 1}")
        if line is not None and primary:
            log(line)


def _check_sweep_dir(out_dir: Path) -> None:
    """Refuse a sweep directory that is, or lies below, a file, before any cell runs.

    Before, every cell failed to make its run directory and writing the table
    ended in a FileExistsError traceback.

    Raises:
      OutputPathError: naming ``--out`` and the file in the way.
    """
    from fedsim.results import OutputPathError

    blocker = next((p for p in (out_dir, *out_dir.parents) if p.exists() and not p.is_dir()),
                   None)
    if blocker is not None:
        why = ("exists and is not a directory" if blocker == out_dir else
               f"cannot be a directory, {blocker} is a file")
        raise OutputPathError(f"sweep directory (--out) {out_dir}: {why}; choose another --out")


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
