"""What a rerun leaves in a run directory: never one run's config.yaml or
summary.json beside another run's results (fedsim.run.run_simulation)."""

import json

import pytest
import yaml

from fedsim.checkpoint import CheckpointError
from fedsim.compare import load_run, table_row
from fedsim.results import RunFileError
from fedsim.run import run_simulation
from fedsim.simulation import NonFiniteError, Simulation

from .helpers import small_config, small_dataset


def _run(tmp_path, on_round=None, **overrides):
    cfg = small_config(**{"output.dir": str(tmp_path), **overrides})
    return run_simulation(cfg, sim=Simulation(cfg, dataset=small_dataset()), on_round=on_round,
                          quiet=True)


def _files(run_dir):
    return {name: (run_dir / name).read_bytes()
            for name in ("config.yaml", "metrics.jsonl", "summary.json")}


def test_a_refused_resume_leaves_the_finished_runs_files_as_they_were(tmp_path):
    # config.yaml was written before the checkpoint was checked: the lr=0.1
    # config then sat beside the lr=0.5 run's checkpoints, metrics and summary.
    _run(tmp_path, **{"output.checkpoint_every": 1})
    before = _files(tmp_path)
    with pytest.raises(CheckpointError, match="different config"):
        _run(tmp_path, **{"output.checkpoint_every": 1, "training.lr": 0.1})
    assert _files(tmp_path) == before
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["training"]["lr"] == 0.5


@pytest.mark.parametrize("plots", [False, True])
def test_a_rerun_that_fails_is_not_reported_finished(tmp_path, plots):
    # A rerun from round 0 emptied metrics.jsonl but left the finished run's
    # summary.json (and plot): `fedsim compare` called the crashed rerun finished
    # and a sweep would have skipped it.
    _run(tmp_path, **{"output.plots": plots})
    assert (tmp_path / "summary.json").exists()
    assert (tmp_path / "learning_curve.png").exists() == plots

    def fail_in_round_1(res, row):
        if row["round"] == 1:
            raise RuntimeError("killed in round 1")

    with pytest.raises(RuntimeError, match="killed in round 1"):
        _run(tmp_path, on_round=fail_in_round_1, **{"training.lr": 0.1,
                                                   "output.plots": plots})
    assert not (tmp_path / "summary.json").exists()
    assert not (tmp_path / "learning_curve.png").exists()
    # config.yaml is the config of the rows beside it.
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["training"]["lr"] == 0.1
    assert table_row("run", load_run(tmp_path))["status"] == "unfinished"


def test_extending_a_finished_run_drops_its_summary_until_the_longer_run_ends(tmp_path):
    _run(tmp_path, **{"output.checkpoint_every": 1})

    def look(res, row):
        assert not (tmp_path / "summary.json").exists(), row["round"]

    summary = _run(tmp_path, on_round=look, **{"output.checkpoint_every": 1,
                                               "training.rounds": 3})
    assert json.loads((tmp_path / "summary.json").read_text())["rounds"] == 3 == summary["rounds"]
    # The extension trained one round (its seconds are that one round's).
    assert summary["rounds_trained"] == 1
    # Rerunning a finished run trains nothing and keeps its summary as it was:
    # rewritten, it held the rerun's seconds and environment, which trained nothing.
    written = (tmp_path / "summary.json").read_bytes()
    again = _run(tmp_path, on_round=look, **{"output.checkpoint_every": 1,
                                             "training.rounds": 3})
    assert (tmp_path / "summary.json").read_bytes() == written
    assert again["seconds"] == summary["seconds"] and again["rounds_trained"] == 1
    assert "final_state" in again
    # A summary that is not a JSON object is written anew.
    (tmp_path / "summary.json").write_text("[]")
    again = _run(tmp_path, **{"output.checkpoint_every": 1, "training.rounds": 3})
    assert again["rounds_trained"] == 0
    assert json.loads((tmp_path / "summary.json").read_text())["rounds_trained"] == 0


def test_fewer_rounds_than_the_checkpoint_holds_is_refused_by_name(tmp_path):
    # It exited 0 with a summary saying 2 rounds that held the 3-round run's results.
    _run(tmp_path, **{"output.checkpoint_every": 1, "training.rounds": 3})
    before = _files(tmp_path)
    with pytest.raises(CheckpointError) as e:
        _run(tmp_path, **{"output.checkpoint_every": 1, "training.rounds": 2})
    msg = str(e.value)
    assert "training.rounds" in msg and "3 rounds" in msg and str(tmp_path) in msg
    assert _files(tmp_path) == before


def test_a_resume_whose_metrics_rows_were_lost_names_the_file(tmp_path):
    # It ended in a bare IndexError (log.rows[-1]) or, when extended, wrote a
    # metrics.jsonl without the rounds before the checkpoint.
    _run(tmp_path, **{"output.checkpoint_every": 1})
    (tmp_path / "metrics.jsonl").unlink()
    for rounds in (2, 3):
        with pytest.raises(RunFileError, match=str(tmp_path / "metrics.jsonl")) as e:
            _run(tmp_path, **{"output.checkpoint_every": 1, "training.rounds": rounds})
        assert "rounds 0, 1" in str(e.value) and "checkpoints" in str(e.value)
    assert not (tmp_path / "metrics.jsonl").exists()  # the refusal wrote nothing


def test_a_resume_missing_one_metrics_row_names_the_round(tmp_path):
    _run(tmp_path, **{"output.checkpoint_every": 1})
    first = (tmp_path / "metrics.jsonl").read_text().splitlines()[0]
    (tmp_path / "metrics.jsonl").write_text(first + "\n")
    with pytest.raises(RunFileError, match=r"round 1\b"):
        _run(tmp_path, **{"output.checkpoint_every": 1, "training.rounds": 3})


def test_an_evaluation_that_overflows_stops_the_run_and_writes_no_infinity(tmp_path):
    # server_lr 1e38 leaves finite params near 1e37 whose logits overflow: the
    # run ended with exit 0 and "test_loss": Infinity in metrics and summary.
    with pytest.raises(NonFiniteError, match=r"round 0\b.*training.server_lr") as e:
        _run(tmp_path, **{"training.rounds": 1, "training.server_optimizer": "sgd",
                          "training.server_lr": 1e38})
    assert "evaluat" in str(e.value)
    assert not (tmp_path / "summary.json").exists()
    assert "Infinity" not in (tmp_path / "metrics.jsonl").read_text()


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_an_output_dir_that_is_a_file_is_a_one_line_error(tmp_path, capsys, where):
    from fedsim.cli import main

    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    out = afile if where == "file" else afile / "run"
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"data": {"dataset": "synthetic", "num_clients": 4},
                                      "model": {"name": "mlp"},
                                      "training": {"rounds": 1, "clients_per_round": 2}}))
    rc = main(["run", str(config), "--quiet", "--set", f"output.dir={out}"])
    err = capsys.readouterr().err
    assert rc in (1, 2) and "Traceback" not in err
    line = [l for l in err.splitlines() if l.strip()][-1]
    assert line.startswith("fedsim: ") and str(afile) in line and "output.dir" in line
    assert afile.read_text() == "not a directory\n"


@pytest.mark.parametrize("what", ["config.yaml", "summary.json", "checkpoints"])
def test_a_run_file_of_the_wrong_kind_in_output_dir_is_a_one_line_error(tmp_path, capsys, what):
    # Before: IsADirectoryError or orbax's NotADirectoryError tracebacks.
    from fedsim.cli import main

    out = tmp_path / "run"
    out.mkdir()
    if what == "checkpoints":
        (out / what).write_text("a file\n")
    else:
        (out / what).mkdir()
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"data": {"dataset": "synthetic", "num_clients": 4},
                                      "model": {"name": "mlp"},
                                      "training": {"rounds": 1, "clients_per_round": 2},
                                      "output": {"checkpoint_every": 1}}))
    assert main(["run", str(config), "--quiet", "--set", f"output.dir={out}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().startswith(f"fedsim: error: output.dir {out}: {what} there is a")


def test_result_files_get_the_mode_open_would_give_them(tmp_path):
    """mkstemp makes 0600 files and the rename kept that, so collaborators who can
    read a shared run directory could not read its config, metrics or summary."""
    import os
    import stat

    from fedsim.results import atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
        os.umask(0o077)
        atomic_write_text(tmp_path / "b.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o600


def test_a_dp_runs_learning_curve_shows_the_epsilon_its_rows_carry(tmp_path):
    import matplotlib.image

    _run(tmp_path, **{"output.plots": True, "training.rounds": 2,
                      "defenses": [{"name": "dp_gaussian", "noise_multiplier": 1.0}]})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(row["epsilon"] > 0 for row in rows)
    assert matplotlib.image.imread(tmp_path / "learning_curve.png").shape[:2] == (650, 600)
