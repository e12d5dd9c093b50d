"""benchmarks/attack_split_determinism.py: argument checks and one small real run."""

import json

import pytest

from benchmarks import attack_split_determinism as bench


@pytest.mark.parametrize("argv,message", [
    (["--victims", "1"], "--victims"),
    (["--victims", "4", "--splits", "4"], "--splits"),
    (["--victims", "4", "--splits", "0"], "--splits"),
    (["--iterations-scale", "0"], "--iterations-scale"),
])
def test_bad_arguments_are_named_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.slow  # ~25 s of compiles on the 2-core CPU
def test_one_small_run_compares_each_split_with_one_call(tmp_path):
    try:
        from fedsim.data import load_dataset
        load_dataset("fashion_mnist", image_size=16)
    except Exception as e:  # files absent on this machine
        pytest.skip(f"real Fashion-MNIST unavailable: {e}")
    assert bench.main(["--victims", "2", "--splits", "1", "--attacks", "ig_unsigned",
                       "--iterations-scale", "0.005", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "attack_split_determinism.json").read_text())["rows"]
    assert [r["victims_per_call"] for r in rows] == [2, 2, 1]
    assert rows[0]["reference"] and rows[0]["config"]["iterations"] == 5
    # The same call twice gives the same numbers: any difference is the split's.
    assert rows[1]["identical"] and rows[1]["max_abs_dx"] == 0.0
    assert len(rows[2]["psnr"]) == 2 and rows[2]["max_abs_dx"] >= 0.0
    md = (tmp_path / "attack_split_determinism.md").read_text()
    assert "| ig_unsigned | 5 | 1 |" in md
