"""benchmarks/mia_memory_plan.py: argument checks and one small real plan."""

import json

import pytest

from benchmarks import mia_memory_plan as bench


@pytest.mark.parametrize("argv,message", [
    (["--sizes", "0"], "--sizes"),
    (["--models", "nope"], "--models: unknown"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert message in capsys.readouterr().err


def test_a_set_larger_than_a_chunk_plans_more_all_at_once(tmp_path):
    assert bench.main(["--models", "lenet5", "--sizes", "8", "1024",
                       "--out", str(tmp_path)]) == 0
    small, large = json.loads((tmp_path / "mia_memory_plan.json").read_text())["rows"]
    if large["chunked_bytes"] is None:
        pytest.skip("this backend gives no memory analysis")
    # A set within one chunk is one call either way: the same program.
    assert small["chunked_bytes"] == small["all_at_once_bytes"]
    assert large["all_at_once_bytes"] > 2 * large["chunked_bytes"]
    assert "| lenet5 | 1,024 | 256 |" in (tmp_path / "mia_memory_plan.md").read_text()
