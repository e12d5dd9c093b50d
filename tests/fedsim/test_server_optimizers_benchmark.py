"""benchmarks/server_optimizers_fmnist.py on a tiny synthetic federation."""

from __future__ import annotations

import json

import pytest

from benchmarks import server_optimizers_fmnist as bench


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("sof")
    result = bench.main(["--quick", "--rounds", "2", "--eval-every", "1", "--optimizers",
                         "yogi", "fedyogi", "--lrs", "0.01", "--out", str(out)])
    return out, result


def test_every_row_is_written_and_starts_from_the_same_round(tiny):
    out, result = tiny
    assert json.loads((out / "server_optimizers_fmnist.json").read_text())["rows"] == \
        json.loads(json.dumps(result["rows"]))
    rows = result["rows"]
    assert [(r["server_optimizer"], r["server_lr"]) for r in rows] == [("yogi", 0.01),
                                                                      ("fedyogi", 0.01)]
    assert rows[1]["hyperparameters"] == {"b1": 0.9, "b2": 0.999, "tau": 1e-3}
    for row in rows:
        assert [a["round"] for a in row["accuracy"]] == [1, 2]
        assert row["stopped_at_round"] is None and 0 <= row["final_accuracy"] <= 1
    # Same model, cohort and client keys: round 0's loss (before any server step)
    # is the same; the two rules' first server steps differ, and so round 1's loss.
    assert rows[0]["train_loss"][0] == rows[1]["train_loss"][0]
    assert rows[0]["train_loss"][1] != rows[1]["train_loss"][1]
    md = (out / "server_optimizers_fmnist.md").read_text()
    assert "| fedyogi | b1 0.9, b2 0.999, tau 0.001 |" in md
    assert "| yogi |" in md and "--quick" in md


def test_best_rows_skip_stopped_runs_and_the_markdown_names_them():
    rows = [{"server_optimizer": "fedadam", "server_lr": 0.1, "log10_server_lr": -1.0,
             "final_accuracy": None, "stopped_at_round": 3},
            {"server_optimizer": "fedadam", "server_lr": 0.01, "log10_server_lr": -2.0,
             "final_accuracy": 0.5, "stopped_at_round": None},
            {"server_optimizer": "adam", "server_lr": 0.01, "log10_server_lr": -2.0,
             "final_accuracy": None, "stopped_at_round": 0}]
    best = bench.best_rows(rows)
    assert best == {"fedadam": rows[1]}
    md = bench.markdown({
        "setting": {"dataset": "synthetic", "model": "mlp", "alpha": 0.3, "rounds": 4,
                    "quick": True, "seed": 0},
        "code": {"commit": "abc", "dirty": False}, "environment": {}, "seconds": 1.0,
        "optimizers": ["adam", "fedadam"], "log10_lrs": [-2.0, -1.0], "rows": rows,
        "best": best})
    assert "| fedadam | b1 0.9, b2 0.999, tau 0.001 | 0.5000 | stopped (round 3) |" in md
    assert "| adam | every lr stopped | 0.5000 (10^-2) |" in md
