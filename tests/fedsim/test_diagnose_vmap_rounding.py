"""benchmarks/diagnose_vmap_rounding.py on the MLP alone: the float64 programs agree to rounding."""

import json

import pytest

from benchmarks import diagnose_vmap_rounding as D


def test_the_mlps_vmapped_and_single_clients_agree_and_sit_near_float64(tmp_path, monkeypatch):
    # Ten local steps (B = 16): where the batch order must match across precisions.
    # The commit is read once, when the run starts: a commit made while it runs
    # (a later read) is not the code that ran.
    reads = iter(f"commit-{i}" for i in range(100))
    monkeypatch.setattr(D, "git_commit", lambda: next(reads))
    result = D.main(["--models", "mlp", "--batch-sizes", "16", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "diagnose_vmap_rounding.json").read_text())
    assert saved["rows"] == result["rows"]
    assert saved["commit"] == "commit-0"
    assert [(r["batch_size"], r["unroll_steps"]) for r in saved["rows"]] == [(16, 0), (16, 32)]
    for r in saved["rows"]:
        assert r["model"] == "mlp" and len(r["clients"]) == 3
        assert r["steps"] == 10
        assert r["f64_vmap_vs_alone"] < 1e-12
        # The same batches in both precisions: a smooth model differs by rounding.
        assert r["f32_alone_vs_f64"] < 1e-5 < r["max_update"]
        assert r["f32_vmap_vs_f64"] < 1e-5
    assert saved["command"].endswith("--models mlp --batch-sizes 16")
    assert "| mlp | 16 | 10 | 0 |" in (tmp_path / "diagnose_vmap_rounding.md").read_text()


def test_an_unknown_model_or_a_bad_batch_size_is_named(capsys):
    with pytest.raises(SystemExit):
        D.main(["--models", "mlp,convnet_nb"])
    assert "--models: unknown model(s) ['convnet_nb']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        D.main(["--models", "mlp", "--batch-sizes", "16,x"])
    assert "--batch-sizes: expected positive integers, got '16,x'" in capsys.readouterr().err
