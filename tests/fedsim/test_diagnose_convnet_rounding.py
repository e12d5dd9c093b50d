"""benchmarks/diagnose_convnet_rounding.py on the MLP alone: a smooth model moves by rounding."""

import json

import pytest

from benchmarks import diagnose_convnet_rounding as D


def test_the_mlps_update_moves_by_roundings_size_and_the_files_say_how_they_were_made(
        tmp_path, monkeypatch):
    # The commit is read once, when the run starts: a commit made while it runs
    # (a later read) is not the code that ran.
    reads = iter(f"commit-{i}" for i in range(100))
    monkeypatch.setattr(D, "git_commit", lambda: next(reads))
    result = D.main(["--models", "mlp", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "diagnose_convnet_rounding.json").read_text())
    assert saved["rows"] == result["rows"]
    assert saved["commit"] == "commit-0"
    assert [(r["client"], r["epsilon"]) for r in saved["rows"]] == [(0, 1e-7), (0, 1e-6),
                                                                    (3, 1e-7), (3, 1e-6)]
    for r in saved["rows"]:
        assert r["model"] == "mlp" and 0 < r["max_change"] < 1e-5 < r["max_update"]
    assert saved["command"].endswith("--models mlp")
    assert "| mlp | 0 | 1e-07 |" in (tmp_path / "diagnose_convnet_rounding.md").read_text()


def test_an_unknown_model_is_named(capsys):
    with pytest.raises(SystemExit):
        D.main(["--models", "mlp,convnet_nb"])
    assert "--models: unknown model(s) ['convnet_nb']" in capsys.readouterr().err
