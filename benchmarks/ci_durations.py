"""Where the test suite's time goes: per-file sums of ``pytest --durations=0`` logs.

A CI rehearsal run as ``PYTEST_ADDOPTS=--durations=0 bash .ci/run > LOG``
prints every test's setup, call and teardown time. This script adds them up
by test file, for one log or several side by side (e.g. before and after a
change to the suite), with each log's wall time (pytest's closing line) and
worker time (the sum of all durations: with ``-n 2`` about twice the wall).
Labels ``GROUP/RUN`` group repeated runs: the markdown compares the last
group's median with the first's.

Run::

    python -m benchmarks.ci_durations --log before/1=ci_before.log \\
        --log after/1=ci_after.log --out benchmarks/results/ci_durations

It writes ``ci_durations.json`` and ``ci_durations.md``. The machine is
noisy (two runs of one commit have differed by 18 %): give repeated runs as
a group, and read a difference of a few percent as nothing.
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
from pathlib import Path

from benchmarks.results_io import write_json_and_markdown

_DURATION = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+?)::")
_SUMMARY = re.compile(r"(\d+) passed.* in ([\d.]+)s")


def parse_log(text: str) -> dict:
    """Per-file seconds, test count, worker and wall seconds of one pytest log.

    Raises:
      ValueError: the log holds no durations (run pytest with --durations=0).
    """
    per_file: dict[str, float] = collections.Counter()
    calls: dict[str, int] = collections.Counter()
    for line in text.splitlines():
        m = _DURATION.match(line)
        if m:
            per_file[m.group(3)] += float(m.group(1))
            calls[m.group(3)] += m.group(2) == "call"
    if not per_file:
        raise ValueError("no test durations in the log; run pytest with --durations=0")
    summaries = _SUMMARY.findall(text)
    passed, wall = (int(summaries[-1][0]), float(summaries[-1][1])) if summaries else (None, None)
    return {"passed": passed, "wall_s": wall, "worker_s": round(sum(per_file.values()), 2),
            "files": {f: {"seconds": round(s, 2), "calls": calls[f]}
                      for f, s in sorted(per_file.items(), key=lambda kv: -kv[1])}}


def _groups(labels: list[str]) -> dict[str, list[str]]:
    """Labels by group: the part before ``/`` (``off/1``, ``off/2`` → ``off``)."""
    groups: dict[str, list[str]] = {}
    for k in labels:
        groups.setdefault(k.split("/", 1)[0], []).append(k)
    return groups


def _median(values: list) -> float | None:
    vals = [v for v in values if v]
    return statistics.median(vals) if vals else None


def markdown(logs: dict[str, dict], top: int) -> str:
    labels = list(logs)
    first = logs[labels[0]]
    lines = ["# Test suite time by file", "",
             "Sums of `pytest --durations=0` lines (setup + call + teardown) per test file "
             "(`benchmarks/ci_durations.py`); one log per column.", "",
             "| | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels),
             "| passed | " + " | ".join(str(logs[k]["passed"]) for k in labels) + " |",
             "| wall (s) | " + " | ".join(f"{logs[k]['wall_s']:.0f}" if logs[k]["wall_s"]
                                         else "-" for k in labels) + " |",
             "| worker time (s) | " + " | ".join(f"{logs[k]['worker_s']:.0f}" for k in labels)
             + " |", ""]
    groups = _groups(labels)
    if len(groups) > 1:
        a, b = list(groups)[0], list(groups)[-1]
        for key, name in (("wall_s", "wall"), ("worker_s", "worker time")):
            med = {g: _median([logs[k][key] for k in groups[g]]) for g in (a, b)}
            if med[a] and med[b]:
                runs = {g: f" (median of {len(groups[g])})" if len(groups[g]) > 1 else ""
                        for g in (a, b)}
                lines.append(f"- {name}: {b}{runs[b]} / {a}{runs[a]} = "
                             f"{med[b]:.0f} / {med[a]:.0f} s = {med[b] / med[a]:.2f}")
        lines.append("")
    lines += [f"Files by time in `{labels[0]}` (the {top} largest):", "",
              "| file | tests | " + " | ".join(f"{k} (s)" for k in labels) + " |",
              "|---|---|" + "---|" * len(labels)]
    for f in list(first["files"])[:top]:
        row = [f"{logs[k]['files'].get(f, {}).get('seconds', 0):.1f}" for k in labels]
        lines.append(f"| {f} | {first['files'][f]['calls']} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", action="append", required=True, metavar="LABEL=PATH",
                    help="a pytest log with --durations=0 output (repeat for several)")
    ap.add_argument("--out", default="benchmarks/results/ci_durations")
    ap.add_argument("--top", type=int, default=25, help="how many files the table lists")
    args = ap.parse_args(argv)
    if args.top < 1:
        ap.error(f"--top must be at least 1, got {args.top}")
    logs = {}
    for spec in args.log:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            ap.error(f"--log takes LABEL=PATH, got {spec!r}")
        try:
            logs[label] = parse_log(Path(path).read_text(errors="replace"))
        except (OSError, ValueError) as e:
            ap.error(f"--log {spec}: {e}")
    write_json_and_markdown(args.out, "ci_durations", {"logs": logs}, markdown(logs, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
