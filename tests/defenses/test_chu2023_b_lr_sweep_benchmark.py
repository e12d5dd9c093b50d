"""benchmarks/chu2023_b_lr_sweep.py: argument checks and one tiny real sweep."""

import json

import pytest

from benchmarks import chu2023_b_lr_sweep as bench


@pytest.mark.parametrize("argv,message", [
    (["--lrs", "0"], "--lrs"),
    (["--rounds", "2"], "--rounds"),
    (["--max-test", "0"], "--max-test"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert message in capsys.readouterr().err


def test_a_tiny_sweep_reads_each_cells_last_rounds(tmp_path):
    try:
        from fedsim.data import load_dataset
        load_dataset("fashion_mnist", image_size=16)
    except Exception as e:  # files absent on this machine
        pytest.skip(f"real Fashion-MNIST unavailable: {e}")
    assert bench.main(["--model", "mlp", "--lrs", "0.1", "--seeds", "0", "1", "--rounds", "5",
                       "--max-test", "100", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "chu2023_b_lr_sweep.json").read_text())
    (s,) = result["summary"]
    assert s["seeds"] == [0, 1] and len(s["last5_per_seed"]) == 2
    # The reading is the mean of the cell's own last 5 evaluations.
    cell = tmp_path / "chu2023_b_lr_sweep" / "cells" / "training.lr=0.1__seed=0" / "metrics.jsonl"
    acc = [json.loads(line)["test_accuracy"] for line in cell.read_text().splitlines()]
    assert len(acc) == 5 and s["last5_per_seed"][0] == pytest.approx(sum(acc) / 5)
    assert "| 0.1 |" in (tmp_path / "chu2023_b_lr_sweep.md").read_text()
