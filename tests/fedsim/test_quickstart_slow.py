"""The engine's acceptance run: quickstart on real Fashion-MNIST (slow)."""

import json
import time
from pathlib import Path

import pytest

from fedsim.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(),
                    reason="apt package dataset-fashion-mnist not installed")
def test_quickstart_reaches_080_in_under_ten_minutes(tmp_path):
    t0 = time.perf_counter()
    assert main(["run", str(ROOT / "configs/quickstart.yaml"), "--quiet",
                 "--set", f"output.dir={tmp_path}"]) == 0
    elapsed = time.perf_counter() - t0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["test_accuracy"] >= 0.80
    assert summary["num_clients"] == 100 and summary["clients_per_round"] == 10
    assert elapsed < 600
