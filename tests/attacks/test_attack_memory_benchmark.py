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


class _FakeDevice:
    """A device whose allocator peaks at ``peak`` while the call runs."""

    def __init__(self, in_use, peak_before, peak_after, stats=True):
        self.calls, self.stats = 0, stats
        self.in_use, self.peaks = in_use, (peak_before, peak_after)

    def memory_stats(self):
        if not self.stats:
            return None
        peak = self.peaks[min(self.calls, 1)]
        self.calls += 1
        return {"bytes_in_use": self.in_use, "peak_bytes_in_use": peak}


def test_device_growth_is_the_new_peak_less_what_was_allocated_before():
    from benchmarks.attack_memory import device_growth

    out, seconds, grown = device_growth(lambda: "done", _FakeDevice(100, 150, 1100))
    assert out == "done" and seconds >= 0 and grown == 1000
    # A call that stays under the process's earlier peak cannot be measured.
    assert device_growth(lambda: None, _FakeDevice(100, 5000, 5000))[2] is None
    with pytest.raises(SystemExit, match="no peak_bytes_in_use"):
        device_growth(lambda: None, _FakeDevice(0, 0, 0, stats=False))


def test_a_gpu_result_renders_its_unmeasured_second_call():
    from benchmarks.attack_memory import markdown

    row = {"victims": 64, "batch": 8, "planned_bytes": 2**30, "pretend_free_bytes": None,
           "measured_bytes": 2**29, "measured_second_bytes": None, "victims_per_call": 64,
           "second_seconds": 0.5}
    text = markdown({"commit": "abc", "device": "gpu: H100", "headroom": 0.8,
                     "plan_margin": 2.1, "measured_on": "gpu", "rows": [row]})
    assert "accelerator-memory growth" in text and "cannot be reset" in text
    assert "| 64 | 8 | – | 1.000 | 0.500 | 0.50 | – | – | 64 | 0.50 |" in text


def test_an_unknown_device_is_refused():
    p = subprocess.run([sys.executable, "-m", "benchmarks.attack_memory", "--device", "tpu"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode != 0 and "--device" in p.stderr
