"""benchmarks/conv_im2col_cpu.py: argument checks, both implementations really differ, output."""

import json

import pytest

from benchmarks import conv_im2col_cpu as bench
from fedsim import models


def test_rejects_bad_arguments(capsys, tmp_path):
    with pytest.raises(SystemExit):
        bench.main(["--train-batches", "0", "--out", str(tmp_path)])
    assert "--train-batches must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--per-example-batches", "-2", "--out", str(tmp_path)])
    assert "--per-example-batches must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--render", str(tmp_path / "missing.json")])
    assert "no such file" in capsys.readouterr().err


def run_small(tmp_path, *extra):
    return bench.main(["--models", "lenet", "--train-batches", "2", "--per-example-batches",
                       "2", "--attack-batches", "1", "--attack-instances", "2",
                       "--reps", "1", "--out", str(tmp_path), *extra])


def test_small_run_writes_json_and_markdown(tmp_path):
    limit = models.IM2COL_MAX_BATCH
    result = run_small(tmp_path, "--no-end-to-end")
    assert models.IM2COL_MAX_BATCH == limit  # restored
    rows = result["rows"]
    assert [r["workload"] for r in rows] == ["train B=2", "per-example B=2",
                                             "attack b=1 V=2 shared", "attack b=1 V=2 own"]
    for r in rows:
        assert r["xla_ms"] > 0 and r["im2col_ms"] > 0
        # Both float32 implementations are close to float64, and they are two different
        # computations (a switch that silently kept one implementation would give equal errors
        # on every row).
        assert r["xla_error_vs_f64"] < 1e-3 and r["im2col_error_vs_f64"] < 1e-3
    assert any(r["xla_error_vs_f64"] != r["im2col_error_vs_f64"] for r in rows)
    assert result["end_to_end"] == []
    saved = json.loads((tmp_path / "conv_im2col_cpu.json").read_text())
    assert saved["rows"] == rows and saved["im2col_max_batch"] == limit
    assert saved["argv"][:2] == ["--models", "lenet"]
    md = (tmp_path / "conv_im2col_cpu.md").read_text()
    assert "| lenet | 32×32×3 | attack b=1 V=2 own |" in md
    assert "## End to end" not in md
    assert "conv_im2col_cpu.py --models lenet --train-batches 2" in md
    (tmp_path / "conv_im2col_cpu.md").unlink()
    bench.main(["--render", str(tmp_path / "conv_im2col_cpu.json")])
    assert (tmp_path / "conv_im2col_cpu.md").read_text() == md


@pytest.mark.slow
def test_end_to_end_rows(tmp_path):
    """The attack suite's DLG and GS loops under both implementations (compiles 4 loops)."""
    result = run_small(tmp_path, "--dlg-iterations", "2", "--gs-iterations", "2")
    assert [e["attack"].split(",")[0] for e in result["end_to_end"]] == ["DLG", "GS"]
    for e in result["end_to_end"]:
        for impl in ("xla", "im2col"):
            assert e[impl]["seconds"] > 0 and len(e[impl]["mse"]) == 4
    assert "## End to end" in (tmp_path / "conv_im2col_cpu.md").read_text()
