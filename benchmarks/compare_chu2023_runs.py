"""Compare two runs of one reproduce_chu2023 part: per-row differences and the verdicts.

Usage::

    python -m benchmarks.compare_chu2023_runs OLD.json [OLD2.json ...] NEW.json [--out FILE.md]

Several old files are merged into one run (rows concatenated, seconds added),
e.g. parts C and D stored separately against a ``--parts CD`` rerun.

Rows are matched by :data:`KEY` (part, model, base, defense, p, B, attack,
round, client, FL seed, λ_pri, defense rate); the report gives each metric's largest and median
absolute difference over the matched rows, the runs' seconds (total and the
attacks' where recorded), and each acceptance check of
``reproduce_chu2023.acceptance_checks`` for both runs side by side. Written
for reruns of the same settings under changed code (e.g. a faster convolution),
where the rows should agree up to float rounding and the verdicts should not move.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.reproduce_chu2023 import acceptance_checks  # noqa: E402

KEY = ("part", "model", "base", "defense", "p", "B", "attack", "round", "client_id", "fl_seed",
       "lambda_pri", "defense_rate")
METRICS = ("psnr", "nmi", "accuracy")


def row_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in KEY)


def attack_seconds(result: dict) -> list[float]:
    return sorted({r["attack_seconds_all"] for r in result["rows"]
                   if r.get("attack_seconds_all") is not None})


def merge(results: list[dict]) -> dict:
    """Several results files as one run: rows concatenated, seconds added."""
    if len(results) == 1:
        return results[0]
    commits = list(dict.fromkeys(str(r.get("commit")) for r in results))
    seconds = [r.get("seconds") for r in results]
    return {"rows": [row for r in results for row in r["rows"]],
            "seconds": None if None in seconds else sum(seconds),
            "commit": ", ".join(c[:7] for c in commits)}


def compare(old: dict, new: dict) -> dict:
    """The differences between two results dicts of the same settings.

    Raises:
        ValueError: the runs' rows do not match one to one.
    """
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
            "commits": [old.get("commit"), new.get("commit")]}


def render(report: dict, names: tuple[str, str]) -> str:
    fmt = lambda v: "–" if v is None else f"{v:.0f}"  # noqa: E731
    lines = [f"# {names[1]} against {names[0]}", "",
             f"Produced by `python -m benchmarks.compare_chu2023_runs "
             f"{names[0].replace(' + ', ' ')} {names[1]}`. "
             f"Commits: old {str(report['commits'][0])[:24]}, new {str(report['commits'][1])[:7]}. "
             f"{report['rows']} rows matched by {', '.join(KEY)}.", "",
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
    try:
        report = compare(merge(runs[:-1]), runs[-1])
    except ValueError as e:
        ap.error(str(e))
    md = render(report, (" + ".join(args.runs[:-1]), args.runs[-1]))
    if args.out:
        Path(args.out).write_text(md)
    print(md)
    return report


if __name__ == "__main__":
    main()
