"""benchmarks/chu2023_tv_tuned.py: the TV-weight choices, the pairing and the output.

The attack runs themselves are part A's (tested in test_pruning_reproduction.py);
here the cells are written by hand, so each choice can be checked by eye.
"""

import json

import numpy as np
import pytest

from benchmarks import chu2023_tv_tuned as tuned

GRID = [1e-3, 1e-2]


def cell(seed, gi, sgi, scheme="snip", p=0.1):
    """One (seed, setting) cell: ``gi`` / ``sgi`` map a TV weight to victims' PSNRs."""
    arms = [{"attack": a, "tv": tv, "psnr_victims": list(v), "nmi_victims": [0.5] * len(v)}
            for a, by in (("gi", gi), ("sgi", sgi)) for tv, v in by.items()]
    return {"seed": seed, "scheme": scheme, "p": p, "arms": arms}


def three_seeds():
    # GI is best at 1e-2 on seeds 1 and 2 but at 1e-3 on seed 0; SGI at 1e-2 everywhere.
    return [cell(0, {1e-3: [20, 22], 1e-2: [18, 18]}, {1e-3: [19, 19], 1e-2: [21, 23]}),
            cell(1, {1e-3: [20, 20], 1e-2: [24, 24]}, {1e-3: [18, 18], 1e-2: [22, 22]}),
            cell(2, {1e-3: [21, 21], 1e-2: [25, 25]}, {1e-3: [18, 20], 1e-2: [23, 23]})]


def test_held_out_choice_uses_the_other_seeds_and_pairs_each_victim():
    (entry,) = tuned.analyse(three_seeds(), GRID, shared_tv=1e-3)
    held = entry["held_out"]
    # Seed 0's GI weight is chosen on seeds 1-2 (1e-2 there), not on its own victims.
    assert held["tv"] == {"gi": [1e-2, 1e-2, 1e-2], "sgi": [1e-2, 1e-2, 1e-2]}
    assert held["diffs"] == [21 - 18, 23 - 18, 22 - 24, 22 - 24, 23 - 25, 23 - 25]
    assert held["mean"] == pytest.approx(np.mean(held["diffs"]))
    assert held["gi_psnr"] == pytest.approx(np.mean([18, 18, 24, 24, 25, 25]))
    # In-sample: the best weight over all six victims, per attack.
    inside = entry["in_sample"]
    assert inside["tv"] == {"gi": 1e-2, "sgi": 1e-2}
    shared = entry["shared"]
    assert shared["diffs"] == [-1, -3, -2, -2, -3, -1] and shared["verdict"] == "GI better"
    assert entry["grid_psnr"]["gi"] == [pytest.approx(124 / 6), pytest.approx(134 / 6)]
    assert entry["victims"] == 6 and entry["seeds"] == [0, 1, 2]


def test_held_out_choice_differs_from_in_sample_where_one_seed_disagrees():
    cells = three_seeds()
    # Seed 0's GI victims now favour 1e-3 strongly enough to move the pooled best.
    cells[0] = cell(0, {1e-3: [40, 40], 1e-2: [18, 18]}, {1e-3: [19, 19], 1e-2: [21, 23]})
    (entry,) = tuned.analyse(cells, GRID, shared_tv=None)
    assert entry["in_sample"]["tv"]["gi"] == 1e-3
    assert entry["held_out"]["tv"]["gi"] == [1e-2, 1e-3, 1e-3]
    assert "shared" not in entry  # the shared weight is not on the grid


def test_one_seed_has_no_held_out_choice():
    (entry,) = tuned.analyse(three_seeds()[:1], GRID, shared_tv=1e-3)
    assert "held_out" not in entry and entry["in_sample"]["tv"] == {"gi": 1e-3, "sgi": 1e-2}


def test_a_tie_takes_the_smaller_weight():
    c = [cell(0, {1e-3: [20], 1e-2: [20]}, {1e-3: [20], 1e-2: [20]})]
    assert tuned.best_tv(c, "gi", GRID) == 1e-3


def _row(base, p, attack, psnrs):
    return {"part": "A", "model": "conv2", "B": 8, "base": base, "p": p, "attack": attack,
            "psnr": float(np.mean(psnrs)), "psnr_victims": psnrs, "nmi_victims": [0.5] * 2}


def test_not_run_reports_the_smallest_gap_left_out():
    rows = [_row("random", 0.1, "gi", [10, 10]), _row("random", 0.1, "sgi", [20, 22]),
            _row("snip", 0.1, "gi", [26, 26]), _row("snip", 0.1, "sgi", [24, 24]),
            _row("snip", 0.5, "gi", [10, 12]), _row("snip", 0.5, "sgi", [16, 16])]
    rest = tuned.not_run([{"seed": 3, "rows": rows}], [("snip", 0.1)])
    assert rest == {"settings": 2, "min_gap": 5.0, "where": "snip p = 0.5, seed 3"}
    assert tuned.not_run([{"seed": 3, "rows": rows}],
                         [("snip", 0.1), ("snip", 0.5), ("random", 0.1)]) is None


def test_markdown_and_render(tmp_path):
    cells = three_seeds()
    for c in cells:
        for a in c["arms"]:
            a["commit"] = "def"
    out = {"runs": ["a.json", "b.json", "c.json"], "grid": GRID, "attack": {"iterations": 200},
           "argv": ["--tv-grid", "1e-3,1e-2"], "commit": "abc", "cells": cells,
           "settings": tuned.analyse(cells, GRID, 1e-3),
           "not_run": {"settings": 17, "min_gap": 5.0, "where": "prunefl p = 0.1, seed 0"}}
    md = tuned.markdown(out)
    assert "| snip p = 0.1 | GI | 20.67 | 22.33 |" in md
    assert ("| snip p = 0.1 | 0, 1, 2 | 6 | shared | 0.001 | 0.001 | 20.67 | 18.67 | -2.00 |"
            in md)
    assert "| held-out | 0.01, 0.01, 0.01 | 0.01, 0.01, 0.01 |" in md
    assert "the other 17 p-axis settings" in md and "at least +5.00 dB" in md
    assert "(last run at commit abc; arms run at def)" in md
    path = tmp_path / "x.json"
    path.write_text(json.dumps(out))
    tuned.main(["--render", str(path)])
    assert path.with_suffix(".md").read_text() == md


@pytest.mark.parametrize("argv, message", [
    (["--settings", "snip"], "--settings: 'snip' is not scheme:p"),
    (["--settings", "snip:x"], "--settings: 'snip:x' is not scheme:p"),
    (["--tv-grid", "1e-3,a"], "--tv-grid: '1e-3,a' is not a comma-separated list"),
    (["--tv-grid", "0,1e-3"], "TV weights must be > 0"),
    (["--runs", "missing.json"], "no missing.json"),
])
def test_bad_arguments_are_named(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit):
        tuned.main(["--results", str(tmp_path), "--out", str(tmp_path), *argv])
    assert message in capsys.readouterr().err


def test_a_malformed_run_file_is_named(capsys, tmp_path):
    (tmp_path / "cut.json").write_text('{"rows": [')
    with pytest.raises(SystemExit):
        tuned.main(["--results", str(tmp_path), "--out", str(tmp_path), "--runs", "cut.json"])
    err = capsys.readouterr().err
    assert "--runs" in err and "cut.json: not valid JSON (line 1" in err
    # --render recounts the runs it names: a malformed one is named there too.
    (tmp_path / "r.json").write_text(json.dumps({"runs": ["cut.json"], "cells": []}))
    with pytest.raises(SystemExit):
        tuned.main(["--render", str(tmp_path / "r.json"), "--results", str(tmp_path)])
    assert "cut.json: not valid JSON" in capsys.readouterr().err


def test_render_of_a_missing_file(capsys, tmp_path):
    with pytest.raises(SystemExit):
        tuned.main(["--render", str(tmp_path / "none.json")])
    assert "no such file" in capsys.readouterr().err


def test_a_wider_grid_runs_only_the_new_weights():
    old = cell(0, {1e-3: [20]}, {1e-3: [19]})
    old["key"] = "k"
    assert tuned.missing_arms(None, GRID) == [("gi", 1e-3), ("gi", 1e-2), ("sgi", 1e-3),
                                              ("sgi", 1e-2)]
    assert tuned.missing_arms(old, GRID) == [("gi", 1e-2), ("sgi", 1e-2)]
    new = {**cell(0, {1e-2: [21]}, {1e-2: [22]}), "key": "k"}
    merged = tuned.merge_cell(old, new, GRID)
    assert [(a["attack"], a["tv"]) for a in merged["arms"]] == [("gi", 1e-3), ("gi", 1e-2),
                                                                ("sgi", 1e-3), ("sgi", 1e-2)]
    assert tuned.missing_arms(merged, GRID) == []
    with pytest.raises(ValueError, match="used key k, not other"):
        tuned.merge_cell(old, {**new, "key": "other"}, GRID)


def test_the_per_victim_scaled_arm_is_paired_with_gi_at_its_weight():
    cells = three_seeds()
    for c, ps in zip(cells, ([30, 20], [25, 25], [21, 27])):
        c["arms"].append({"attack": tuned.SCALED, "tv": 1e-3, "tv_victims": [0.01, 0.02],
                          "psnr_victims": ps, "nmi_victims": [0.5, 0.5]})
    (entry,) = tuned.analyse(cells, GRID, shared_tv=1e-3)
    (scaled,) = entry["scaled"]
    # GI at 1e-3: 20, 22 | 20, 20 | 21, 21.
    assert scaled["diffs"] == [10, -2, 5, 5, 0, 6]
    assert scaled["gi_psnr"] == pytest.approx(124 / 6) and len(scaled["tv_victims"]) == 6
    # The grid's choices do not see the scaled arm.
    assert entry["in_sample"]["tv"] == {"gi": 1e-2, "sgi": 1e-2}
    out = {"runs": ["a"], "grid": GRID, "attack": {}, "argv": [], "commit": "abc",
           "cells": cells, "settings": [entry], "not_run": None}
    md = tuned.markdown(out)
    assert "| snip p = 0.1 | 0.001 | 0.01–0.02 | 20.67 | 24.67 | +4.00 |" in md
    # A seed without the arm leaves it out of the comparison.
    del cells[2]["arms"][-1]
    (entry,) = tuned.analyse(cells, GRID, shared_tv=1e-3)
    assert "scaled" not in entry


def test_scaled_arm_is_asked_for_once_and_kept_on_any_grid():
    old = {**cell(0, {1e-3: [20]}, {1e-3: [19]}), "key": "k"}
    assert tuned.missing_arms(old, [1e-3], scaled_from=1e-3) == [(tuned.SCALED, 1e-3)]
    new = {**cell(0, {}, {}), "key": "k"}
    new["arms"] = [{"attack": tuned.SCALED, "tv": 1e-3, "psnr_victims": [25]}]
    merged = tuned.merge_cell(old, new, [1e-3])
    assert tuned.missing_arms(merged, [1e-3], scaled_from=1e-3) == []
    assert [a["attack"] for a in tuned.merge_cell(merged, {**new, "arms": []}, [1e-2])["arms"]] \
        == [tuned.SCALED]


def test_scaled_from_must_be_positive(capsys, tmp_path):
    with pytest.raises(SystemExit):
        tuned.main(["--results", str(tmp_path), "--scaled-from", "0"])
    assert "--scaled-from 0: a TV weight must be > 0" in capsys.readouterr().err


def test_render_recounts_the_settings_not_run_from_the_runs_at_hand(tmp_path):
    rows = [_row("random", 0.1, "gi", [10, 10]), _row("random", 0.1, "sgi", [20, 22]),
            _row("snip", 0.1, "gi", [26, 26]), _row("snip", 0.1, "sgi", [24, 24])]
    (tmp_path / "a.json").write_text(json.dumps({"seed": 0, "rows": rows}))
    cells = [cell(0, {1e-3: [20, 22]}, {1e-3: [19, 19]})]  # snip p = 0.1 only
    out = {"runs": ["a.json"], "grid": [1e-3], "attack": {}, "argv": [], "commit": "abc",
           "cells": cells, "settings": tuned.analyse(cells, [1e-3], 1e-3),
           "not_run": {"settings": 0, "min_gap": 0.0, "where": "stale"}}
    path = tmp_path / "x.json"
    path.write_text(json.dumps(out))
    tuned.main(["--render", str(path), "--results", str(tmp_path)])
    assert json.loads(path.read_text())["not_run"]["where"] == "random p = 0.1, seed 0"
    assert "the other 1 p-axis settings" in path.with_suffix(".md").read_text()


def test_a_setting_the_code_no_longer_rebuilds_is_skipped_recorded_and_the_rest_runs(
        tmp_path, monkeypatch, capsys):
    # A part-A run made before a scheme was fixed: its models are not what the current
    # code rebuilds there. That setting is recorded and skipped; the others still run.
    rows = [_row("random", 0.1, "gi", [10, 10]), _row("random", 0.1, "sgi", [20, 22]),
            _row("snip", 0.1, "gi", [26, 26]), _row("snip", 0.1, "sgi", [24, 24])]
    (tmp_path / "a.json").write_text(json.dumps(
        {"seed": 0, "rows": rows, "settings": {"attack": {"tv": 1e-3, "iterations": 2}}}))

    def fake_run_cell(result, scheme, p, todo, commit):
        if scheme == "random":
            raise tuned.NotRebuilt("random p=0.1: recomputed pruned shares differ: not part A's "
                                   "models")
        return {**cell(0, {1e-3: [20, 22]}, {1e-3: [19, 19]}), "key": "k"}

    monkeypatch.setattr(tuned, "run_cell", fake_run_cell)
    out = tuned.main(["--results", str(tmp_path), "--runs", "a.json", "--out", str(tmp_path),
                      "--settings", "random:0.1,snip:0.1", "--tv-grid", "1e-3"])
    assert [(c["scheme"], c["p"]) for c in out["cells"]] == [("snip", 0.1)]
    assert out["not_rebuilt"] == [{"seed": 0, "scheme": "random", "p": 0.1, "reason":
                                   "random p=0.1: recomputed pruned shares differ: not part "
                                   "A's models"}]
    assert out["not_run"]["where"] == "random p = 0.1, seed 0"
    assert json.loads((tmp_path / "chu2023_tv_tuned.json").read_text())["not_rebuilt"] \
        == out["not_rebuilt"]
    md = (tmp_path / "chu2023_tv_tuned.md").read_text()
    assert "Not rebuilt, so skipped (and counted above if no other seed ran it): random " \
           "p = 0.1 at seed 0. random p=0.1: recomputed" in md
    assert "not rebuilt, skipped" in capsys.readouterr().out


def test_a_setting_off_the_runs_p_axis_is_named_before_anything_runs(tmp_path, monkeypatch,
                                                                     capsys):
    rows = [_row("snip", 0.1, "gi", [26, 26]), _row("snip", 0.1, "sgi", [24, 24]),
            _row("random", 0.1, "gi", [10, 10]), _row("random", 0.1, "sgi", [20, 22])]
    (tmp_path / "a.json").write_text(json.dumps(
        {"seed": 0, "rows": rows, "settings": {"attack": {"tv": 1e-3}}}))
    monkeypatch.setattr(tuned, "run_cell", lambda *a: pytest.fail("ran a cell"))
    with pytest.raises(SystemExit):
        tuned.main(["--results", str(tmp_path), "--runs", "a.json", "--out", str(tmp_path),
                    "--settings", "snip:0.1,snip:0.2"])
    assert "--settings snip:0.2: not on the p axis of a.json" in capsys.readouterr().err
