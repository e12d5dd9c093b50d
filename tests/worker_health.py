"""The xdist workers' health: a crashed test runs once more, and the run says
how each worker fared.

CI lost a whole run (2,082 tests passed) to one crashed worker:
``worker 'gw0' crashed while running
tests/fedsim/test_simulation.py::test_rounds_evaluation_and_calibration_run_under_the_configured_precision[highest-vmap]``,
a test that passes alone. A CI rehearsal here crashed the same way in the
same test (``[highest-auto]``, at about 90 % of the run), and its output held
the faulthandler dump: a segmentation fault inside XLA, loading an
executable from the compilation cache. A worker never freed what it
compiled: XLA:CPU maps each executable's code into the process (about 9
memory mappings per small program, ``benchmarks/diagnose_map_count.py``),
and a process past the kernel's ``vm.max_map_count`` (65,530 here) segfaults
in XLA's compile (the same script, with the limit lowered). Two rehearsals
side by side (``benchmarks/watch_mappings.sh``): with the caches kept, a
worker held 50,278 mappings at about 70 % of the run, when it was stopped;
with them dropped, no worker held more than 14,535. The crash fits the limit;
no run here was watched as it crashed. The suite now drops JAX's caches after
each module (``tests/conftest.py``), which unmaps them.

What this module adds, so that a crash no longer costs the rest of the run
and says what it can of its cause:

- A test that ends its worker process is run once more, on the worker xdist
  starts in its place (the pattern of xdist's ``pytest_handlecrashitem``
  hook): it then passes or fails on its own merits, and a second crash fails
  it. Every crash is listed at the end of the run, whatever came of the
  second run, with how the worker process ended (exit code or signal), the
  memory then available, and the kernel log's lines about killed processes
  and segfaults where ``dmesg`` is readable. A crash is reported, never
  hidden.
- Each worker reports its peak resident memory and the most memory mappings
  it held at the end of a test module (:func:`note_mappings`), against
  ``vm.max_map_count``; workers that crashed report nothing.

``tests/conftest.py`` registers this module as a plugin;
``tests/test_worker_health.py`` runs small suites through it.
"""

from __future__ import annotations

import resource
import signal
import subprocess

import pytest

#: Node id -> what was found out at each crash of it, in order.
_crashes: dict[str, list[str]] = {}
#: Worker id -> (peak resident set size in KiB, most memory mappings noted), as it
#: reported at its end.
_peaks: dict[str, tuple[int, int]] = {}
#: The most memory mappings this process held when :func:`note_mappings` looked.
_most_mappings = 0


def note_mappings() -> int:
    """Count this process's memory mappings and keep the most seen; returns the count."""
    from fedsim.memory import memory_mappings  # not at import: it imports JAX

    global _most_mappings
    now = memory_mappings() or 0
    _most_mappings = max(_most_mappings, now)
    return now


def _how_it_ended(worker) -> str:
    """The crashed worker's exit status, where execnet's Popen object is reachable."""
    popen = getattr(getattr(getattr(worker, "gateway", None), "_io", None), "popen", None)
    if popen is None:
        return "exit status unknown"
    try:
        code = popen.wait(timeout=5)
    except Exception:  # subprocess.TimeoutExpired, or an execnet that changed
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _memory_available() -> str:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return f"{int(line.split()[1]) / 1024**2:.1f} GiB available"
    except (OSError, ValueError, IndexError):
        pass
    return "memory available unknown"


def _kernel_lines(limit: int = 10) -> list[str]:
    """The kernel log's last lines about killed or faulting processes, if readable."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    keep = ("oom", "killed process", "segfault", "general protection", "trap")
    return [line for line in out.splitlines() if any(k in line.lower() for k in keep)][-limit:]


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """Schedule a test that crashed its worker once more (its first crash only)."""
    worker = getattr(report, "node", None)
    found = [f"{getattr(getattr(worker, 'gateway', None), 'id', '?')}: "
             f"{_how_it_ended(worker)}, {_memory_available()}"]
    found += [f"  kernel: {line}" for line in _kernel_lines()]
    _crashes.setdefault(crashitem, []).append("\n".join(found))
    if len(_crashes[crashitem]) == 1 and hasattr(sched, "mark_test_pending"):
        sched.mark_test_pending(crashitem)
        report.outcome = "rerun"


def pytest_sessionfinish(session):
    """In an xdist worker: hand the controller this process's peak resident memory
    and the most memory mappings noted."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        note_mappings()
        output["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        output["most_mappings"] = _most_mappings


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", {})
    if "peak_rss_kib" in output:
        _peaks[node.gateway.id] = (output["peak_rss_kib"], output.get("most_mappings", 0))


def pytest_report_teststatus(report, config):
    if report.outcome == "rerun":
        return "rerun", "R", ("RERUN", {"yellow": True})
    return None


def pytest_terminal_summary(terminalreporter):
    if _peaks:
        from fedsim.memory import max_map_count

        limit = max_map_count()
        terminalreporter.write_line(
            "xdist workers' peak memory, and most memory mappings at a module's end "
            f"(vm.max_map_count {limit if limit is not None else 'unknown'}): " + ", ".join(
                f"{w} {kib / 1024**2:.1f} GiB, {maps} mappings"
                for w, (kib, maps) in sorted(_peaks.items())))
    if not _crashes:
        return
    terminalreporter.write_sep("=", "tests that crashed their worker", yellow=True, bold=True)
    for nodeid, found in _crashes.items():
        fate = ("crashed twice: failed" if len(found) > 1
                else "run again on a new worker (its result is in the counts above)")
        terminalreporter.write_line(f"{nodeid}: {fate}")
        for i, what in enumerate(found, 1):
            terminalreporter.write_line(f"  crash {i}: {what}")
