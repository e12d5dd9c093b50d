import os
import shutil
import sys
import tempfile

import pytest

# Tests run on CPU; keep XLA from grabbing every core's worth of threads.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The command line turns on JAX's persistent compilation cache in the user's
# cache directory; the suite's numbers must not depend on what earlier runs
# left there (tests/fedsim/test_compile_cache.py turns it on where it tests it).
os.environ.setdefault("FEDSIM_COMPILE_CACHE", "0")
# The suite's tolerances are float32's. Where it runs on a GPU
# (JAX_PLATFORMS=cuda, benchmarks/gpu_session.sh), JAX would otherwise let
# XLA compute float32 products in TF32 in the code the engine does not wrap
# (attacks and defenses called directly); the engine's own setting,
# training.matmul_precision, is tested in tests/fedsim/test_simulation.py.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")

#: Size cap of the run's compilation cache. Any cap turns on JAX's file lock
#: around each read and write, which the xdist workers and the multi-process
#: tests' subprocesses, all sharing the directory, need: without it, one
#: process could read an entry another is still writing.
_RUN_CACHE_BYTES = 4 * 1024**3


def pytest_configure(config):
    """One fresh compilation cache for this run, shared by its workers and subprocesses.

    Much of the suite's time on XLA:CPU is compiling round steps, and many
    tests compile the same program (the same small config on another
    Simulation, each process of a multi-process test). JAX's persistent cache
    loads an executable compiled once in the run instead of compiling it
    again: the same executable, so the same numbers
    (test_compile_cache.py::test_second_process_loads_the_executables_with_the_same_numbers).
    The directory is new for each run and deleted after it, so nothing an
    earlier run left on disk reaches this one. The controller makes it before
    xdist starts its workers, which inherit the environment, as do the
    subprocesses tests start. A cache directory set by whoever runs the suite
    (``JAX_COMPILATION_CACHE_DIR``) is used as it is.

    Also registers :mod:`tests.worker_health`: a test that crashes its xdist
    worker runs once more, and the run ends listing every crash and each
    worker's peak memory and memory mappings.
    """
    from tests import worker_health

    if not config.pluginmanager.is_registered(worker_health):
        config.pluginmanager.register(worker_health, "fedsim-worker-health")
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    path = tempfile.mkdtemp(prefix="fedsim-tests-xla-")
    config._fedsim_run_cache = path
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(_RUN_CACHE_BYTES))
    if "jax" in sys.modules:  # imported already (pytest -n 0 with a plugin that loads jax)
        import jax
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_compilation_cache_max_size",
                          int(os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"]))


def pytest_unconfigure(config):
    path = getattr(config, "_fedsim_run_cache", None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's in-memory caches after each test module.

    A worker otherwise keeps every program any earlier module compiled, and
    XLA:CPU maps each one's code into the process: a CI rehearsal's worker
    crashed, at about 90 % of the run, with a segmentation fault inside XLA
    loading one more, the way a process past the kernel's
    ``vm.max_map_count`` does (``tests/worker_health.py`` has the story,
    ``benchmarks/diagnose_map_count.py`` the measurements). Dropping the caches
    unmaps them; a later module that needs a dropped program compiles it
    again, or loads it from the run's compilation cache.
    ``benchmarks/suite_memory.py`` measures the peak memory, mappings and time
    of test modules in one process with and without this;
    ``FEDSIM_TESTS_KEEP_JAX_CACHES=1`` keeps the caches (for that comparison).
    """
    yield
    from tests.worker_health import note_mappings

    note_mappings()
    if os.environ.get("FEDSIM_TESTS_KEEP_JAX_CACHES") == "1":
        return
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
