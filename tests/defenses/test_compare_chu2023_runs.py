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
