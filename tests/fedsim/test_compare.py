"""fedsim compare: runs side by side, from the files they wrote (no simulation here)."""

import json
from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.compare import CompareError, compare, labels, run_dirs
from fedsim.results import RunFileError


def _write_run(d: Path, accuracies, losses, summary=None, attack=None) -> Path:
    d.mkdir(parents=True)
    rows = [{"round": i, "train_loss": loss, "seconds": 0.5,
             **({} if acc is None else {"test_accuracy": acc, "test_loss": 1.0})}
            for i, (acc, loss) in enumerate(zip(accuracies, losses))]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if attack is not None:
        (d / "attack_summary.json").write_text(json.dumps({"mean": attack}))
    return d


def _table(text: str) -> list[dict]:
    lines = [l for l in text.splitlines() if l.startswith("|")]
    cols = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(cols, (c.strip() for c in l.strip("|").split("|")))) for l in lines[2:]]


def test_runs_and_a_sweeps_cells_side_by_side_with_a_plot(tmp_path):
    plain = _write_run(tmp_path / "plain", [0.5, 0.7, 0.6], [2.0, 1.5, 1.2],
                       summary={"seconds": 12.5})
    # A killed run: rows, no summary; accuracy evaluated every other round.
    _write_run(tmp_path / "killed", [0.2, None, 0.4], [2.3, 2.1, 1.9])
    sweep = tmp_path / "sweep"
    _write_run(sweep / "cells" / "b", [0.3], [2.2], summary={"seconds": 3.0, "epsilon": 1.5},
               attack={"psnr": 17.25, "nmi": 0.5})
    _write_run(sweep / "cells" / "a", [0.1], [2.4], summary={"seconds": 4.0, "epsilon": 8.0})
    (sweep / "cells" / "not_started").mkdir()
    # results.json lists b before a: the sweep's own order wins over the names'.
    (sweep / "results.json").write_text(json.dumps({"rows": [{"cell": "b"}, {"cell": "a"}]}))
    out = tmp_path / "figs" / "curves.png"

    table = _table(compare([plain, tmp_path / "killed", sweep], out))

    assert [r["run"] for r in table] == ["plain", "killed", "b", "a"]
    assert table[0] == {"run": "plain", "status": "finished", "rounds": "3",
                        "test_accuracy": "0.6", "best_test_accuracy": "0.7", "best_round": "1",
                        "final_train_loss": "1.2", "seconds": "12.5", "epsilon": "–",
                        "attack_psnr": "–", "attack_nmi": "–"}
    assert table[1]["status"] == "unfinished"
    assert table[1]["test_accuracy"] == "0.4" and table[1]["seconds"] == "1.5"  # its rows' sum
    assert table[2]["epsilon"] == "1.5" and table[2]["attack_psnr"] == "17.25"
    assert table[3]["epsilon"] == "8" and table[3]["attack_psnr"] == "–"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_optional_columns_only_where_some_run_has_them(tmp_path):
    run = _write_run(tmp_path / "r", [0.5], [2.0], summary={"seconds": 1.0})
    header = compare([run]).splitlines()[0]
    assert "epsilon" not in header and "attack_psnr" not in header
    assert not list(tmp_path.rglob("*.png"))  # no --out, no plot


def test_bad_paths_are_named(tmp_path):
    with pytest.raises(CompareError, match="nowhere: neither a run directory"):
        compare([tmp_path / "nowhere"])
    (tmp_path / "empty_sweep" / "cells" / "x").mkdir(parents=True)
    with pytest.raises(CompareError, match="empty_sweep: a sweep's directory whose cells have no rows"):
        compare([tmp_path / "empty_sweep"])
    with pytest.raises(CompareError, match="no run directory given"):
        run_dirs([])
    # A torn summary would otherwise pass the run off as unfinished.
    torn = _write_run(tmp_path / "torn", [0.5], [1.0])
    (torn / "summary.json").write_text('{"seconds": 1.')
    with pytest.raises(RunFileError, match="torn/summary.json: not readable as JSON"):
        compare([torn])
    # results.json gives a sweep's order only: one that is not the sweep's is ignored.
    odd = tmp_path / "odd_sweep"
    _write_run(odd / "cells" / "c", [0.5], [1.0])
    (odd / "results.json").write_text('{"rows": [1, {"cell": "c"}, {"no": "cell"}]}')
    assert [r["run"] for r in _table(compare([odd]))] == ["c"]
    (torn / "summary.json").write_text("[1, 2]")
    with pytest.raises(RunFileError, match="summary.json: expected a JSON object, got list"):
        compare([torn])


def test_labels_take_parents_until_they_differ(tmp_path):
    a = _write_run(tmp_path / "one" / "cells" / "lr=0.1", [0.5], [1.0])
    b = _write_run(tmp_path / "two" / "cells" / "lr=0.1", [0.5], [1.0])
    c = _write_run(tmp_path / "lr=0.5", [0.5], [1.0])
    assert labels([a, c]) == ["lr=0.1", "lr=0.5"]
    assert labels([a, b]) == ["one/cells/lr=0.1", "two/cells/lr=0.1"]


def test_the_command_prints_the_table_and_names_a_bad_path(tmp_path, capsys):
    run = _write_run(tmp_path / "r", [0.5, 0.75], [2.0, 1.0], summary={"seconds": 2.0})
    assert main(["compare", str(run), "--out", str(tmp_path / "c.png")]) == 0
    captured = capsys.readouterr()
    assert _table(captured.out)[0]["best_test_accuracy"] == "0.75"
    assert f"plot: {tmp_path / 'c.png'}" in captured.err
    assert (tmp_path / "c.png").is_file()
    assert main(["compare", str(tmp_path / "missing")]) == 1
    assert "fedsim: error: " in capsys.readouterr().err


@pytest.mark.parametrize("where", ["metrics.jsonl/c.png", "c.notaformat"])
def test_a_plot_that_cannot_be_written_is_named(tmp_path, capsys, where):
    # Under a regular file (a permission test would not fail as root), or in a
    # format matplotlib does not write: named, not matplotlib's traceback.
    run = _write_run(tmp_path / "r", [0.5], [2.0], summary={"seconds": 2.0})
    out = run / where
    with pytest.raises(CompareError, match=f"--out {out}: cannot write the plot there"):
        compare([run], out)
    assert main(["compare", str(run), "--out", str(out)]) == 1
    assert f"fedsim: error: --out {out}: cannot write" in capsys.readouterr().err


def test_an_out_that_names_no_file_is_named(tmp_path, capsys):
    # Before: "ValueError: PosixPath('.') has an empty name", a traceback.
    run = _write_run(tmp_path / "r", [0.5], [2.0], summary={"seconds": 2.0})
    assert main(["compare", str(run), "--out", ""]) == 1
    assert "fedsim: error: --out '': expected a file path for the plot" in capsys.readouterr().err


def test_runs_from_other_environments_are_named(tmp_path):
    """Runs whose summary.json environments differ (commit, convolution rule)
    get a line naming how; equal environments, or runs without one, none."""
    head = "0123456789abcdef0123456789abcdef01234567"
    env = {"commit": head, "jax": "0.4.38", "backend": "cpu", "device_kind": "cpu",
           "convolution": {"implementation": "auto", "im2col_max_batch": 4}}
    other = {**env, "commit": "f" * 40 + "-dirty",
             "convolution": {"implementation": "xla", "im2col_max_batch": 4}}
    a = _write_run(tmp_path / "a", [0.5], [2.0], summary={"environment": env})
    b = _write_run(tmp_path / "b", [0.5], [2.0], summary={"environment": other})
    same = _write_run(tmp_path / "same", [0.5], [2.0], summary={"environment": env})
    old = _write_run(tmp_path / "old", [0.5], [2.0], summary={"seconds": 1.0})
    text = compare([a, b, old])
    assert ("The runs' environments differ (summary.json): commit (a: 0123456, b: "
            "fffffff-dirty); convolution (a: {\"im2col_max_batch\": 4, \"implementation\": "
            "\"auto\"}, b: {\"im2col_max_batch\": 4, \"implementation\": \"xla\"}).") in text
    assert len(_table(text)) == 3  # the table itself is unchanged
    assert "environments differ" not in compare([a, same, old])
    assert "environments differ" not in compare([a, old])


def test_an_attack_run_is_finished_only_once_its_attack_summary_exists(tmp_path):
    # The simulation writes summary.json before the attack starts: a killed or
    # failed attack left a run that compare called finished.
    attack_cfg = "seed: 0\nattack:\n  name: inverting_gradients\n  grants: {}\n"
    killed = _write_run(tmp_path / "killed", [0.5], [2.0], summary={"seconds": 1.0})
    (killed / "config.yaml").write_text(attack_cfg)
    done = _write_run(tmp_path / "done", [0.5], [2.0], summary={"seconds": 1.0},
                      attack={"psnr": 20.0})
    (done / "config.yaml").write_text(attack_cfg)
    plain = _write_run(tmp_path / "plain", [0.5], [2.0], summary={"seconds": 1.0})
    (plain / "config.yaml").write_text("seed: 0\nattack: null\n")
    table = _table(compare([killed, done, plain]))
    assert [r["status"] for r in table] == ["attack pending", "finished", "finished"]
    # Without a config.yaml, an attack_summary.json alone says it is an attack run.
    lone = _write_run(tmp_path / "lone", [0.5], [2.0], attack={"psnr": 20.0})
    assert _table(compare([lone]))[0]["status"] == "unfinished"
    # A config.yaml that is not one fedsim wrote is named, not read as "no attack".
    (plain / "config.yaml").write_text("attack: [\n")
    with pytest.raises(RunFileError, match="plain/config.yaml: not readable as YAML"):
        compare([plain])
    (plain / "config.yaml").write_text("- 1\n")
    with pytest.raises(RunFileError, match="plain/config.yaml: expected a YAML mapping, got list"):
        compare([plain])


@pytest.mark.parametrize("mean", [None, [1, 2], "20.5"])
def test_an_attack_summary_whose_mean_is_not_an_object_is_named(tmp_path, capsys, mean):
    # compare ended in an AttributeError traceback where `fedsim report` named the file.
    run = _write_run(tmp_path / "r", [0.5], [2.0], summary={"seconds": 1.0})
    path = run / "attack_summary.json"
    path.write_text(json.dumps({"victims": [], "mean": mean}))
    with pytest.raises(RunFileError, match="attack_summary.json: expected 'victims' to be a "
                                           "list of objects and 'mean' an object"):
        compare([run])
    for command in (["compare", str(run)], ["report", str(run)]):
        assert main(command) == 1
        assert capsys.readouterr().err == (f"fedsim: error: {path}: expected 'victims' to be a "
                                           "list of objects and 'mean' an object\n")


def test_out_without_an_extension_says_the_file_it_wrote(tmp_path, capsys):
    # matplotlib adds .png to a path without an extension; the command said the path given.
    run = _write_run(tmp_path / "r", [0.5, 0.75], [2.0, 1.0], summary={"seconds": 2.0})
    assert main(["compare", str(run), "--out", str(tmp_path / "curves")]) == 0
    assert f"plot: {tmp_path / 'curves.png'}\n" in capsys.readouterr().err
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "curves").exists()
