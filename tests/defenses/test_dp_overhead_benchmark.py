"""benchmarks/dp_overhead.py: its output without the Opacus reference."""

import json

import pytest

from benchmarks import dp_overhead as bench


def test_writes_json_and_markdown_without_torch(tmp_path):
    bench.main(["--reps", "1", "--models", "mlp", "--torch-python", "", "--out", str(tmp_path)])
    out = json.loads((tmp_path / "dp_overhead.json").read_text())
    assert [(r["model"], r["batch"]) for r in out["rows"]] == [("mlp", 64), ("mlp", 128)]
    assert all(r["plain_ms"] > 0 and r["dp_ms"] > 0 for r in out["rows"])
    assert "skipped" in out["opacus"] and len(out["load_average_1min"]) == 2
    md = (tmp_path / "dp_overhead.md").read_text()
    assert "| mlp | 64 |" in md and "Opacus reference: no torch/opacus python" in md


def test_rejects_bad_reps(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--reps", "0"])
    assert "--reps must be >= 1" in capsys.readouterr().err
