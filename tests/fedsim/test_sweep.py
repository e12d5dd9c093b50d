import json
from pathlib import Path

import pytest

from fedsim.config import ConfigError, dump_config
from fedsim.sweep import cell_config, cell_name, parse_grid, run_sweep

BASE = """
name: sw
data: {dataset: synthetic, num_clients: 4, image_size: 8, max_train: 200, max_test: 50}
model: {name: mlp}
training: {rounds: 2, clients_per_round: 2, client_parallelism: loop}
eval: {every: 1}
defenses: [{name: dp_vmf, kappa: 0.5}]
output: {progress: false, plots: false}
"""


def _write_cell(c, summary):
    """What run_simulation leaves in a finished cell: its config.yaml first, summary.json last."""
    out = Path(c.output.dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(dump_config(c))
    (out / "summary.json").write_text(json.dumps(summary))


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
        _write_cell(c, summary)
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


def test_the_adaptive_clip_norm_is_a_column_only_where_a_cell_reports_it(tmp_path):
    """adaptive_client_level_dp's released clip norm (summary.json) is tabulated
    and summarised over seeds; a sweep whose cells do not report it has no such column."""
    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE)

    def adaptive(c):
        return {"test_accuracy": 0.5, "adaptive_clip_norm": 0.25 * (c.seed + 1)}

    run_sweep(cfg, ["seed=0,1"], tmp_path / "a", run_fn=adaptive, log=lambda m: None)
    table = json.loads((tmp_path / "a" / "results.json").read_text())
    assert [r["adaptive_clip_norm"] for r in table["rows"]] == [0.25, 0.5]
    assert table["over_seeds"][0]["adaptive_clip_norm"]["mean"] == pytest.approx(0.375)
    header = (tmp_path / "a" / "results.md").read_text().splitlines()[0]
    assert "| adaptive_clip_norm |" in header
    run_sweep(cfg, ["seed=0,1"], tmp_path / "f", run_fn=lambda c: {"test_accuracy": 0.5},
              log=lambda m: None)
    assert "adaptive_clip_norm" not in (tmp_path / "f" / "results.md").read_text()


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



def test_a_finished_cell_is_reused_only_under_the_config_it_ran_with(tmp_path):
    # Before, a cell counted as done whenever its summary.json existed: after
    # --set training.lr=0.5 the table showed the lr 0.05 numbers as lr 0.5's.
    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE)
    ran = []

    def fake_run(c):
        ran.append((c.seed, c.training.lr, c.training.rounds))
        summary = {"test_accuracy": c.training.lr}
        _write_cell(c, summary)
        return summary

    def sweep(*sets, out="out"):
        return run_sweep(cfg, ["seed=1,2"], tmp_path / out, list(sets), run_fn=fake_run,
                         log=lambda m: None)

    assert [r["status"] for r in sweep("training.lr=0.05")] == ["done", "done"]
    # Unchanged, or changed only in a label or in where and how often files
    # are written: reused.
    for sets in ((), ("name=other", "output.plots=true", "output.checkpoint_every=3")):
        ran.clear()
        rows = sweep("training.lr=0.05", *sets)
        assert ran == [] and [r["status"] for r in rows] == ["done (skipped)"] * 2
        assert [r["test_accuracy"] for r in rows] == [0.05, 0.05]
    # Another value of a key that changes the numbers, also through a bare
    # name, another round count, or a defense argument: refused by cell and
    # key, before anything runs, and the cells are left as they were.
    before = (tmp_path / "out" / "results.json").read_text()
    for sets, said in ((("lr=0.5",), "training.lr: 0.05 there, 0.5 now"),
                       (("training.lr=0.05", "rounds=3"), "training.rounds: 2 there, 3 now"),
                       (("training.lr=0.05", "defenses=[{name: dp_vmf, kappa: 0.7}]"),
                        "defenses[0].kappa: 0.5 there, 0.7 now"),
                       (("training.lr=0.05", "defenses=[{name: dp_vmf, kappa: 0.5, clip_norm: 2}]"),
                        "defenses[0].clip_norm: (absent) there, 2 now")):
        with pytest.raises(ConfigError) as e:
            sweep(*sets)
        assert "sweep cell 'seed=1' finished under another config" in str(e.value)
        assert said in str(e.value)
        assert "(1 more finished cell(s) differ too: seed=2)" in str(e.value)
        assert f"delete {tmp_path / 'out' / 'cells' / 'seed=1'}" in str(e.value)
        assert "use another --out" in str(e.value)
        assert ran == []
    assert (tmp_path / "out" / "results.json").read_text() == before
    # 1 and 1.0 are one setting; a fresh sweep directory runs the new config.
    assert [r["status"] for r in sweep("training.lr=0.05", "defenses=[{name: dp_vmf, kappa: 0.5}]")
            ] == ["done (skipped)"] * 2
    assert [r["test_accuracy"] for r in sweep("lr=0.5", out="out2")] == [0.5, 0.5]
    # A finished cell whose config.yaml is gone (or unreadable) cannot be
    # checked: refused, naming the file.
    (tmp_path / "out" / "cells" / "seed=2" / "config.yaml").unlink()
    with pytest.raises(ConfigError, match=r"sweep cell 'seed=2' is finished \(summary.json\), "
                                          r"but .*seed=2/config.yaml is missing"):
        sweep("training.lr=0.05")
    (tmp_path / "out" / "cells" / "seed=2" / "config.yaml").write_text("training: [")
    with pytest.raises(ConfigError, match=r"seed=2/config.yaml cannot be read as a config"):
        sweep("training.lr=0.05")


def test_grid_keys_are_compared_as_the_config_keys_they_set():
    # Before, 'lr' next to 'training.lr' ran every cell with training.lr's value
    # (the table said otherwise), and 'dir' slipped past output.dir's refusal.
    with pytest.raises(ConfigError, match=r"--grid: keys 'lr' and 'training.lr' both set "
                                          r"training.lr"):
        parse_grid(["lr=0.1,0.2", "training.lr=0.3"])
    for key in ("dir", "progress"):
        with pytest.raises(ConfigError, match=rf"--grid {key}: the sweep sets it for every cell "
                                              rf"\(output.{key} = "):
            parse_grid([f"{key}=a,b"])
    with pytest.raises(ConfigError, match=r"^--grid nope: unknown config key"):
        parse_grid(["nope=1,2"])
    # Keys keep the spelling given: they name the cells and the table's columns.
    assert parse_grid(["lr=0.1", "defenses[0].kappa=0.2", "attack.config.iterations=5"]) == [
        ("lr", [0.1]), ("defenses[0].kappa", [0.2]), ("attack.config.iterations", [5])]


def test_cells_whose_names_collide_get_names_of_their_own(tmp_path):
    # Before, '/d/a b' and '/d/a_b' both ran in cells/data.data_dir=_d_a_b: the
    # second was skipped as done and reported the first one's numbers.
    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE.replace("dataset: synthetic", "dataset: fashion_mnist"))  # has a data_dir
    seen = []

    def fake_run(c):
        seen.append((c.data.data_dir, Path(c.output.dir).name))
        summary = {"test_accuracy": len(seen)}
        _write_cell(c, summary)
        return summary

    rows = run_sweep(cfg, ["data.data_dir=/d/a b,/d/a_b,/d/c"], tmp_path / "out", run_fn=fake_run,
                     log=lambda m: None)
    assert [r["status"] for r in rows] == ["done"] * 3 and len(seen) == 3
    names = [r["cell"] for r in rows]
    assert len(set(names)) == 3 and [s[1] for s in seen] == names
    assert names[0].startswith("data.data_dir=_d_a_b__") and names[1].startswith("data.data_dir=_d_a_b__")
    assert names[2] == "data.data_dir=_d_c"  # no collision, the name it always had
    # The same names on a rerun, so the cells are found and skipped.
    rows = run_sweep(cfg, ["data.data_dir=/d/a b,/d/a_b,/d/c"], tmp_path / "out", run_fn=fake_run,
                     log=lambda m: None)
    assert [r["cell"] for r in rows] == names and len(seen) == 3
    assert [r["test_accuracy"] for r in rows] == [1, 2, 3]
    from fedsim.sweep import cell_names

    # Names that differ only in case would share a directory on macOS or Windows;
    # non-ASCII letters all become '_'; the string '1' and the number 1 print alike.
    for cells in ([{"name": "A"}, {"name": "a"}], [{"name": "ré"}, {"name": "rè"}],
                  [{"name": "1"}, {"name": 1}]):
        unique = cell_names(cells)
        assert len({n.casefold() for n in unique}) == 2, unique
    assert cell_names([{"seed": 0}, {"seed": 1}]) == ["seed=0", "seed=1"]


def test_grid_values_may_be_lists_and_bad_yaml_is_named():
    # Before, the list was split on its commas and '[0' gave a yaml traceback.
    assert parse_grid(["observer.clients=[0,1],[2,3]", "name='a,b',c"]) == [
        ("observer.clients", [[0, 1], [2, 3]]), ("name", ["a,b", "c"])]
    assert parse_grid(["attack.config={a: 1, b: 2},{a: 3}"]) == [
        ("attack.config", [{"a": 1, "b": 2}, {"a": 3}])]
    with pytest.raises(ConfigError, match=r"--grid observer.clients: value '\[0, 1' is not "
                                          r"valid YAML .*a list is written in brackets"):
        parse_grid(["observer.clients=[0, 1"])
    with pytest.raises(ConfigError, match=r"--grid name: value \"'a\" is not valid YAML"):
        parse_grid(["name='a"])


def test_a_quoted_grid_string_stays_a_string_in_the_cells_config(tmp_path):
    # Passed on as text, '1e5' and 'true' were parsed again: a number and a bool.
    raw = {"model": {"name": "mlp"}, "data": {"dataset": "fashion_mnist"}}
    (values,) = [v for _, v in parse_grid(["data.data_dir='1e5','true'"])]
    assert values == ["1e5", "true"]
    assert [cell_config(raw, {"data.data_dir": v}, tmp_path, "c").data.data_dir
            for v in values] == ["1e5", "true"]
    # A bare name sets the key it stands for, as --set does.
    assert cell_config(raw, {"lr": 0.25}, tmp_path, "c").training.lr == 0.25


def test_an_empty_output_section_is_a_config_error(tmp_path):
    # Before: TypeError: 'NoneType' object does not support item assignment.
    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE.replace("output: {progress: false, plots: false}", "output:"))
    with pytest.raises(ConfigError, match=r"config key 'output': expected a mapping, got None"):
        run_sweep(cfg, ["seed=1"], tmp_path / "o", run_fn=lambda c: {}, log=lambda m: None)
    # No output section at all is fine.
    cfg.write_text(BASE.replace("output: {progress: false, plots: false}", ""))
    rows = run_sweep(cfg, ["seed=1"], tmp_path / "o", run_fn=lambda c: {}, log=lambda m: None)
    assert [r["status"] for r in rows] == ["done"]


def test_a_sweep_directory_that_is_a_file_is_named(tmp_path, capsys):
    # Before: every cell failed, then a FileExistsError traceback from the table.
    from fedsim.cli import main
    from fedsim.results import OutputPathError
    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE)
    (tmp_path / "f").write_text("")
    ran = []
    with pytest.raises(OutputPathError, match=r"--out\) .*f: exists and is not a directory"):
        run_sweep(cfg, ["seed=1"], tmp_path / "f", run_fn=ran.append, log=lambda m: None)
    with pytest.raises(OutputPathError, match=r"cannot be a directory, .*f is a file"):
        run_sweep(cfg, ["seed=1"], tmp_path / "f" / "s", run_fn=ran.append, log=lambda m: None)
    assert ran == []  # refused before any cell ran
    assert main(["sweep", str(cfg), "--grid", "seed=1", "--out", str(tmp_path / "f")]) == 1
    assert "choose another --out" in capsys.readouterr().err


def test_sigterm_in_a_cells_last_round_stops_the_sweep_before_the_next_cell(tmp_path):
    # Before: the cell's run finished its last round, swallowed the signal, and
    # the sweep went on to the next cell.
    import os
    import signal

    from fedsim.preemption import SweepPreempted
    from fedsim.run import run_simulation
    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE.replace("defenses: [{name: dp_vmf, kappa: 0.5}]\n", ""))
    ran = []

    def run_fn(c):
        ran.append(c.name)
        last = c.training.rounds - 1
        kill = lambda res, row: row["round"] == last and os.kill(os.getpid(), signal.SIGTERM)
        return run_simulation(c, quiet=True, on_round=kill if len(ran) == 1 else None)

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SweepPreempted, match="after sweep cell 1 of 2"):
        run_sweep(cfg, ["seed=0,1"], tmp_path / "s", run_fn=run_fn, log=lambda m: None)
    assert signal.getsignal(signal.SIGTERM) is before
    assert len(ran) == 1 and (tmp_path / "s" / "cells" / "seed=0" / "summary.json").exists()
    assert not (tmp_path / "s" / "cells" / "seed=1").exists()
    table = json.loads((tmp_path / "s" / "results.json").read_text())["rows"]
    assert [r["status"] for r in table] == ["done"]
    # The same command again runs the rest.
    rows = run_sweep(cfg, ["seed=0,1"], tmp_path / "s", run_fn=run_fn, log=lambda m: None)
    assert [r["status"] for r in rows] == ["done (skipped)", "done"] and len(ran) == 2


@pytest.mark.slow
def test_sweep_end_to_end_cli(tmp_path):
    from fedsim.cli import main
    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE.replace("defenses: [{name: dp_vmf, kappa: 0.5}]\n", ""))
    rc = main(["sweep", str(cfg), "--grid", "seed=0,1", "--out", str(tmp_path / "s")])
    assert rc == 0
    rows = json.loads((tmp_path / "s" / "results.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["done", "done"]
    assert rows[0]["test_accuracy"] != rows[1]["test_accuracy"] or rows[0]["final_train_loss"] != rows[1]["final_train_loss"]
    assert main(["sweep", str(cfg), "--grid", "seed=0,1", "--out", str(tmp_path / "s")]) == 0
    rows = json.loads((tmp_path / "s" / "results.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["done (skipped)", "done (skipped)"]
    # The config.yaml run_simulation wrote is read back as the config it ran;
    # another --set is refused (exit 2) and leaves the table as it was.
    table = (tmp_path / "s" / "results.json").read_text()
    assert main(["sweep", str(cfg), "--grid", "seed=0,1", "--out", str(tmp_path / "s"),
                 "--set", "training.lr=0.5"]) == 2
    assert (tmp_path / "s" / "results.json").read_text() == table


def test_a_float64_cell_without_64_bit_jax_is_refused_before_any_cell_runs(tmp_path):
    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE)
    seen = []
    with pytest.raises(ConfigError, match=r"config key 'training.dtype' \(float64\)"):
        run_sweep(cfg, ["training.dtype=float32,float64"], tmp_path / "out",
                  run_fn=seen.append, log=lambda m: None)
    assert seen == []


def test_a_defense_value_a_cell_would_refuse_and_a_stray_comma_stop_the_sweep_before_any_cell(
        tmp_path):
    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE)
    ran = []

    def fake_run(c):
        ran.append(c.output.dir)
        return {"test_accuracy": 0.5}

    # Before: the good cell ran and the bad one was recorded as failed at run time.
    for grid, said in ((["defenses[0].kappa=0.3,-1"], r"sweep cell defenses_0_.kappa=-1: "
                                                      r"config key 'defenses\[0\]': .*kappa"),
                       (["defenses[0].kapa=0.3"], r"config key 'defenses\[0\]'.*kapa")):
        with pytest.raises(ConfigError, match=said):
            run_sweep(cfg, grid, tmp_path / "out", run_fn=fake_run, log=lambda m: None)
        assert ran == []
    # Before: "seed=0," swept seed 0 alone without a word.
    with pytest.raises(ConfigError, match=r"--grid seed: an empty value in '0,' \(a stray comma"):
        parse_grid(["seed=0,"])


def test_a_sweep_drops_compiled_programs_between_cells_only_near_the_map_limit(tmp_path,
                                                                             monkeypatch):
    import jax

    from fedsim import memory

    cfg = tmp_path / "base.yaml"
    cfg.write_text(BASE)
    cleared, logs = [], []
    monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(len(logs)))
    monkeypatch.setattr(memory, "max_map_count", lambda: 65530)
    monkeypatch.setattr(memory, "memory_mappings", lambda: 32764)  # just under half
    run_sweep(cfg, ["seed=0,1,2"], tmp_path / "far", run_fn=lambda c: {}, log=logs.append)
    assert cleared == [] and not any("dropped" in m for m in logs)
    monkeypatch.setattr(memory, "memory_mappings", lambda: 32765)
    logs.clear()
    run_sweep(cfg, ["seed=0,1,2"], tmp_path / "near", run_fn=lambda c: {}, log=logs.append)
    # after cells 1 and 2, each after its progress line; not after the last
    dropped = [i for i, m in enumerate(logs) if "dropped JAX's compiled programs" in m]
    assert len(cleared) == 2 and cleared == dropped
    assert logs[dropped[0]] == ("after cell 1: 32765 memory mappings of the kernel's "
                                "vm.max_map_count 65530; dropped JAX's compiled programs")
