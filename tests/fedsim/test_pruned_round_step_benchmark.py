"""benchmarks/pruned_round_step.py on a small MLP: the mask is an input of the step."""

import json

import pytest


def test_the_mask_costs_the_step_no_program_size_and_no_recompiles(tmp_path):
    from benchmarks.pruned_round_step import main

    result = main(["--models", "mlp", "--rounds", "3", "--reconfigs", "3", "--every", "1",
                   "--repeats", "1", "--out", str(tmp_path)])
    (m,) = result["results"]
    p = m["programs"]
    # The constant writes every mask entry into the program; the input does not.
    assert p["mask_constant"]["hlo_chars"] - p["dense"]["hlo_chars"] > m["params"]
    assert p["mask_input"]["hlo_chars"] - p["dense"]["hlo_chars"] < m["params"] / 4
    assert m["reconfiguration_rounds"] == [1, 2]
    assert m["executables_after_run"] == {"_run_and_accumulate": 1, "_finish": 1}
    assert 0.4 < m["mask_density"] < 0.6
    saved = json.loads((tmp_path / "pruned_round_step.json").read_text())
    assert saved["results"][0]["programs"]["dense"]["hlo_chars"] == p["dense"]["hlo_chars"]
    assert "| mlp | 13,700 | mask_input |" in (tmp_path / "pruned_round_step.md").read_text()


@pytest.mark.parametrize("argv,named", [
    (["--models", "foo"], "model.name"), (["--models", "mlp", "--rounds", "0"], "training.rounds"),
    (["--models", "mlp", "--repeats", "0"], "--repeats"), (["--models", ","], "--models")])
def test_bad_arguments_are_named_before_anything_runs(argv, named, tmp_path, capsys):
    from benchmarks.pruned_round_step import main

    with pytest.raises(SystemExit) as e:
        main(argv + ["--out", str(tmp_path)])
    assert e.value.code == 2 and named in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
