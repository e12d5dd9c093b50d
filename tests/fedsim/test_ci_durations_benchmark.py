"""benchmarks/ci_durations.py: per-file sums of pytest --durations=0 logs."""

import json

import pytest

from benchmarks.ci_durations import main, parse_log

LOG = """bringing up nodes...
........ [100%]
============================= slowest durations ==============================
12.50s call     tests/fedsim/test_a.py::test_one[x]
2.00s setup    tests/fedsim/test_a.py::test_one[x]
0.50s call     tests/fedsim/test_a.py::test_two
3.25s call     tests/attacks/test_b.py::TestK::test_three
(40 durations < 0.005s hidden.  Use -vv to show these durations.)
8 passed, 1 skipped, 6 warnings in 10.50s
"""


def test_a_log_is_summed_by_file_with_its_wall_and_worker_time():
    got = parse_log(LOG)
    assert got["files"] == {"tests/fedsim/test_a.py": {"seconds": 15.0, "calls": 2},
                            "tests/attacks/test_b.py": {"seconds": 3.25, "calls": 1}}
    assert list(got["files"]) == ["tests/fedsim/test_a.py", "tests/attacks/test_b.py"]
    assert (got["passed"], got["wall_s"], got["worker_s"]) == (8, 10.5, 18.25)


def test_two_logs_side_by_side_and_a_log_without_durations_is_named(tmp_path, capsys):
    (tmp_path / "a.log").write_text(LOG)
    (tmp_path / "b.log").write_text(LOG.replace("12.50s", "2.50s").replace("10.50s", "5.25s"))
    assert main(["--log", f"before={tmp_path / 'a.log'}", "--log", f"after={tmp_path / 'b.log'}",
                 "--out", str(tmp_path / "out")]) == 0
    res = json.loads((tmp_path / "out" / "ci_durations.json").read_text())
    assert res["logs"]["after"]["files"]["tests/fedsim/test_a.py"]["seconds"] == 5.0
    md = (tmp_path / "out" / "ci_durations.md").read_text()
    assert "- wall: after / before = 5 / 10 s = 0.50" in md
    assert "| tests/fedsim/test_a.py | 2 | 15.0 | 5.0 |" in md
    (tmp_path / "d.log").write_text(LOG.replace("10.50s", "20.50s"))
    assert main(["--log", f"off/1={tmp_path / 'a.log'}", "--log", f"off/2={tmp_path / 'd.log'}",
                 "--log", f"on/1={tmp_path / 'b.log'}", "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "ci_durations.md").read_text()
    assert "- wall: on / off (median of 2) = 5 / 16 s = 0.34" in md
    (tmp_path / "c.log").write_text("8 passed in 3.0s\n")
    with pytest.raises(SystemExit):
        main(["--log", f"c={tmp_path / 'c.log'}", "--out", str(tmp_path / "out")])
    assert "no test durations in the log" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--log", f"a={tmp_path / 'a.log'}", "--top", "0", "--out", str(tmp_path / "out")])
    assert "--top must be at least 1, got 0" in capsys.readouterr().err
