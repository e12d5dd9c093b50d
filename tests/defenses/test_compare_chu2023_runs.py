"""benchmarks/compare_chu2023_runs.py: matched rows, differences, verdicts, named errors."""

import copy
import json
from pathlib import Path

import pytest

from benchmarks import compare_chu2023_runs as cmp

STORED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "chu2023_B.json"


@pytest.fixture(scope="module")
def run():
    return json.loads(STORED.read_text())


def test_a_run_against_itself_differs_nowhere(run):
    report = cmp.compare(run, copy.deepcopy(run))
    assert report["rows"] == len(run["rows"])
    assert all(d["max"] == 0 for d in report["diffs"].values() if d)
    assert report["checks"] and all(c["old"] == c["new"] for c in report["checks"])
    assert "Verdicts that moved: 0 of" in cmp.render(report, ("a.json", "b.json"))


def test_a_changed_row_shows_in_the_differences(run):
    new = copy.deepcopy(run)
    new["rows"][3]["psnr"] += 2.5
    new["rows"][5]["nmi"] -= 0.01
    report = cmp.compare(run, new)
    assert report["diffs"]["psnr"]["max"] == pytest.approx(2.5)
    assert report["diffs"]["nmi"]["max"] == pytest.approx(0.01)
    assert report["diffs"]["accuracy"]["max"] == 0


def test_rows_that_do_not_match_are_named(run, tmp_path, capsys):
    new = copy.deepcopy(run)
    new["rows"][0]["round"] = -1
    with pytest.raises(ValueError, match="1 only in the old run, 1 only in the new one"):
        cmp.compare(run, new)
    dup = copy.deepcopy(run)
    dup["rows"].append(dup["rows"][0])
    with pytest.raises(ValueError, match="two rows with the same key"):
        cmp.compare(run, dup)
    (tmp_path / "bad.json").write_text("{}")
    for argv, message in (([str(STORED), str(tmp_path / "missing.json")], "no such file"),
                          ([str(STORED), str(tmp_path / "bad.json")], "has no 'rows'")):
        with pytest.raises(SystemExit):
            cmp.main(argv)
        assert message in capsys.readouterr().err


def test_several_old_files_are_merged_into_one_run(run, tmp_path):
    half = len(run["rows"]) // 2
    first = {**run, "rows": run["rows"][:half], "seconds": 10.0, "commit": "a" * 40}
    second = {**run, "rows": run["rows"][half:], "seconds": 5.0, "commit": "b" * 40}
    paths = []
    for name, r in (("c.json", first), ("d.json", second), ("new.json", run)):
        (tmp_path / name).write_text(json.dumps(r))
        paths.append(str(tmp_path / name))
    report = cmp.main([*paths, "--out", str(tmp_path / "cmp.md")])
    assert report["rows"] == len(run["rows"]) and report["seconds"][0] == 15.0
    assert all(d["max"] == 0 for d in report["diffs"].values() if d)
    md = (tmp_path / "cmp.md").read_text()
    assert "old aaaaaaa, bbbbbbb" in md and f"{paths[0]} {paths[1]} {paths[2]}" in md
    with pytest.raises(SystemExit):
        cmp.main([paths[0]])


RESULTS = STORED.parent


def test_runs_made_with_other_settings_are_refused_naming_them(run, capsys):
    # Part A under Alg 1 at seed 0 and at seed 1 are two experiments, not a rerun.
    old, new = (str(RESULTS / f"chu2023_A_alg1{s}.json") for s in ("", "_seed1"))
    with pytest.raises(SystemExit):
        cmp.main([old, new])
    assert "other settings, so they are not a rerun of each other: seed (0 vs 1)" \
        in capsys.readouterr().err
    other = copy.deepcopy(run)
    other["settings"].update(pseudo_start="masked", rounds=120)
    with pytest.raises(ValueError, match=r"pseudo_start \('kept' vs 'masked'\), "
                                         r"rounds \(30 vs 120\)"):
        cmp.compare(run, other)
    # Old files merged into one run must agree with each other too.
    half = len(run["rows"]) // 2
    first = {**run, "rows": run["rows"][:half]}
    second = {**run, "rows": run["rows"][half:], "settings": dict(run["settings"], lr=0.2)}
    with pytest.raises(ValueError, match=r"old file 2 .* lr \(0.1 vs 0.2\)"):
        cmp.merge([first, second])


def test_part_a_rows_of_another_seed_protocol_or_semantics_do_not_match():
    a = json.loads((RESULTS / "chu2023_A_alg1.json").read_text())
    a.pop("settings")  # rows alone: the key must keep the runs apart
    for field, value in (("seed", 1), ("protocol", "pruned_model"), ("trained_rounds", 30)):
        other = copy.deepcopy(a)
        for r in other["rows"]:
            r[field] = value
        n = len(a["rows"])
        with pytest.raises(ValueError, match=f"{n} only in the old run, {n} only in the new one"):
            cmp.compare(a, other)
    b = json.loads(STORED.read_text())
    b.pop("settings")
    other = copy.deepcopy(b)
    for r in other["rows"]:
        r["upload_semantics"] = "split"
    with pytest.raises(ValueError, match="only in the old run"):
        cmp.compare(b, other)


def test_the_header_keeps_the_dirty_mark(run):
    old = {**run, "commit": "a" * 40}
    new = {**copy.deepcopy(run), "commit": "b" * 40 + "-dirty"}
    md = cmp.render(cmp.compare(old, new), ("old.json", "new.json"))
    assert "Commits: old aaaaaaa, new bbbbbbb-dirty." in md
    merged = cmp.merge([{**run, "commit": "c" * 40 + "-dirty"}, {**run, "commit": "d" * 40}])
    assert merged["commit"] == "ccccccc-dirty, ddddddd"
    combined = {**run, "commit": "A " + "e" * 40 + "-dirty, B " + "f" * 40}
    md = cmp.render(cmp.compare(combined, new), ("old.json", "new.json"))
    assert "Commits: old A eeeeeee-dirty, B fffffff, new bbbbbbb-dirty." in md


def test_named_settings_may_differ_and_the_report_names_them(run, tmp_path, capsys):
    # The masked-start reruns differ from their recorded runs in pseudo_start only:
    # refused without --differing (the reports could not be regenerated), compared with it.
    old = str(RESULTS / "chu2023_B.json")
    new = str(RESULTS / "chu2023_B_masked_start.json")
    out = tmp_path / "report.md"
    cmp.main([old, new, "--differing", "pseudo_start", "--out", str(out)])
    text = out.read_text()
    assert "--differing pseudo_start`" in text
    assert "differ in these settings, as asked (old vs new): pseudo_start ('kept' vs 'masked')" \
        in text
    other = copy.deepcopy(run)
    other["settings"].update(pseudo_start="masked", rounds=120)
    with pytest.raises(ValueError, match=r"other settings.*: rounds \(30 vs 120\) "
                                         r"\(--differing NAME"):
        cmp.compare(run, other, differing=("pseudo_start",))
    with pytest.raises(SystemExit):
        cmp.main([old, new, "--differing", "pseudo_strat"])
    assert "--differing pseudo_strat: not a setting the runs record" in capsys.readouterr().err
