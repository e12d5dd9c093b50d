"""Compare two runs of one reproduce_chu2023 part: per-row differences and the verdicts.

Usage::

    python -m benchmarks.compare_chu2023_runs OLD.json [OLD2.json ...] NEW.json [--out FILE.md]

Several old files are merged into one run (rows concatenated, seconds added),
e.g. parts C and D stored separately against a ``--parts CD`` rerun.

The runs must have the same recorded settings (seed included; the file-naming options
``parts``, ``out`` and ``tag`` aside): runs whose settings differ are refused, naming
the settings. Rows are matched by :data:`KEY` (part, model, base, defense, p, B, attack,
round, client, FL seed, λ_pri, defense rate, and part A's seed, upload protocol and
trained rounds and part B's upload semantics); the report gives each metric's largest and median
absolute difference over the matched rows, the runs' seconds (total and the
attacks' where recorded), and each acceptance check of
``reproduce_chu2023.acceptance_checks`` for both runs side by side. Written
for reruns of the same settings under changed code (e.g. a faster convolution),
where the rows should agree up to float rounding and the verdicts should not move.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.reproduce_chu2023 import acceptance_checks, settings_diff  # noqa: E402

# Part A rows carry ``seed``, ``protocol`` and ``trained_rounds``; part B-D rows ``fl_seed``
# and ``upload_semantics``: without them a part-A run at seed 0 and one at seed 1 (or
# under another protocol) would match row by row as if one were a rerun of the other.
KEY = ("part", "model", "base", "defense", "p", "B", "attack", "round", "client_id", "fl_seed",
       "lambda_pri", "defense_rate", "seed", "protocol", "trained_rounds", "upload_semantics")
METRICS = ("psnr", "nmi", "accuracy")


def row_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in KEY)


def attack_seconds(result: dict) -> list[float]:
    return sorted({r["attack_seconds_all"] for r in result["rows"]
                   if r.get("attack_seconds_all") is not None})


def short_commits(text) -> str:
    """``text`` with every full 40-hex commit cut to 7 characters, keeping what follows it
    (``-dirty``, ``-declared``) and everything around it (a combined run's "A …, B …")."""
    return re.sub(r"\b([0-9a-f]{7})[0-9a-f]{33}\b", r"\1", str(text))


def settings_differences(old: dict, new: dict, allowed=()) -> list[str]:
    """The recorded settings in which two results differ (seed included; the file-naming
    options aside), as "name (old vs new)"; none where either records no settings.
    Settings named in ``allowed`` are left out."""
    so, sn = old.get("settings"), new.get("settings")
    if so is None or sn is None:
        return []
    diff = [("seed", so.get("seed", old.get("seed")), sn.get("seed", new.get("seed")))]
    diff = [d for d in diff if d[1] != d[2]] + settings_diff(so, sn)
    return [f"{k} ({a!r} vs {b!r})" for k, a, b in diff if k not in allowed]


def merge(results: list[dict]) -> dict:
    """Several results files as one run: rows concatenated, seconds added; their settings
    must agree (``parts`` aside).

    Raises:
        ValueError: two of the files record other settings.
    """
    if len(results) == 1:
        return results[0]
    for i, r in enumerate(results[1:], 1):
        diff = settings_differences(results[0], r)
        if diff:
            raise ValueError(f"old file {i + 1} was made with other settings than old file 1: "
                             + ", ".join(diff))
    commits = list(dict.fromkeys(str(r.get("commit")) for r in results))
    seconds = [r.get("seconds") for r in results]
    merged = {"rows": [row for r in results for row in r["rows"]],
              "seconds": None if None in seconds else sum(seconds),
              "commit": ", ".join(short_commits(c) for c in commits)}
    if "settings" in results[0]:
        merged["settings"] = results[0]["settings"]
    return merged


def compare(old: dict, new: dict, differing=()) -> dict:
    """The differences between two results dicts of the same settings.

    Args:
        differing: settings the runs may differ in, by name (e.g. ``pseudo_start``, to
            compare a rerun under a changed setting with its recorded run); the report
            names them with both values.

    Raises:
        ValueError: the runs record different settings (other than ``differing``), or
            their rows do not match one to one.
    """
    diff = settings_differences(old, new, allowed=differing)
    if diff:
        raise ValueError("the runs were made with other settings, so they are not a rerun of "
                         "each other: " + ", ".join(diff)
                         + " (--differing NAME compares them all the same)")
    chosen = [d for d in settings_differences(old, new) if d not in diff]
    a = {row_key(r): r for r in old["rows"]}
    b = {row_key(r): r for r in new["rows"]}
    if len(a) != len(old["rows"]) or len(b) != len(new["rows"]):
        raise ValueError("a run has two rows with the same key " + repr(KEY))
    if set(a) != set(b):
        raise ValueError(f"the runs' rows differ: {len(set(a) - set(b))} only in the old run, "
                         f"{len(set(b) - set(a))} only in the new one")
    diffs = {}
    for m in METRICS:
        d = [abs(b[k][m] - a[k][m]) for k in a if a[k].get(m) is not None]
        diffs[m] = {"max": max(d), "median": statistics.median(d), "rows": len(d)} if d else None
    checks = [{"check": c_old["check"], "old": c_old["pass"], "new": c_new["pass"],
               "old_detail": c_old["detail"], "new_detail": c_new["detail"]}
              for c_old, c_new in zip(acceptance_checks(old["rows"]),
                                      acceptance_checks(new["rows"]), strict=True)]
    return {"rows": len(a), "diffs": diffs, "checks": checks,
            "seconds": [old.get("seconds"), new.get("seconds")],
            "attack_seconds": [attack_seconds(old), attack_seconds(new)],
            "commits": [old.get("commit"), new.get("commit")], "differing": chosen}


def render(report: dict, names: tuple[str, str], differing=()) -> str:
    fmt = lambda v: "–" if v is None else f"{v:.0f}"  # noqa: E731
    flags = "".join(f" --differing {d}" for d in differing)
    lines = [f"# {names[1]} against {names[0]}", "",
             f"Produced by `python -m benchmarks.compare_chu2023_runs "
             f"{names[0].replace(' + ', ' ')} {names[1]}{flags}`. "
             f"Commits: old {short_commits(report['commits'][0])}, "
             f"new {short_commits(report['commits'][1])}. "
             f"{report['rows']} rows matched by {', '.join(KEY)}.", ""]
    if report.get("differing"):
        lines += ["The runs differ in these settings, as asked (old vs new): "
                  + ", ".join(report["differing"]) + ".", ""]
    lines += [
             "| | old | new |", "|---|---|---|",
             f"| seconds | {fmt(report['seconds'][0])} | {fmt(report['seconds'][1])} |",
             "| attack seconds | " + " | ".join(", ".join(f"{s:.0f}" for s in v) or "–"
                                                 for v in report["attack_seconds"]) + " |", "",
             "| metric | largest abs. difference | median abs. difference |", "|---|---|---|"]
    for m, d in report["diffs"].items():
        if d:
            lines.append(f"| {m} | {d['max']:.4g} | {d['median']:.4g} |")
    lines += ["", "| check | old | new |", "|---|---|---|"]
    for c in report["checks"]:
        verdict = lambda p: "PASS" if p else "FAIL"  # noqa: E731
        lines.append(f"| {c['check']} | {verdict(c['old'])}: {c['old_detail']} | "
                     f"{verdict(c['new'])}: {c['new_detail']} |")
    moved = [c for c in report["checks"] if c["old"] != c["new"]]
    lines += ["", f"Verdicts that moved: {len(moved)} of {len(report['checks'])}."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN.json",
                    help="the old run's file(s), then the new run's")
    ap.add_argument("--out", default=None, help="write the markdown report here")
    ap.add_argument("--differing", action="append", default=[], metavar="SETTING",
                    help="a recorded setting the runs may differ in (repeat for several), "
                         "e.g. pseudo_start for a rerun with the masked start")
    args = ap.parse_args(argv)
    if len(args.runs) < 2:
        ap.error("give at least two files: the old run's, then the new run's")
    runs = []
    for path in args.runs:
        if not Path(path).is_file():
            ap.error(f"no such file {path}")
        try:
            runs.append(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as e:
            ap.error(f"{path} is not JSON: {e}")
        if not isinstance(runs[-1], dict) or "rows" not in runs[-1]:
            ap.error(f"{path} has no 'rows': not a reproduce_chu2023 results file")
    known = {"seed"}.union(*((r.get("settings") or {}) for r in runs))
    for name in args.differing:
        if name not in known:
            ap.error(f"--differing {name}: not a setting the runs record "
                     f"({', '.join(sorted(known))})")
    try:
        report = compare(merge(runs[:-1]), runs[-1], differing=tuple(args.differing))
    except ValueError as e:
        ap.error(str(e))
    md = render(report, (" + ".join(args.runs[:-1]), args.runs[-1]), tuple(args.differing))
    if args.out:
        Path(args.out).write_text(md)
    print(md)
    return report


if __name__ == "__main__":
    main()
