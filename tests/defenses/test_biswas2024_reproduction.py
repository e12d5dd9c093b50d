"""benchmarks/reproduce_biswas2024 end to end on a tiny synthetic dataset."""

import json

from benchmarks import reproduce_biswas2024 as biswas
from benchmarks.provenance import git_commit
from fedsim.data import synthetic_dataset


def test_smoke_run_records_command_and_commit(monkeypatch, tmp_path):
    monkeypatch.setattr(biswas, "load_dataset", lambda name, **kw: synthetic_dataset(
        seed=0, image_size=16, num_train=256, num_test=64))
    monkeypatch.setattr(biswas, "mechanisms", lambda: [
        ("none", None, []),
        ("gauss", 1.23, [{"name": "dp_gaussian", "noise_multiplier": 1.23, "clip_norm": 1.0}])])
    argv = ["--quick", "--ig-iterations", "2", "--ig-batch", "4", "--datasets", "synthetic",
            "--out", str(tmp_path)]
    result = biswas.main(argv)
    saved = json.loads((tmp_path / "biswas2024.json").read_text())
    assert saved["commit"] == git_commit() and saved["commit"] != "unknown"
    assert saved["command"] == "python -m benchmarks.reproduce_biswas2024 " + " ".join(argv)
    assert [r["mechanism"] for r in saved["rows"]] == ["none", "gauss"]
    assert saved["rows"][1]["epsilon"] > 0 and saved["rows"][0]["epsilon"] is None
    assert result["rows"][0]["accuracy"] == saved["rows"][0]["accuracy"]
    md = (tmp_path / "biswas2024.md").read_text()
    assert f"at commit {saved['commit']}" in md and saved["command"] in md
