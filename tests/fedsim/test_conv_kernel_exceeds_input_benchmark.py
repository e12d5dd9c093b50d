"""benchmarks/conv_kernel_exceeds_input_cpu.py: a tiny run's readings and argument errors."""

import json

import jax
import pytest

from benchmarks import conv_kernel_exceeds_input_cpu as bench
from fedsim import models


def test_small_run_writes_json_and_markdown(tmp_path):
    if jax.default_backend() != "cpu":
        pytest.skip("measures XLA:CPU")
    before = models.CONV_IMPLEMENTATION
    result = bench.main(["--batches", "2", "--models", "vgg11", "--image-size", "8",
                         "--eval-batch", "6", "--train-batch", "5", "--reps", "1",
                         "--out", str(tmp_path)])
    assert models.CONV_IMPLEMENTATION == before  # each implementation forced, then restored
    layers = result["layers"]
    assert len(layers) == len(bench.LAYERS)
    assert [r["kernel_exceeds_input"] for r in layers] == [h < 3 for h, _, _ in bench.LAYERS]
    for r in layers:
        assert r["xla_ms"] > 0 and r["im2col_ms"] > 0
        assert r["xla_over_im2col"] == pytest.approx(r["xla_ms"] / r["im2col_ms"])
    assert [r["workload"] for r in result["models"]] == ["forward B=6", "train step B=5"]
    for r in result["models"]:
        # auto and XLA-everywhere differ (im2col in the 2×2 and 1×1 layers) but agree.
        assert 0 < r["max_relative_difference"] < 1e-4
    saved = json.loads((tmp_path / "conv_kernel_exceeds_input_cpu.json").read_text())
    assert saved["layers"] == layers and saved["im2col_max_batch"] == models.IM2COL_MAX_BATCH
    md = (tmp_path / "conv_kernel_exceeds_input_cpu.md").read_text()
    assert "| 2 | 2×2 | 256→512 | yes |" in md
    assert "| vgg11 | 8×8×1 | forward B=6 |" in md


@pytest.mark.parametrize("argv,message", [
    (["--batches", "0"], "--batches must be >= 1"),
    (["--reps", "0"], "--reps must be >= 1"),
    (["--eval-batch", "0"], "--eval-batch must be >= 1"),
    (["--models", "vgg12"], "unknown model"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert message in capsys.readouterr().err
