"""benchmarks/suite_compile_profile.py: compiles charged to the test that made them."""

import json

import pytest

from benchmarks import suite_compile_profile as bench

TINY = """
import jax, jax.numpy as jnp

def test_two_shapes():
    f = jax.jit(lambda x: jnp.sin(x) * 2)
    f(jnp.ones(3)); f(jnp.ones(4))

def test_a_random_draw():
    jax.random.normal(jax.random.key(0), (2, 3))

def test_fails():
    assert False
"""


def profile(tmp_path, source=TINY, *extra):
    (tmp_path / "test_tiny.py").write_text(source)
    return bench.main(["--out", str(tmp_path / "out"), *extra, "--",
                       str(tmp_path / "test_tiny.py"), "-n", "0", "-p", "no:cacheprovider",
                       "-o", "addopts="])


def test_each_compile_is_charged_to_its_test_and_the_run_is_recorded(tmp_path):
    result = profile(tmp_path)
    run, c = result["run"], result["compile"]
    assert run["exit_code"] == 1 and "1 failed, 2 passed" in run["summary"]
    assert run["wall_s"] > 0 and run["cpu_user_s"] > 0
    tests = {r["name"].split("::")[-1]: r for r in c["top_tests"]}
    # One jitted function at two shapes: two compiles of the same module name.
    assert {m["name"]: m["compiles"] for m in c["modules"]}["jit(<lambda>)"] == 2
    assert tests["test_two_shapes"]["compiles"] >= 2
    assert c["random_draw_compiles"] == 1 and tests["test_a_random_draw"]["compiles"] >= 1
    assert c["tests"] == 3 and c["processes"] == 1
    assert c["compiles"] == sum(m["compiles"] for m in c["modules"])  # all fit in --top
    assert 0 < c["small_compiles"] <= c["compiles"]
    saved = json.loads((tmp_path / "out" / "suite_compile_profile.json").read_text())
    assert saved == json.loads(json.dumps(result))
    md_path = tmp_path / "out" / "suite_compile_profile.md"
    md = md_path.read_text()
    assert "exit code 1" in md and "| `jit(<lambda>)` | 2 |" in md
    md_path.unlink()
    bench.main(["--render", str(tmp_path / "out" / "suite_compile_profile.json")])
    assert md_path.read_text() == md


def test_bad_arguments_and_an_empty_run_are_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--top", "0"])
    assert "--top must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--render", str(tmp_path / "missing.json")])
    assert "no such file" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text('{"rows": []}')
    with pytest.raises(SystemExit):
        bench.main(["--render", str(other)])
    assert f"--render {other}: not a suite_compile_profile result" in capsys.readouterr().err
    assert not other.with_suffix(".md").exists()
    with pytest.raises(SystemExit):
        profile(tmp_path, "def helper():\n    pass\n")
    assert "no test-running process reported compiles" in capsys.readouterr().err
