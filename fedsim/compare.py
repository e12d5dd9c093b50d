"""``fedsim compare``: several runs side by side, as one table and one plot.

A researcher's question is rarely about one run: DP against no DP, one
partition against another, the cells of a sweep. This reads what the runs
already wrote (``metrics.jsonl``, ``summary.json``, ``attack_summary.json``) and
computes nothing again, so it also works on runs that are still going or were
killed (their rows so far, marked unfinished).
"""

from __future__ import annotations

import json
from pathlib import Path

from fedsim.provenance import short_commit
from fedsim.results import (RunFileError, finite_number, read_attack_summary, read_json_object,
                            read_metrics)

#: Columns shown where at least one run has them, after the ones every run has.
OPTIONAL_COLUMNS = ("epsilon", "client_level_epsilon", "local_epsilon", "leakage_total",
                    "adaptive_clip_norm", "attack_psnr", "attack_nmi", "attack_ami")

#: The fields of ``summary.json``'s ``environment`` (:func:`fedsim.provenance.environment`)
#: that a comparison names where the runs differ in them.
ENVIRONMENT_FIELDS = ("commit", "fedsim", "jax", "jaxlib", "backend", "device_kind",
                      "local_devices", "processes", "convolution")


class CompareError(FileNotFoundError):
    """A path that is neither a run directory nor a sweep's directory."""


def run_dirs(paths: list[str | Path]) -> list[Path]:
    """The run directories that ``paths`` name, in order.

    A run directory (one with ``metrics.jsonl``) stands for itself. A sweep's
    directory (``cells/`` inside) stands for its cells that have rows, in the
    order of its ``results.json`` where present, else by name.

    Raises:
      CompareError: a path that is neither, naming it; or no run at all.
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if (path / "metrics.jsonl").is_file():
            found.append(path)
            continue
        cells = path / "cells"
        if not cells.is_dir():
            raise CompareError(f"{path}: neither a run directory (no metrics.jsonl) nor a "
                               "sweep's directory (no cells/)")
        order = _cell_order(path)
        names = sorted((c.name for c in cells.iterdir() if (c / "metrics.jsonl").is_file()),
                       key=lambda n: (order.index(n) if n in order else len(order), n))
        if not names:
            raise CompareError(f"{path}: a sweep's directory whose cells have no rows yet")
        found.extend(cells / n for n in names)
    if not found:
        raise CompareError("no run directory given")
    return found


def _cell_order(sweep_dir: Path) -> list[str]:
    """The cells as the sweep's ``results.json`` lists them; [] where it cannot
    be read (the order is all it gives here: every cell is read from its files)."""
    try:
        rows = json.loads((sweep_dir / "results.json").read_text())["rows"]
        return [row["cell"] for row in rows if isinstance(row, dict) and "cell" in row]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def labels(dirs: list[Path]) -> list[str]:
    """Short unique names: the directory's name, with as many parents as it takes."""
    depth = 1
    while True:
        names = ["/".join(d.resolve().parts[-depth:]) for d in dirs]
        if len(set(names)) == len(names) or depth >= max(len(d.resolve().parts) for d in dirs):
            return names
        depth += 1


def load_run(run_dir: Path) -> dict:
    """One run's rows, summary (empty while unfinished), attack means and whether
    it is finished.

    A run is finished once its ``summary.json`` exists; an attack run (its
    ``config.yaml`` has an ``attack`` section, or it has an
    ``attack_summary.json``) only once its ``attack_summary.json`` exists too:
    the simulation writes ``summary.json`` before the attack starts, and a
    killed or failed attack leaves it (the rule of
    :data:`fedsim.run.STALE_ON_RERUN` and of the attack sweep's done file).
    ``attack_pending`` marks that state (trained, attack not finished), which is
    also what ``fedsim run`` leaves for a config with an ``attack`` section: it
    trains and does not attack (``fedsim attack`` does both).

    Raises:
      RunFileError: a run file that is not what fedsim writes there, naming it.
    """
    rows = read_metrics(run_dir / "metrics.jsonl")
    summary = read_json_object(run_dir / "summary.json")
    attack_path = run_dir / "attack_summary.json"
    attack = read_attack_summary(attack_path).get("mean", {})
    attack_run = attack_path.is_file() or _has_attack_section(run_dir / "config.yaml")
    finished = bool(summary) and (not attack_run or attack_path.is_file())
    return {"rows": rows, "summary": summary, "attack": attack, "finished": finished,
            "attack_pending": bool(summary) and attack_run and not attack_path.is_file()}


def _has_attack_section(config_path: Path) -> bool:
    """Whether the run's ``config.yaml`` has an ``attack`` section (False where
    there is no config.yaml: a run directory fedsim did not write).

    Raises:
      RunFileError: the file exists but is not a YAML mapping, naming it.
    """
    if not config_path.is_file():
        return False
    import yaml

    from fedsim.config import yaml_load

    try:
        cfg = yaml_load(config_path.read_text())
    except (OSError, ValueError, yaml.YAMLError) as e:
        why = (str(e).splitlines() or [""])[0]  # a YAML error's first line
        raise RunFileError(f"{config_path}: not readable as YAML ({type(e).__name__}: {why})"
                           ) from None
    if not isinstance(cfg, dict):
        raise RunFileError(f"{config_path}: expected a YAML mapping, got {type(cfg).__name__}")
    return cfg.get("attack") is not None


def table_row(label: str, run: dict) -> dict:
    """The comparison's columns for one run (None where it has no value)."""
    rows, summary, attack = run["rows"], run["summary"], run["attack"]
    evals = [r for r in rows if finite_number(r.get("test_accuracy")) is not None]
    last = rows[-1] if rows else {}
    best = max(evals, key=lambda r: r["test_accuracy"]) if evals else None
    out = {
        "run": label,
        "status": ("finished" if run.get("finished", bool(summary))
                   else "attack pending" if run.get("attack_pending") else "unfinished"),
        "rounds": len(rows),
        "test_accuracy": evals[-1]["test_accuracy"] if evals else None,
        "best_test_accuracy": best["test_accuracy"] if best else None,
        "best_round": best["round"] if best else None,
        "final_train_loss": last.get("train_loss"),
        "seconds": summary.get("seconds",
                               sum(finite_number(r.get("seconds")) or 0 for r in rows)),
    }
    for key in ("epsilon", "client_level_epsilon", "local_epsilon", "leakage_total",
                "adaptive_clip_norm"):
        out[key] = summary.get(key, last.get(key))
    out["attack_psnr"] = attack.get("psnr")
    out["attack_nmi"] = attack.get("nmi")
    out["attack_ami"] = attack.get("ami")
    return out


def markdown_table(table: list[dict]) -> str:
    """``table`` as a markdown table; optional columns only where some run has them."""
    cols = ["run", "status", "rounds", "test_accuracy", "best_test_accuracy", "best_round",
            "final_train_loss", "seconds",
            *[c for c in OPTIONAL_COLUMNS if any(r.get(c) is not None for r in table)]]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in table:
        lines.append("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def environment_note(names: list[str], runs: list[dict]) -> str:
    """A line naming the environment fields in which the runs differ, or ``""``.

    Runs that recorded no ``environment`` (unfinished, or written before it
    existed) are left out. Two runs of one config and seed on another commit,
    JAX, device or convolution rule can differ by float rounding, which
    training and attacks amplify (``benchmarks/results/chu2023_attack_drift.md``),
    so a table of runs that differ there says so.
    """
    envs = [(n, r["summary"].get("environment")) for n, r in zip(names, runs)]
    envs = [(n, e) for n, e in envs if isinstance(e, dict)]
    if len(envs) < 2:
        return ""
    differ = []
    for field in ENVIRONMENT_FIELDS:
        values = [(n, e.get(field)) for n, e in envs]
        if len({json.dumps(v, sort_keys=True) for _, v in values}) > 1:
            differ.append(f"{field} (" + ", ".join(f"{n}: {_short(field, v)}" for n, v in values)
                          + ")")
    if not differ:
        return ""
    return ("\nThe runs' environments differ (summary.json): " + "; ".join(differ)
            + ". Their numbers can differ by float rounding as well as by their configs.\n")


def _short(field: str, value) -> str:
    """A commit as markdown shows it (:func:`fedsim.provenance.short_commit`), other
    strings as they are, anything else as JSON."""
    if field == "commit" and isinstance(value, str):
        return short_commit(value)
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3e}"
    return str(value)


def plot_learning_curves(names: list[str], runs: list[dict], path: Path) -> None:
    """Test accuracy and train loss per round, one line per run, as a PNG.

    Raises:
      CompareError: ``path`` cannot be written (a directory that cannot be
        made, no permission, a format matplotlib does not write), naming it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for name, run in zip(names, runs):
        rows = run["rows"]
        evals = [r for r in rows if finite_number(r.get("test_accuracy")) is not None]
        line, = loss_ax.plot([r["round"] for r in rows], [r["train_loss"] for r in rows],
                             label=name)
        acc_ax.plot([r["round"] for r in evals], [r["test_accuracy"] for r in evals],
                    marker="o", markersize=3, color=line.get_color(), label=name)
    from matplotlib.ticker import MaxNLocator

    acc_ax.set(xlabel="round", ylabel="test accuracy", ylim=(0, 1), title="test accuracy")
    loss_ax.set(xlabel="round", ylabel="train loss", title="train loss")
    for ax in (acc_ax, loss_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    acc_ax.legend(fontsize="small")
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    except (OSError, ValueError) as e:  # ValueError: a format matplotlib does not write
        raise CompareError(f"--out {path}: cannot write the plot there ({e})") from None
    finally:
        plt.close(fig)


def plot_path(out: str | Path) -> Path:
    """Where :func:`compare` writes the plot of ``--out out``: ``out``, with
    ``.png`` added where it has no extension (as matplotlib would add it; the
    command says this path, not ``out``)."""
    if not str(out).strip() or not Path(out).name:  # "" or a directory such as "."
        raise CompareError(f"--out {str(out)!r}: expected a file path for the plot (e.g. "
                           "runs.png)")
    out = Path(out)
    return out if out.suffix else out.with_name(out.name + ".png")


def compare(paths: list[str | Path], out: str | Path | None = None) -> str:
    """The comparison table of the runs ``paths`` name; with ``out``, their plot
    at :func:`plot_path` of it.

    Returns:
      The markdown table.
    """
    dirs = run_dirs(paths)
    names = labels(dirs)
    runs = [load_run(d) for d in dirs]
    if out is not None:
        plot_learning_curves(names, runs, plot_path(out))
    return (markdown_table([table_row(n, r) for n, r in zip(names, runs)])
            + environment_note(names, runs))
