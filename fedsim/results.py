"""Run outputs: config.yaml, metrics.jsonl, summary.json and figures.

Every file is written atomically (temporary file + rename) so a killed run
never leaves a half-written summary.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        # mkstemp makes the file 0600 and os.replace keeps that: give it the
        # mode open() would (0666 less the umask), so that collaborators who
        # can read the run directory can read its results too.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """The process's umask.

    Read from /proc where it exists: setting it to read it back would, for an
    instant, change the mode of files other threads (orbax's) create.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json(path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_jsonable) + "\n")


def _jsonable(o):
    try:
        import numpy as np
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    return str(o)


class RunFileError(ValueError):
    """A file a run wrote is not what fedsim writes there (torn, edited, another
    program's): a metrics.jsonl line other than a torn last one that is not a
    round's row, a summary that is not a JSON object, or a metrics.jsonl that
    lacks rows of rounds a checkpoint has done. The message names it."""


class OutputPathError(RunFileError):
    """An output directory that cannot be made: the path, or a folder above
    it, is a file, or it may not be written. The message names the path and
    the setting it came from (e.g. ``output.dir``)."""


def make_dir(path, setting: str) -> Path:
    """``mkdir -p path``, with a one-line error where that cannot be done.

    Args:
      path: the directory.
      setting: where ``path`` came from, for the message (``"output.dir"``).

    Returns:
      ``path`` as a Path.

    Raises:
      OutputPathError: naming ``setting``, ``path`` and why (a bare
        FileExistsError, NotADirectoryError or PermissionError traceback
        before).
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputPathError(f"{setting} {path}: exists and is not a directory; choose "
                              f"another {setting}") from None
    except NotADirectoryError:
        above = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        raise OutputPathError(f"{setting} {path}: cannot be a directory, "
                              f"{above or 'a folder above it'} is a file; choose another "
                              f"{setting}") from None
    except OSError as e:  # PermissionError, a read-only file system, ...
        raise OutputPathError(f"{setting} {path}: cannot create the directory "
                              f"({type(e).__name__}: {e.strerror or e})") from None
    return path


def read_metrics(path) -> list[dict]:
    """The rows of a metrics.jsonl file (none where it does not exist).

    A torn last line (a process killed while appending) is ignored.

    Raises:
      RunFileError: naming the file and line, for any other line that is
        not a JSON object with an integer ``round`` and a ``train_loss``:
        rows after it used to be dropped without a word, and rows that were
        JSON but not objects ended in an AttributeError in ``fedsim report``.
    """
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:  # a directory, unreadable, not text
        raise RunFileError(f"{p}: not readable as text ({type(e).__name__}: {e})") from None
    for i, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                break  # torn by a kill mid-append: the round is redone on resume
            raise RunFileError(f"{p}, line {i}: not JSON ({e})") from None
        loss = row.get("train_loss", "absent") if isinstance(row, dict) else "absent"
        if not (isinstance(row, dict) and isinstance(row.get("round"), int)
                and not isinstance(row["round"], bool)
                and (loss is None or (isinstance(loss, (int, float))
                                      and not isinstance(loss, bool)))):
            raise RunFileError(f"{p}, line {i}: expected a round's row, a JSON object with "
                               f"an integer 'round' and a number 'train_loss' (null where "
                               f"none), got {line[:80]!r}")
        rows.append(row)
    return rows


def finite_number(value) -> float | int | None:
    """``value`` where it is a finite int or float (not a bool), else None: what
    a table of runs may average, sum or rank (a NaN, an ``inf`` PSNR or a
    string in a run file is left out)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def read_json_object(path) -> dict:
    """``path``'s JSON object; {} where the file does not exist (yet).

    Raises:
      RunFileError: the file exists but is not a JSON object, naming it (read
        as missing, a finished run would pass for an unfinished one).
    """
    p = Path(path)
    if not p.is_file():
        return {}
    try:
        value = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise RunFileError(f"{p}: not readable as JSON ({type(e).__name__}: {e})") from None
    if not isinstance(value, dict):
        raise RunFileError(f"{p}: expected a JSON object, got {type(value).__name__}")
    return value


def read_attack_summary(path) -> dict:
    """``path``'s attack summary (``attack_summary.json``); {} where it does not
    exist (yet).

    Raises:
      RunFileError: the file exists but is not a JSON object whose ``victims``
        (where present) is a list of objects and whose ``mean`` (where present)
        is an object, naming it (``fedsim report`` and ``fedsim compare``
        read it alike).
    """
    attack = read_json_object(path)
    victims, mean = attack.get("victims", []), attack.get("mean", {})
    if not (isinstance(victims, list) and all(isinstance(v, dict) for v in victims)
            and isinstance(mean, dict)):
        raise RunFileError(f"{path}: expected 'victims' to be a list of objects "
                           "and 'mean' an object")
    return attack


class MetricsLog:
    """Append-only metrics.jsonl, one JSON object per round.

    Args:
      path: the file.
      keep_rounds_below: resuming: keep the file's rows of earlier rounds
        (None: start empty).
      write: False keeps the rows in memory only (the non-primary processes of
        a multi-process run read the file but leave it to process 0).
    """

    def __init__(self, path, keep_rounds_below: int | None = None, write: bool = True):
        self.path = Path(path)
        self.write = write
        rows = read_metrics(self.path)
        if keep_rounds_below is not None:
            rows = [r for r in rows if r.get("round", 0) < keep_rounds_below]
        else:
            rows = []
        if write:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))
        self.rows = rows

    def append(self, row: dict) -> None:
        self.rows.append(row)
        if not self.write:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=_jsonable) + "\n")
            f.flush()


#: Privacy columns of ``metrics.jsonl`` that :func:`plot_learning_curve` draws,
#: with their legend label and the column holding their δ (None: no δ).
PRIVACY_SERIES = (("epsilon", "record-level ε", "delta"),
                  ("client_level_epsilon", "user-level ε (DP-FedAvg)", "client_level_delta"),
                  ("local_epsilon", "local ε (one upload's noise)", "local_delta"))
#: The channels' leakage ledger column (n·κ, the worst client's cumulative bound).
LEAKAGE_SERIES = ("leakage_total", "leakage bound n·κ (worst client)")


def privacy_series(rows: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """The privacy columns a run's rows carry, as ``label -> (rounds, values)``.

    Each ε series is labelled with its last δ. A round whose value is null
    (no finite ε exists), missing or not a finite number (a hand-edited file)
    is NaN, so a plot leaves a gap there instead of joining over it or failing.
    Columns no row has are left out.
    """
    out = {}
    for key, label, delta_key in PRIVACY_SERIES + ((*LEAKAGE_SERIES, None),):
        have = [row for row in rows if key in row]
        if not have:
            continue
        deltas = [row[delta_key] for row in have
                  if delta_key and finite_number(row.get(delta_key)) is not None]
        if deltas:
            label = f"{label}, δ = {deltas[-1]:.3g}"
        values = [float("nan") if finite_number(row.get(key)) is None else float(row[key])
                  for row in rows]
        out[label] = ([row["round"] for row in rows], values)
    return out


def plot_learning_curve(rows: list[dict], path) -> None:
    """Train loss and test accuracy per round as a PNG; below them, where the
    rows carry an accountant's ε or the channels' leakage bound, those per round
    (:func:`privacy_series`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    privacy = privacy_series(rows)
    if privacy:
        fig, (ax1, ax3) = plt.subplots(2, 1, figsize=(6, 6.5), sharex=True,
                                       gridspec_kw={"height_ratios": [3, 2]})
    else:
        fig, ax1 = plt.subplots(figsize=(6, 4))
    r = [row["round"] for row in rows]
    loss = [float("nan") if row["train_loss"] is None else row["train_loss"] for row in rows]
    ax1.plot(r, loss, color="tab:blue", label="train loss")
    if not privacy:  # else the panel below names the shared axis
        ax1.set_xlabel("round")
    ax1.set_ylabel("train loss", color="tab:blue")
    ev = [row for row in rows if row.get("test_accuracy") is not None]
    if ev:
        ax2 = ax1.twinx()
        ax2.plot([row["round"] for row in ev], [row["test_accuracy"] for row in ev],
                 color="tab:red", marker="o", label="test accuracy")
        ax2.set_ylabel("test accuracy", color="tab:red")
        ax2.set_ylim(0, 1)
    ax1.set_title("learning curve")
    if privacy:
        _plot_privacy(ax3, privacy)
    fig.tight_layout()
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    finally:  # a figure that could not be written is closed too
        plt.close(fig)


def _plot_privacy(ax, privacy: dict) -> None:
    """ε series on ``ax``; the leakage bound (other units) on a twin axis."""
    leakage = {k: v for k, v in privacy.items() if k.startswith(LEAKAGE_SERIES[1])}
    eps = {k: v for k, v in privacy.items() if k not in leakage}
    lines = []
    for label, (rounds, values) in eps.items():
        lines += ax.plot(rounds, values, marker=".", label=label)
    ax.set_ylabel("ε")
    peaks = [max((v for v in values if math.isfinite(v)), default=0.0)
             for _, values in eps.values()]
    if min(peaks, default=0.0) > 0 and max(peaks) / min(peaks) > 30:
        ax.set_yscale("log")  # local ε is often orders of magnitude above the user-level one
    ax.set_xlabel("round")
    for label, (rounds, values) in leakage.items():
        twin = ax.twinx() if eps else ax
        lines += twin.plot(rounds, values, color="tab:gray", linestyle="--", label=label)
        twin.set_ylabel("leakage bound")
    ax.legend(lines, [line.get_label() for line in lines], fontsize="small", loc="upper left")
    ax.set_title("privacy spent")
