"""benchmarks/engine_throughput.py: its plan, caps, labels, checks and tables.

The timing itself is the benchmark's job; these tests check the bookkeeping
around it (which rows run, how they are named and compared), including the
accelerator mode (torch on ``cuda``, peak accelerator memory) that this
machine cannot run.
"""

import subprocess
import sys

import pytest

from benchmarks import engine_throughput as et


def test_build_plan_caps_each_impl_and_names_what_it_skipped():
    impls = ["fedsim-auto", "fedsim-vmap", "torch-loop"]
    plan, skipped = et.build_plan([10, 1000, 5000], impls, {"torch-loop": 1000},
                                  torch_threads=[1, 2])
    assert plan == [("fedsim-auto", 10, 1), ("fedsim-vmap", 10, 1), ("torch-loop", 10, 1),
                    ("torch-loop", 10, 2), ("fedsim-auto", 1000, 1), ("fedsim-vmap", 1000, 1),
                    ("torch-loop", 1000, 1), ("torch-loop", 1000, 2), ("fedsim-auto", 5000, 1),
                    ("fedsim-vmap", 5000, 1)]
    assert skipped == ["torch-loop at N=5000"]


def test_parse_caps_rejects_unknown_impls_and_malformed_specs():
    impls = list(et.FEDSIM_IMPLS) + ["torch-loop"]
    assert et.parse_caps(["torch-loop=1000", "fedsim-map=100"], impls) == {
        "torch-loop": 1000, "fedsim-map": 100}
    with pytest.raises(SystemExit, match="unknown impl 'fedsim-pmap'"):
        et.parse_caps(["fedsim-pmap=10"], impls)
    with pytest.raises(SystemExit, match="expected IMPL=N"):
        et.parse_caps(["torch-loop"], impls)
    with pytest.raises(SystemExit, match="expected IMPL=N"):
        et.parse_caps(["torch-loop=many"], impls)


@pytest.mark.parametrize("argv, message", [
    (["--impl-max-clients", "torch=10"], "unknown impl 'torch'"),
    (["--torch-device", "gpu"], "invalid choice: 'gpu'"),
    (["--torch-threads", "0"], "--torch-threads must be >= 1"),
    (["--clients", "0", "10"], "--clients must be >= 1"),
    (["--impls", "fedsim-pmap"], "--impls: unknown ['fedsim-pmap']"),
    (["--impls", "torch-loop:rule"], "--impls: unknown ['torch-loop:rule']"),
    (["--precision", "tf32"], "invalid choice: 'tf32'"),
])
def test_cli_names_bad_arguments_before_running_anything(argv, message):
    p = subprocess.run([sys.executable, et.__file__, *argv],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert message in p.stderr


def _row(impl, clients, seconds, **extra):
    return {"impl": impl, "clients": clients, "seconds_per_round": seconds,
            "peak_rss_mb": 500.0, "loadavg_1min_before": 0.5, **extra}


def test_gpu_rows_are_labelled_by_device_and_compared_with_auto():
    rows = [_row("fedsim-auto", 100, 0.02, device_peak_mb=300.0, strategy_reason="auto -> vmap",
                 calibration_seconds=4.0),
            _row("fedsim-vmap", 100, 0.019, device_peak_mb=310.0),
            _row("fedsim-loop", 100, 0.5, device_peak_mb=40.0),
            _row("torch-loop", 100, 0.3, threads=1, torch_device="cuda", device_peak_mb=20.0)]
    assert et.label(rows[3]) == "torch-loop (cuda)"
    assert et.label(_row("torch-loop", 100, 0.3, threads=2)) == "torch-loop (2 thr)"
    lines = et.checks(rows)
    assert lines[0] == "N=100: auto/best fixed (fedsim-vmap) = 1.05 (PASS: ≤ 1.10)"
    assert lines[1] == "N=100: torch-loop (cuda)/fedsim-auto = 15.00× (PASS: ≥ 1.5×)"
    result = {"rows": rows, "checks": lines, "device": "gpu: NVIDIA H200; x86; 16 cores",
              "jax": "0", "torch": "0", "mode": "full", "repeats": 3, "passes": 1,
              "argv": ["--torch-device", "cuda"], "date": "d", "commit": "0" * 40,
              "skipped": []}
    md = et.markdown(result)
    assert "| torch-loop (cuda) | 0.300 (500; 20) |" in md
    assert "| fedsim-vmap | 0.019 (500; 310) |" in md
    assert "peak accelerator MiB" in md
    assert "phase packing is CPU-only" in md and "shared 2-core machine" not in md


def test_cpu_rows_keep_the_cpu_table():
    rows = [_row("fedsim-auto", 10, 0.07), _row("torch-loop", 10, 0.2, threads=1),
            _row("torch-loop", 10, 0.1, threads=2)]
    lines = et.checks(rows)
    assert lines == ["N=10: torch-loop (1 thr)/fedsim-auto = 2.86×",
                     "N=10: torch-loop (2 thr)/fedsim-auto = 1.43×"]
    result = {"rows": rows, "checks": lines, "device": "cpu: cpu; AMD EPYC; 2 cores",
              "jax": "0", "torch": "0", "mode": "full", "repeats": 3, "passes": 1,
              "argv": [], "date": "d", "commit": "0" * 40, "skipped": []}
    md = et.markdown(result)
    assert "## Seconds per round (peak RSS MiB)" in md
    assert "| torch-loop (2 thr) | 0.100 (500) |" in md
    assert "phase-packed" in md and "shared 2-core machine: noisy" in md


def test_the_fedsim_rows_precision_is_stated():
    rows = [_row("fedsim-vmap", 10, 0.02, matmul_precision="default"),
            _row("torch-loop", 10, 0.2, threads=1)]
    result = {"rows": rows, "checks": [], "device": "gpu: NVIDIA H200; x86; 16 cores",
              "jax": "0", "torch": "0", "mode": "full", "repeats": 3, "passes": 1,
              "argv": [], "date": "d", "commit": "0" * 40, "skipped": []}
    assert "ran at XLA precision `default`" in et.markdown(result)
    rows[0].pop("matmul_precision")  # rows written before the key existed
    assert "XLA precision" not in et.markdown(result)


def test_pooled_passes_keep_the_larger_accelerator_peak():
    a = _row("fedsim-vmap", 10, 0.02, round_seconds=[0.02], device_peak_mb=100.0,
             device_round_growth_mb=30.0)
    b = _row("fedsim-vmap", 10, 0.04, round_seconds=[0.04], device_peak_mb=150.0,
             device_round_growth_mb=20.0)
    (row,) = et.pool_passes([a, b])
    assert row["device_peak_mb"] == 150.0 and row["passes"] == 2
    assert row["device_round_growth_mb"] == 30.0
    assert row["seconds_per_round"] == pytest.approx(0.03)


def test_a_rounds_accelerator_memory_is_set_beside_its_plan():
    rows = [_row("fedsim-vmap", 1000, 0.1, device_peak_mb=4125.0, device_round_growth_mb=1239.0,
                 strategy="vmap", memory_plan={"planned_bytes": 2478 * 2**20}),
            _row("fedsim-chunked", 1000, 0.3, device_peak_mb=512.0, strategy="chunked",
                 device_round_growth_mb=None, memory_plan=None),
            _row("torch-loop", 1000, 2.0, threads=1, torch_device="cuda", device_peak_mb=20.0)]
    result = {"rows": rows, "checks": [], "device": "gpu: NVIDIA H100; x86; 16 cores",
              "jax": "0", "torch": "0", "mode": "full", "repeats": 3, "passes": 1,
              "argv": [], "date": "d", "commit": "0" * 40, "skipped": []}
    md = et.markdown(result)
    assert "## Accelerator memory of one round against the plan" in md
    assert "| fedsim-vmap | 1000 | vmap | 4125 | 1239 | 2478 | 0.50 |" in md
    assert "| fedsim-chunked | 1000 | chunked | 512 | – | – | – |" in md
    assert "| torch-loop | 1000 |" not in md
    cpu = dict(result, rows=[_row("fedsim-vmap", 10, 0.02)], device="cpu: x; 2 cores")
    assert "Accelerator memory" not in et.markdown(cpu)


def test_the_measured_round_follows_the_timed_ones(monkeypatch):
    from benchmarks import device_memory

    ran = []

    class Sim:
        def run_round(self, state, index):
            ran.append((state, index))
            return type("State", (), {"params": {"w": 1.0}})(), "result"

    def growth(call, device, record):
        record["ballast_bytes"] = 2**20
        return call(), 0.1, 3 * 2**20
    monkeypatch.setattr(device_memory, "device_growth", growth)
    assert et.device_round_growth_mb(Sim(), "state", 4) == 3.0
    assert ran == [("state", 4)]


def test_rule_rows_are_compared_with_their_hinted_impl_and_not_counted_as_fixed():
    rows = [_row("fedsim-auto", 100, 0.40), _row("fedsim-loop", 100, 0.45),
            _row("fedsim-chunked", 100, 0.36), _row("fedsim-chunked:rule", 100, 0.18),
            _row("fedsim-vmap:rule", 100, 2.4), _row("fedsim-vmap", 100, 0.6)]
    lines = et.checks(rows)
    # The :rule rows are the old behaviour, not a strategy auto can choose.
    assert lines[0] == "N=100: auto/best fixed (fedsim-chunked) = 1.11 (FAIL: ≤ 1.10)"
    assert ("N=100: fedsim-vmap:rule/fedsim-vmap = 4.00× (information: the vmapped-im2col "
            "hint's effect)") in lines
    assert any(line.startswith("N=100: fedsim-chunked:rule/fedsim-chunked = 0.50×")
               for line in lines)
