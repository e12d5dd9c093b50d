"""benchmarks/diagnose_auto_after_calibration.py: its argument checks (the timing
itself is the script's job)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spec", ["vmap", "vmap:many", "pmap:100", ":100"])
def test_a_bad_disturbance_is_named_before_anything_runs(spec):
    p = subprocess.run([sys.executable, "-m", "benchmarks.diagnose_auto_after_calibration",
                        "--disturb", spec], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode != 0
    assert f"--disturb {spec!r}: expected STRATEGY:CLIENTS" in p.stderr


@pytest.mark.parametrize("argv, message", [
    (["--clients", "0"], "--clients and --rounds must be >= 1"),
    (["--rounds", "0"], "--clients and --rounds must be >= 1"),
    (["--strategy", "auto"], "--strategy 'auto': expected one of"),
])
def test_bad_sizes_and_strategies_are_named(argv, message):
    p = subprocess.run([sys.executable, "-m", "benchmarks.diagnose_auto_after_calibration", *argv],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode != 0
    assert message in p.stderr
