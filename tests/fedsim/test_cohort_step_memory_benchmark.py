"""benchmarks/cohort_step_memory.py: argument checks and one real measurement."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spec", ["vmap", "loop:10", "vmap:0", "vmap:x", "vmap:10:2",
                                  "sharded:10:0", "sharded:10:2:1"])
def test_a_bad_run_is_named_before_anything_runs(spec):
    p = subprocess.run([sys.executable, "-m", "benchmarks.cohort_step_memory", "--runs", spec],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode != 0
    assert f"--runs entry {spec!r}: expected STRATEGY:CLIENTS" in p.stderr


def test_small_vmap_and_sharded_cohorts_are_planned_and_measured(tmp_path):
    import json
    p = subprocess.run([sys.executable, "-m", "benchmarks.cohort_step_memory", "--runs",
                        "vmap:4", "sharded:4:2", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    vmap, sharded = json.loads((tmp_path / "cohort_step_memory.json").read_text())["rows"]
    for row in (vmap, sharded):
        assert "error" not in row and row["planned_bytes"] > 0 and row["measured_bytes"] >= 0
    assert (vmap["devices"], sharded["devices"]) == (1, 2)
    md = (tmp_path / "cohort_step_memory.md").read_text()
    assert "| vmap | 4 |" in md and "| sharded (2 CPU devices) | 4 |" in md


def test_a_bad_arena_count_is_named():
    p = subprocess.run([sys.executable, "-m", "benchmarks.cohort_step_memory",
                        "--malloc-arena-max", "0"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode != 0 and "--malloc-arena-max must be >= 1, got 0" in p.stderr


def test_an_arena_limited_run_is_written_beside_the_default_one(tmp_path):
    import json
    p = subprocess.run([sys.executable, "-m", "benchmarks.cohort_step_memory", "--runs",
                        "map:2", "--malloc-arena-max", "1", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "cohort_step_memory_arena1.json").read_text())
    (row,) = result["rows"]
    assert result["malloc_arena_max"] == 1 and "error" not in row
    assert row["worker_malloc_arena_max"] == "1"  # the worker ran under it
    assert not (tmp_path / "cohort_step_memory.json").exists()
    md = (tmp_path / "cohort_step_memory_arena1.md").read_text()
    assert "workers ran with `MALLOC_ARENA_MAX=1`" in md and "--malloc-arena-max 1" in md


@pytest.mark.parametrize("module", ["benchmarks.cohort_step_memory", "benchmarks.attack_memory"])
def test_a_non_positive_timeout_is_named(module):
    p = subprocess.run([sys.executable, "-m", module, "--timeout", "0"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode != 0 and "--timeout must be > 0 seconds, got 0.0" in p.stderr
