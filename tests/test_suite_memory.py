"""JAX's caches are dropped after each test module (tests/conftest.py); benchmarks/suite_memory.py
measures what that saves and benchmarks/diagnose_map_count.py why it matters."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _inner_suite(tmp_path: Path) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "conftest.py").write_text("from tests.conftest import _release_compiled_programs  "
                                       "# noqa: F401\n")
    (suite / "shared_program.py").write_text("import jax\n\nadd_one = jax.jit(lambda x: x + 1)\n")
    (suite / "test_a_compiles.py").write_text(textwrap.dedent("""
        from shared_program import add_one


        def test_compiles():
            assert int(add_one(1)) == 2 and add_one._cache_size() == 1


        def test_still_cached_within_the_module():
            assert add_one._cache_size() == 1
    """))
    (suite / "test_b_looks.py").write_text(textwrap.dedent("""
        import os

        from shared_program import add_one


        def test_what_the_module_before_left():
            assert add_one._cache_size() == int(os.environ["EXPECT_CACHED"])
    """))
    return suite


@pytest.mark.parametrize("keep, expect_cached", [("0", 0), ("1", 1), (None, 0)])
def test_a_module_finds_the_programs_of_the_one_before_dropped_unless_told_to_keep_them(
        tmp_path, keep, expect_cached):
    suite = _inner_suite(tmp_path)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{suite}",
           "EXPECT_CACHED": str(expect_cached), "JAX_PLATFORMS": "cpu"}
    env.pop("FEDSIM_TESTS_KEEP_JAX_CACHES", None)
    if keep is not None:
        env["FEDSIM_TESTS_KEEP_JAX_CACHES"] = keep
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-q", "-p",
                           "no:cacheprovider", "test_a_compiles.py", "test_b_looks.py"],
                          cwd=suite, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "3 passed" in proc.stdout


def test_the_benchmark_runs_each_setting_and_writes_json_and_markdown(tmp_path, capsys):
    from benchmarks import suite_memory

    suite_memory.main(["--out", str(tmp_path), "--modules", "tests/fedsim/test_keys.py"])
    result = json.loads((tmp_path / "suite_memory.json").read_text())
    assert [r["setting"] for r in result["rows"]] == ["keep", "release"]
    for r in result["rows"]:
        assert r["passed"] >= 1 and 0.05 < r["peak_rss_gib"] < 20 and r["wall_s"] > 0
        assert r["most_mappings"] > 100  # a Python process with JAX loaded holds hundreds
    md = (tmp_path / "suite_memory.md").read_text()
    assert "| keep |" in md and "| release |" in md and "Release / keep: peak RSS" in md
    with pytest.raises(SystemExit):
        suite_memory.main(["--out", str(tmp_path), "--modules", "tests/no_such_test.py"])
    assert "--modules: no such test file(s): ['tests/no_such_test.py']" in capsys.readouterr().err


def test_the_map_count_diagnosis_counts_mappings_per_program_and_their_release(tmp_path, capsys):
    from benchmarks import diagnose_map_count

    diagnose_map_count.main(["--out", str(tmp_path), "--programs", "100"])
    result = json.loads((tmp_path / "diagnose_map_count.json").read_text())
    points = result["per_program"]["points"]
    assert [p["programs"] for p in points] == [0, 100, 100] and points[-1]["cleared"]
    assert points[1]["mappings"] - points[0]["mappings"] > 400  # several per program
    assert points[2]["mappings"] < points[0]["mappings"] + 200  # let go again
    assert "at_the_limit" not in result  # only where asked, as root
    md = (tmp_path / "diagnose_map_count.md").read_text()
    assert "mappings per program held" in md and "after `jax.clear_caches()`" in md
    for argv, message in ((["--programs", "10"], "--programs: at least 100"),
                          (["--lower-max-map-count", "10"], "--lower-max-map-count: at least")):
        with pytest.raises(SystemExit):
            diagnose_map_count.main(["--out", str(tmp_path), *argv])
        assert message in capsys.readouterr().err
