"""Run a test that crashed its xdist worker once more, and say so.

CI once lost a whole run (2,082 tests passed) to one crashed worker:
``worker 'gw0' crashed while running
tests/fedsim/test_simulation.py::test_rounds_evaluation_and_calibration_run_under_the_configured_precision[highest-vmap]``,
a test that passes alone and passed in every earlier CI run, with nothing
in the part of the output CI keeps that says why the process ended (a
segfault's faulthandler dump, a kernel OOM kill and an ``os._exit`` leave
different traces, and none was kept).

So a test that ends its worker process is run once more, on the worker xdist
starts in its place (the pattern of xdist's ``pytest_handlecrashitem`` hook):
it then passes or fails on its own merits, and a second crash fails it. Every
crash is listed at the end of the run, whatever came of the second run, with
what the controller could find out when it noticed: how the worker process
ended (exit code or signal), the memory then available, and the kernel log's
lines about killed processes and segfaults where ``dmesg`` is readable. A
crash is reported, never hidden; it no longer costs the rest of the run.
The run also ends with each worker's peak resident memory (workers that
crashed report none), to set a crash against.

``tests/conftest.py`` registers this module as a plugin; ``tests/test_crash_rerun.py`` runs
a small suite through them.
"""

from __future__ import annotations

import resource
import signal
import subprocess

import pytest

#: Node id -> what was found out at each crash of it, in order.
_crashes: dict[str, list[str]] = {}
#: Worker id -> its peak resident set size in KiB, as it reported at its end.
_peaks: dict[str, int] = {}


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
    _crashes.setdefault(crashitem, []).append("; ".join(found[:1]) + "".join(
        "\n" + line for line in found[1:]))
    if len(_crashes[crashitem]) == 1 and hasattr(sched, "mark_test_pending"):
        sched.mark_test_pending(crashitem)
        report.outcome = "rerun"


def pytest_sessionfinish(session):
    """In an xdist worker: hand the controller this process's peak resident memory."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    peak = getattr(node, "workeroutput", {}).get("peak_rss_kib")
    if peak is not None:
        _peaks[node.gateway.id] = peak


def pytest_report_teststatus(report, config):
    if report.outcome == "rerun":
        return "rerun", "R", ("RERUN", {"yellow": True})
    return None


def pytest_terminal_summary(terminalreporter):
    if _peaks:
        terminalreporter.write_line("peak resident memory of the xdist workers: " + ", ".join(
            f"{w} {kib / 1024**2:.1f} GiB" for w, kib in sorted(_peaks.items())))
    if not _crashes:
        return
    terminalreporter.write_sep("=", "tests that crashed their worker", yellow=True, bold=True)
    for nodeid, found in _crashes.items():
        fate = ("crashed twice: failed" if len(found) > 1
                else "run again on a new worker (its result is in the counts above)")
        terminalreporter.write_line(f"{nodeid}: {fate}")
        for i, what in enumerate(found, 1):
            terminalreporter.write_line(f"  crash {i}: {what}")
