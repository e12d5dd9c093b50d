"""benchmarks/diagnose_vgg_init.py: a tiny run's readings and argument errors."""

import json

import numpy as np
import pytest

from benchmarks import diagnose_vgg_init as diag
from fedsim import data


@pytest.fixture
def tiny(monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(64, 8, 8, 1)).astype(np.float32)
    y = (np.arange(64) % 10).astype(np.int32)
    ds = data.Dataset(name="tiny", x_train=x, y_train=y, x_test=x[:16], y_test=y[:16],
                      num_classes=10, mean=x.mean((0, 1, 2)), std=x.std((0, 1, 2)))
    monkeypatch.setattr(data, "load_dataset", lambda name, image_size=None, seed=None: ds)
    return ds


def test_small_run_records_both_inits_on_the_same_batches(tmp_path, tiny):
    result = diag.main(["--steps", "2", "--every", "1", "--lrs", "0.1", "--batch", "8",
                        "--test-examples", "16", "--out", str(tmp_path)])
    rows = result["rows"]
    assert [(r["init"], r["lr"]) for r in rows] == [("lecun", 0.1), ("he", 0.1)]
    for r in rows:
        assert [c["step"] for c in r["curve"]] == [1, 2]
        assert all(np.isfinite(c["loss"]) and 0 <= c["accuracy"] <= 1 for c in r["curve"])
    # He's variance-2/fan-in kernels carry more signal to the top of the stack.
    assert rows[1]["last_conv_variance_at_init"] > 4 * rows[0]["last_conv_variance_at_init"]
    saved = json.loads((tmp_path / "vgg_init.json").read_text())
    assert saved["rows"] == rows and saved["settings"]["batch"] == 8
    md = (tmp_path / "vgg_init.md").read_text()
    assert "| lecun | 0.1 |" in md and "| he | 0.1 |" in md


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "--steps must be >= 1"),
    (["--steps", "5", "--every", "6"], "--every (6) must be at most --steps (5)"),
    (["--lrs", "0"], "--lrs must be > 0"),
    (["--batch", "65"], "--batch 65 exceeds the 64 training examples"),
])
def test_bad_arguments_are_named(argv, message, capsys, tiny):
    with pytest.raises(SystemExit):
        diag.main(argv)
    assert message in capsys.readouterr().err
