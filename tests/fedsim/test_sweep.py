import json

import pytest

from fedsim.config import ConfigError
from fedsim.sweep import cell_config, cell_name, parse_grid, run_sweep

BASE = """
name: sw
data: {dataset: synthetic, num_clients: 4, image_size: 8, max_train: 200, max_test: 50}
model: {name: mlp}
training: {rounds: 2, clients_per_round: 2, client_parallelism: loop}
eval: {every: 1}
defenses: [{name: fake, kappa: 0.5}]
output: {progress: false, plots: false}
"""


def test_parse_grid_and_cell_names(tmp_path):
    grid = parse_grid(["seed=0,1", "model.name=mlp,lenet5", "defenses[0].kappa=0.1,0.3"])
    assert grid == [("seed", [0, 1]), ("model.name", ["mlp", "lenet5"]),
                    ("defenses[0].kappa", [0.1, 0.3])]
    assert cell_name({"seed": 0, "defenses[0].kappa": 0.1}) == "seed=0__defenses_0_.kappa=0.1"
    # 1e-05 is a float in the grid and in the cell's config (json.dumps writes it
    # without a dot, which YAML 1.1 would read back as a string).
    assert parse_grid(["training.lr=1e-5,1.0e-4"]) == [("training.lr", [1e-5, 1e-4])]
    raw = {"model": {"name": "mlp"}, "data": {"dataset": "synthetic"}}
    assert cell_config(raw, {"training.lr": 1e-5}, tmp_path, "c").training.lr == 1e-5
    for bad in (["seed"], ["seed="], ["seed=1", "seed=2"]):
        with pytest.raises(ConfigError):
            parse_grid(bad)
    # Once run as two cells of which the second was the first, skipped as done.
    with pytest.raises(ConfigError, match=r"--grid training.lr: value 0.1 given twice"):
        parse_grid(["training.lr=0.1,0.2,1e-1"])
    # Once silently ignored: the sweep sets these in every cell.
    for key in ("output.dir", "output.progress"):
        with pytest.raises(ConfigError, match=rf"--grid {key}: the sweep sets it for every cell"):
            parse_grid([f"{key}=a,b"])


def test_sweep_runs_grid_skips_finished_and_records_failures(tmp_path):
    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE)
    seen = []

    def fake_run(c):
        seen.append((c.seed, c.training.lr, c.defenses[0]["kappa"], c.output.dir))
        if c.training.lr == 9.0:
            raise FloatingPointError("diverged")
        summary = {"test_accuracy": c.seed + c.defenses[0]["kappa"], "seconds": 1.0}
        (tmp_path / "out" / "cells").mkdir(parents=True, exist_ok=True)
        from pathlib import Path
        Path(c.output.dir).mkdir(parents=True, exist_ok=True)
        (Path(c.output.dir) / "summary.json").write_text(json.dumps(summary))
        return summary

    grid = ["seed=0,1", "defenses[0].kappa=0.1,0.3", "training.lr=0.5,9.0"]
    rows = run_sweep(cfg, grid, tmp_path / "out", run_fn=fake_run, log=lambda m: None)
    assert len(rows) == 8 and len(seen) == 8
    assert {r["status"] for r in rows} == {"done", "failed: FloatingPointError: diverged"}
    assert len({s[3] for s in seen}) == 8  # one directory per cell
    table = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["cell"] for r in table["rows"]] == [r["cell"] for r in rows]
    assert "kappa" in (tmp_path / "out" / "results.md").read_text()
    # Second invocation: finished cells are skipped, failed ones retried.
    seen.clear()
    rows2 = run_sweep(cfg, grid, tmp_path / "out", run_fn=fake_run, log=lambda m: None)
    assert len(seen) == 4 and all(s[1] == 9.0 for s in seen)
    assert sum(r["status"] == "done (skipped)" for r in rows2) == 4


def test_a_seed_axis_is_summarised_over_seeds_per_other_setting(tmp_path):
    import numpy as np

    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE)

    def fake_run(c):
        if c.seed == 2 and c.defenses[0]["kappa"] == 0.3:
            raise FloatingPointError("diverged")  # a failed cell is not counted
        return {"test_accuracy": 0.5 + 0.1 * c.seed ** 2 + c.defenses[0]["kappa"],
                "epsilon": float("inf") if c.seed == 1 else 2.0 + c.seed, "client_parallelism": "loop"}

    grid = ["seed=0,1,2", "defenses[0].kappa=0.1,0.3"]
    run_sweep(cfg, grid, tmp_path / "out", run_fn=fake_run, log=lambda m: None)
    seeds = json.loads((tmp_path / "out" / "results.json").read_text())["over_seeds"]
    assert [(e["defenses[0].kappa"], e["cells"], e["done"]) for e in seeds] == [(0.1, 3, 3), (0.3, 3, 2)]
    for entry, kappa, used in ((seeds[0], 0.1, [0, 1, 2]), (seeds[1], 0.3, [0, 1])):
        acc = np.array([0.5 + 0.1 * s ** 2 + kappa for s in used])
        assert entry["test_accuracy"]["n"] == len(used)
        np.testing.assert_allclose(entry["test_accuracy"]["mean"], acc.mean(), rtol=1e-12)
        np.testing.assert_allclose(entry["test_accuracy"]["std"], acc.std(ddof=1), rtol=1e-12)
        assert "client_parallelism" not in entry  # not a number
    # seed 1's infinite epsilon is left out of the count, not averaged in
    assert seeds[0]["epsilon"] == {"mean": 3.0, "std": np.std([2.0, 4.0], ddof=1), "n": 2}
    assert seeds[1]["epsilon"] == {"mean": 2.0, "std": None, "n": 1}
    md = (tmp_path / "out" / "results.md").read_text()
    assert "Over seeds" in md and "| 0.3 | 2 / 3 |" in md
    # No seed axis, or one seed: no summary.
    run_sweep(cfg, ["seed=0", "defenses[0].kappa=0.1,0.3"], tmp_path / "one", run_fn=fake_run,
              log=lambda m: None)
    assert "over_seeds" not in json.loads((tmp_path / "one" / "results.json").read_text())


@pytest.mark.parametrize("plots", [True, False])
def test_a_sweep_plots_its_cells_learning_curves_where_plots_are_on(tmp_path, plots,
                                                                    monkeypatch):
    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE)
    drawn = []

    def fake_run(c):
        from pathlib import Path
        Path(c.output.dir).mkdir(parents=True)
        if c.seed == 1:  # a cell that failed before its first round: no rows to draw
            raise RuntimeError("no rows")
        rows = [{"round": 0, "train_loss": 2.0, "test_accuracy": 0.1 + c.seed}]
        (Path(c.output.dir) / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
        return {"test_accuracy": 0.1}

    import fedsim.compare
    original = fedsim.compare.plot_learning_curves

    def recording(names, runs, path):
        drawn.append((names, [r["rows"][0]["test_accuracy"] for r in runs]))
        original(names, runs, path)

    monkeypatch.setattr(fedsim.compare, "plot_learning_curves", recording)
    run_sweep(cfg, ["seed=0,1,2"], tmp_path / "out", [f"output.plots={str(plots).lower()}"],
              run_fn=fake_run, log=lambda m: None)
    png = tmp_path / "out" / "learning_curves.png"
    if plots:
        assert drawn == [(["seed=0", "seed=2"], [0.1, 2.1])]
        assert png.read_bytes()[:4] == b"\x89PNG"
    else:
        assert drawn == [] and not png.exists()


def test_sweep_bad_key_fails_before_running(tmp_path):
    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE)
    with pytest.raises(ConfigError, match="defenses\\[3\\]"):
        run_sweep(cfg, ["defenses[3].kappa=1,2"], tmp_path / "o", run_fn=lambda c: {})
    with pytest.raises(ConfigError, match="training.rounds"):
        run_sweep(cfg, ["training.rounds=0,1"], tmp_path / "o", run_fn=lambda c: {})


@pytest.mark.slow
def test_sweep_end_to_end_cli(tmp_path):
    from fedsim.cli import main
    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE.replace("defenses: [{name: fake, kappa: 0.5}]\n", ""))
    rc = main(["sweep", str(cfg), "--grid", "seed=0,1", "--out", str(tmp_path / "s")])
    assert rc == 0
    rows = json.loads((tmp_path / "s" / "results.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["done", "done"]
    assert rows[0]["test_accuracy"] != rows[1]["test_accuracy"] or rows[0]["final_train_loss"] != rows[1]["final_train_loss"]
    assert main(["sweep", str(cfg), "--grid", "seed=0,1", "--out", str(tmp_path / "s")]) == 0
    rows = json.loads((tmp_path / "s" / "results.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["done (skipped)", "done (skipped)"]
