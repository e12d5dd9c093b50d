"""benchmarks/chu2023_config_vs_part_b.py on two rounds of real Fashion-MNIST."""

import json

import pytest


@pytest.mark.slow
def test_the_config_run_equals_part_bs_federation_on_real_data(tmp_path):
    from benchmarks.chu2023_config_vs_part_b import main

    result = main(["--rounds", "2", "--out", str(tmp_path)])
    assert result["config_equals_train_b_every_round"] is True
    assert len(result["accuracy"]["config"]) == 2
    assert result["accuracy"]["recorded"] == []  # another round count: not compared
    saved = json.loads((tmp_path / "chu2023_config_vs_part_b.json").read_text())
    assert saved["accuracy"] == result["accuracy"]
    assert "Not compared with chu2023_B.json" in \
        (tmp_path / "chu2023_config_vs_part_b.md").read_text()
