"""The xdist workers' health (tests/worker_health.py): a crashed test runs once more, every crash
is listed, and each worker reports its peak memory and memory mappings."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

INNER_TESTS = """
    import os
    import signal
    from pathlib import Path


    def test_ok():
        pass


    def test_crashes_the_first_time():
        mark = Path(os.environ["CRASH_MARK"])
        if not mark.exists():
            mark.write_text("crashed once")
            os._exit(3)


    def test_crashes_every_time():
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
"""


def test_a_crashed_test_runs_once_more_and_every_crash_is_listed(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "conftest.py").write_text(
        "def pytest_configure(config):\n"
        "    from tests import worker_health\n"
        "    config.pluginmanager.register(worker_health, 'fedsim-worker-health')\n")
    (suite / "test_inner.py").write_text(textwrap.dedent(INNER_TESTS))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CRASH_MARK": str(tmp_path / "mark")}
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider",
                           "test_inner.py"], cwd=suite, env=env,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]  # the test that crashes twice fails
    summary = out.strip().splitlines()[-1]
    for count in ("1 failed", "2 passed", "2 rerun"):
        assert re.search(rf"\b{count}\b", summary), out[-3000:]
    assert "tests that crashed their worker" in out
    once = "test_inner.py::test_crashes_the_first_time"
    always = "test_inner.py::test_crashes_every_time"
    assert f"{once}: run again on a new worker" in out, out[-3000:]
    assert f"{always}: crashed twice: failed" in out, out[-3000:]
    section = out[out.index("tests that crashed their worker"):]
    once_part = section[section.index(once):section.index(always)] if (
        section.index(once) < section.index(always)) else section[section.index(once):]
    assert re.search(r"crash 1: gw\d+: exit code 3, [\d.]+ GiB available", once_part), section
    assert "crash 2" not in once_part
    always_part = section[section.index(always):]
    assert len(re.findall(r"crash [12]: gw\d+: killed by SIGKILL", always_part)) == 2, section
    assert (tmp_path / "mark").read_text() == "crashed once"
    # the one worker that did not crash reports its peak memory; the three that did, none
    assert re.search(r"xdist workers' peak memory, and most memory mappings at a module's end "
                     r"\(vm\.max_map_count (\d+|unknown)\): gw\d+ [\d.]+ GiB, [1-9]\d* mappings\n",
                     out), out


def test_dropping_jax_caches_unmaps_the_compiled_programs():
    """The mechanism tests/conftest.py relies on: each compiled XLA:CPU program
    holds memory mappings until JAX's caches let it go."""
    import gc

    import jax
    import jax.numpy as jnp

    from fedsim.memory import memory_mappings
    from tests.worker_health import note_mappings

    jax.clear_caches()
    gc.collect()
    before = note_mappings()
    programs = [jax.jit(lambda x, i=i: jnp.sin(x @ x.T).sum() * i + jnp.cumsum(x, axis=0))
                for i in range(100)]
    for f in programs:
        f(jnp.ones((4, 4))).block_until_ready()
    held = note_mappings()
    del programs, f
    jax.clear_caches()
    gc.collect()
    after = memory_mappings()
    assert held - before > 400, (before, held)  # about 9 per program measured here
    # what stays (some tens of mappings: allocator arenas, threads) does not grow with them
    assert after - before < (held - before) / 4, (before, held, after)
