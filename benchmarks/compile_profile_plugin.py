"""pytest plugin for :mod:`benchmarks.suite_compile_profile`: XLA compiles per test.

Loaded with ``-p benchmarks.compile_profile_plugin``. It listens to JAX's
monitoring events in each process that runs tests (the xdist workers, or the
one pytest process with ``-n 0``) and charges every XLA backend compile, with
its module name (``jit(client_update)``, ``jit(add)`` for an eager ``+``) and
seconds, to the test running at the time. Persistent-cache hits (compiles JAX
skipped) are counted the same way. At the end each such process writes
``<pid>.json`` into ``$FEDSIM_COMPILE_PROFILE_DIR``; the controller of an xdist
run, which runs no test, writes nothing.

Not seen: compiles in subprocesses that tests start themselves (the
multi-process and command-line tests); their CPU time is in the driver's
totals but not in these counts.
"""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import pytest

ENV_DIR = "FEDSIM_COMPILE_PROFILE_DIR"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
#: A compile shorter than this is not written to JAX's persistent cache (the
#: default ``jax_persistent_cache_min_compile_time_secs``); counted apart.
SMALL_S = 1.0
#: Where compiles made while no test runs are charged (collection, imports). A
#: fixture runs inside its test's protocol: a session fixture's compiles go to
#: the first test that uses it.
OUTSIDE = "(outside tests)"

_current = OUTSIDE
_tests: dict[str, dict] = {}


def _record(test: str) -> dict:
    return _tests.setdefault(test, {"compiles": 0, "compile_s": 0.0, "cache_hits": 0,
                                    "small_compiles": 0, "small_compile_s": 0.0,
                                    "modules": collections.defaultdict(lambda: [0, 0.0])})


def _on_duration(event: str, duration: float, **kwargs) -> None:
    if event != _COMPILE_EVENT:
        return
    rec = _record(_current)
    rec["compiles"] += 1
    rec["compile_s"] += duration
    if duration < SMALL_S:
        rec["small_compiles"] += 1
        rec["small_compile_s"] += duration
    module = rec["modules"][str(kwargs.get("fun_name", "?"))]
    module[0] += 1
    module[1] += duration


def _on_event(event: str, **kwargs) -> None:
    if event == _CACHE_HIT_EVENT:
        _record(_current)["cache_hits"] += 1


def pytest_configure(config):
    import jax.monitoring

    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    jax.monitoring.register_event_listener(_on_event)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _current
    _current = item.nodeid
    _record(_current)  # every test run is listed, those that compile nothing too
    try:
        yield
    finally:
        _current = OUTSIDE


def pytest_sessionfinish(session):
    out = os.environ.get(ENV_DIR)
    if not out or not _tests:
        return
    tests = {t: {**r, "modules": {m: {"compiles": n, "compile_s": s}
                                  for m, (n, s) in r["modules"].items()}}
             for t, r in _tests.items()}
    Path(out, f"{os.getpid()}.json").write_text(json.dumps(
        {"worker": os.environ.get("PYTEST_XDIST_WORKER"), "tests": tests}))
