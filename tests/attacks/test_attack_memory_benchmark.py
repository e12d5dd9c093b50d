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
    """An allocator: ``bytes_in_use`` and a peak that counts from its start."""

    def __init__(self, in_use, peak, stats=True, rounding=0, refuse=False):
        self.in_use, self.peak, self.stats = in_use, peak, stats
        self.rounding, self.refuse = rounding, refuse

    def memory_stats(self):
        if not self.stats:
            return None
        return {"bytes_in_use": self.in_use, "peak_bytes_in_use": self.peak}

    def hold(self, nbytes):
        self.in_use += nbytes
        self.peak = max(self.peak, self.in_use)

    def work(self, transient, kept=0):
        """A call: ``transient`` bytes for a while, of which ``kept`` stay."""
        def call():
            self.hold(transient)
            self.in_use -= transient - kept
            return "done"
        return call


def _allocate(device, nbytes):
    if device.refuse:
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")
    device.hold(max(nbytes - device.rounding, 1))
    return object()


def test_device_growth_counts_a_call_below_the_peak_compilation_set():
    from benchmarks.device_memory import device_growth

    # Compilation left a peak of 5000 over 100 in use; the call takes 300 and keeps 50.
    dev, record = _FakeDevice(100, 5000), {}
    out, seconds, grown = device_growth(dev.work(300, kept=50), dev, allocate=_allocate,
                                        record=record)
    assert out == "done" and seconds >= 0 and grown == 300
    assert record == {"ballast_bytes": 4900, "bytes_in_use_before": 5000}
    # A call that allocates nothing grew by nothing (the ballast was at the peak).
    dev = _FakeDevice(100, 5000)
    assert device_growth(dev.work(0), dev, allocate=_allocate)[2] == 0
    # A call that raises the peak on its own is measured without a ballast.
    dev = _FakeDevice(100, 150)
    assert device_growth(dev.work(1000), dev, allocate=_allocate)[2] == 1000


def test_device_growth_tops_up_a_ballast_the_allocator_rounds_down():
    from benchmarks.device_memory import device_growth

    dev = _FakeDevice(100, 5000, rounding=10)  # each ballast 10 bytes short
    # Four ballasts leave it 7 bytes short of the peak: a 5-byte call stays under it.
    assert device_growth(dev.work(5), dev, allocate=_allocate)[2] is None
    dev = _FakeDevice(100, 5000, rounding=10)
    assert device_growth(dev.work(300), dev, allocate=_allocate)[2] == 300


def test_device_growth_without_a_ballast_measures_only_calls_above_the_peak(capsys):
    from benchmarks.device_memory import device_growth

    dev = _FakeDevice(100, 5000, refuse=True)
    assert device_growth(dev.work(300), dev, allocate=_allocate)[2] is None
    assert "no ballast" in capsys.readouterr().out
    dev = _FakeDevice(100, 5000, refuse=True)
    assert device_growth(dev.work(6000), dev, allocate=_allocate)[2] == 6000
    with pytest.raises(SystemExit, match="no peak_bytes_in_use"):
        device_growth(lambda: None, _FakeDevice(0, 0, stats=False), allocate=_allocate)


def test_the_ballast_is_allocated_on_the_device_it_names():
    import jax

    from benchmarks.device_memory import allocate_bytes

    device = jax.devices()[0]
    buf = allocate_bytes(device, 12345)
    assert buf.nbytes == 12345 and buf.devices() == {device} and not buf.any()


def test_a_gpu_result_renders_a_call_it_could_not_measure():
    from benchmarks.attack_memory import markdown

    row = {"victims": 64, "batch": 8, "planned_bytes": 2**30, "pretend_free_bytes": None,
           "measured_bytes": 2**29, "measured_second_bytes": None, "victims_per_call": 64,
           "second_seconds": 0.5}
    text = markdown({"commit": "abc", "device": "gpu: H100", "headroom": 0.8,
                     "plan_margin": 2.1, "measured_on": "gpu", "rows": [row]})
    assert "accelerator-memory growth" in text and "ballast" in text
    assert "| 64 | 8 | – | 1.000 | 0.500 | 0.50 | – | – | 64 | – | – | 0.50 |" in text
    split = dict(row, victims=256, victims_per_call=43, planned_per_call_bytes=2**29,
                 measured_second_bytes=2**29 + 2**28)
    text = markdown({"commit": "abc", "device": "gpu: H100", "headroom": 0.8,
                     "plan_margin": 2.1, "measured_on": "gpu", "rows": [split]})
    assert "| 256 | 8 | – | 1.000 | 0.500 | 0.50 | 0.750 | 0.75 | 43 | 0.500 | 1.50 | 0.50 |" in text


def test_an_unknown_device_is_refused():
    p = subprocess.run([sys.executable, "-m", "benchmarks.attack_memory", "--device", "tpu"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode != 0 and "--device" in p.stderr
