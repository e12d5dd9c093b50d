"""benchmarks/vmapped_conv_cpu.py: argument checks, the two variants really differ, output."""

import json

import jax
import pytest

from benchmarks import vmapped_conv_cpu as bench
from fedsim import models


@pytest.mark.parametrize("argv, message", [
    (["--attack-batches", "0"], "--attack-batches must be >= 1"),
    (["--train-instances", "-1"], "--train-instances must be >= 1"),
    (["--reps", "0"], "--reps and --iterations must be >= 1"),
    (["--render", "missing.json"], "no such file"),
])
def test_rejects_bad_arguments(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit):
        bench.main([*argv, "--out", str(tmp_path)])
    assert message in capsys.readouterr().err


def test_small_run_writes_json_and_markdown(tmp_path):
    limit = models.VMAPPED_IM2COL_MAX_BATCH
    b = models.IM2COL_MAX_BATCH + 1  # above the plain batch rule
    result = bench.main(["--models", "lenet5", "--attack-batches", str(b), "--attack-instances",
                         "2", "--train-batches", str(b), "--train-instances", "2", "--reps", "1",
                         "--no-end-to-end", "--out", str(tmp_path)])
    assert models.VMAPPED_IM2COL_MAX_BATCH == limit and models._VMAPPED_DEPTH == 0
    rows = result["rows"]
    assert [r["workload"] for r in rows] == [f"attack b={b} V=2 own", f"attack b={b} V=2 shared",
                                             f"train B={b} V=2 own"]
    for r in rows:
        assert r["rule_ms"] > 0 and r["vmapped_ms"] > 0
        assert r["rule_error_vs_f64"] < 1e-3 and r["vmapped_error_vs_f64"] < 1e-3
        if jax.default_backend() == "cpu":
            # The hint really changes what is traced: XLA's convolutions without it, none with it.
            assert r["convolutions"]["rule"] > 0 and r["convolutions"]["vmapped"] == 0
    saved = json.loads((tmp_path / "vmapped_conv_cpu.json").read_text())
    assert saved["rows"] == rows and saved["vmapped_im2col_max_batch"] == limit
    md = (tmp_path / "vmapped_conv_cpu.md").read_text()
    assert f"| lenet5 | 32×32×1 | train B={b} V=2 own |" in md
    assert "## End to end" not in md
    (tmp_path / "vmapped_conv_cpu.md").unlink()
    bench.main(["--render", str(tmp_path / "vmapped_conv_cpu.json")])
    assert (tmp_path / "vmapped_conv_cpu.md").read_text() == md


@pytest.mark.slow
def test_end_to_end_rows(tmp_path):
    """The attack suite's IG loop with the hint off and on (compiles 2 loops)."""
    result = bench.main(["--models", "lenet5", "--attack-batches", "--train-batches",
                         "--end-to-end-batches", "5", "--iterations", "2", "--reps", "1",
                         "--out", str(tmp_path)])
    (e,) = result["end_to_end"]
    assert e["batch"] == 5 and e["iterations"] == 2
    for name in ("rule", "vmapped"):
        assert e[name]["seconds"] > 0 and len(e[name]["mse"]) == 4
    assert "## End to end" in (tmp_path / "vmapped_conv_cpu.md").read_text()
