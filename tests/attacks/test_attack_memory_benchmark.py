"""benchmarks/attack_memory.py: argument checks and one real measurement."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv", [["--runs", "0"], ["--runs", "x"], ["--batch", "-1"]])
def test_bad_counts_are_named_before_anything_runs(argv):
    p = subprocess.run([sys.executable, "-m", "benchmarks.attack_memory", *argv],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode != 0 and "expected a positive integer" in p.stderr


def test_one_small_call_is_planned_and_measured(tmp_path):
    p = subprocess.run([sys.executable, "-m", "benchmarks.attack_memory", "--runs", "2",
                        "--batch", "1", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    (row,) = json.loads((tmp_path / "attack_memory.json").read_text())["rows"]
    assert "error" not in row and row["planned_bytes"] > 0 and row["victims_per_call"] == 2
    assert "| 2 | 1 |" in (tmp_path / "attack_memory.md").read_text()
