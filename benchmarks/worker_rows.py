"""Running a benchmark's worker in a fresh process and reading back its row.

The memory and throughput benchmarks measure each setting in a fresh Python
process (peak memory, compile caches and allocator state of their own). The
worker prints one line ``ROW <json>``; :func:`run_worker` merges it into the
row, or records why there is none (the worker's last stderr line, or the
timeout), and prints the row as it comes.
"""

from __future__ import annotations

import json
import os
import subprocess

from benchmarks.provenance import ROOT


def worker_env(**extra: str) -> dict:
    """This process's environment for a worker, with the repository first on
    ``PYTHONPATH`` and what was there kept (packages installed with
    ``--target``, as on the GPU machine), plus ``extra``."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def run_worker(cmd: list[str], row: dict, timeout: float, env: dict) -> dict:
    """Run ``cmd`` in the repository root and return ``row`` updated with its ``ROW`` line.

    On failure ``row["error"]`` holds the last line of the worker's stderr (at
    most 300 characters) or the timeout.
    """
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
        line = [l for l in p.stdout.splitlines() if l.startswith("ROW ")]
        if p.returncode != 0 or not line:
            row["error"] = (p.stderr.strip().splitlines() or ["no output"])[-1][:300]
        else:
            row.update(json.loads(line[-1][4:]))
    except subprocess.TimeoutExpired:
        row["error"] = f"timed out after {timeout:.0f} s"
    return row
