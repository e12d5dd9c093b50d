"""Peak memory of test modules run in one process, with and without dropping
JAX's caches after each module (``tests/conftest.py::_release_compiled_programs``).

Each setting runs ``pytest -n 0`` over the same modules in a fresh process
(its own fresh compilation cache, as every run of the suite gets) and reads
the process's peak resident set size from ``os.wait4``, with its wall time,
and the most memory mappings it held (``/proc/PID/maps``, read every half
second: XLA:CPU maps each compiled program's code, and a process past the
kernel's ``vm.max_map_count`` segfaults, ``benchmarks/diagnose_map_count.py``).
``FEDSIM_TESTS_KEEP_JAX_CACHES=1`` is the "keep" setting. The settings run one
after the other, in the order given, on an otherwise idle machine where the
wall times are to mean anything (this one is noisy: read a few percent as
nothing).

Run::

    python -m benchmarks.suite_memory --out benchmarks/results/suite_memory

It writes ``suite_memory.json`` and ``suite_memory.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import threading
import time

from benchmarks.provenance import ROOT, git_commit, short_commit
from benchmarks.results_io import write_json_and_markdown

#: Six attack modules whose tests compile many distinct programs (a run of
#: about ten minutes on the project's 2-core machine).
DEFAULT_MODULES = ["tests/attacks/test_gradient_inversion.py", "tests/attacks/test_labels.py",
                   "tests/attacks/test_membership.py", "tests/attacks/test_representation.py",
                   "tests/attacks/test_sgi.py", "tests/attacks/test_model_inversion.py"]
SETTINGS = {"keep": {"FEDSIM_TESTS_KEEP_JAX_CACHES": "1"},
            "release": {"FEDSIM_TESTS_KEEP_JAX_CACHES": "0"}}
_SUMMARY = re.compile(r"(\d+) passed")


def run_setting(name: str, modules: list[str], marker: str) -> dict:
    """One pytest process over ``modules`` under setting ``name``: peak RSS, wall time."""
    env = {**os.environ, **SETTINGS[name]}
    for var in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "JAX_COMPILATION_CACHE_DIR"):
        env.pop(var, None)  # a fresh compilation cache, made by tests/conftest.py
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-m", marker, "-n", "0", "-q",
           "-p", "no:cacheprovider", *modules]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    most = [0]
    done = threading.Event()

    def watch_mappings():
        while not done.wait(0.5):
            try:
                with open(f"/proc/{proc.pid}/maps", "rb") as f:
                    most[0] = max(most[0], sum(1 for _ in f))
            except OSError:  # ended (or a zombie not yet reaped)
                pass

    watcher = threading.Thread(target=watch_mappings, daemon=True)
    watcher.start()
    output = proc.stdout.read()
    done.set()
    watcher.join()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"setting {name!r}: pytest exited with {code}:\n{output[-3000:]}")
    passed = _SUMMARY.findall(output)
    return {"setting": name, "peak_rss_gib": round(usage.ru_maxrss / 1024**2, 3),
            "most_mappings": most[0], "wall_s": round(wall, 1),
            "passed": int(passed[-1]) if passed else None}


def markdown(result: dict) -> str:
    rows = {r["setting"]: r for r in result["rows"]}
    lines = [f"# Peak memory of test modules in one process ({result['date']}, commit "
             f"{short_commit(result['commit'])})", "",
             "Written by `benchmarks/suite_memory.py`: `pytest -n 0` over "
             f"{len(result['modules'])} modules ({', '.join(m.rsplit('/', 1)[-1] for m in result['modules'])}), "
             f"marker `{result['marker']}`, once per setting, in this order. *keep*: "
             "`FEDSIM_TESTS_KEEP_JAX_CACHES=1`, JAX's in-memory caches live for the whole "
             "process; *release*: `jax.clear_caches()` after each module (the suite's "
             "default). Peak RSS from `os.wait4`; mappings: the most lines of "
             "`/proc/PID/maps`, read every 0.5 s.", "",
             "| setting | tests passed | peak RSS (GiB) | most memory mappings | wall (s) |",
             "|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['setting']} | {r['passed']} | {r['peak_rss_gib']:.2f} | "
                     f"{r['most_mappings']:,} | {r['wall_s']:.0f} |")
    if {"keep", "release"} <= rows.keys():
        lines += ["", f"Release / keep: peak RSS {rows['release']['peak_rss_gib'] / rows['keep']['peak_rss_gib']:.2f}, "
                  f"memory mappings {rows['release']['most_mappings'] / max(rows['keep']['most_mappings'], 1):.2f}, "
                  f"wall time {rows['release']['wall_s'] / rows['keep']['wall_s']:.2f} "
                  "(one run each on a noisy machine)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/suite_memory")
    parser.add_argument("--modules", nargs="+", default=DEFAULT_MODULES)
    parser.add_argument("--settings", nargs="+", default=["keep", "release"],
                        choices=sorted(SETTINGS))
    parser.add_argument("--marker", default="not slow", help="pytest -m expression")
    args = parser.parse_args(argv)
    missing = [m for m in args.modules if not (ROOT / m.split("::")[0]).exists()]
    if missing:
        parser.error(f"--modules: no such test file(s): {missing}")
    rows = []
    for name in args.settings:
        rows.append(run_setting(name, args.modules, args.marker))
        print(rows[-1], flush=True)
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "commit": git_commit(), "modules": args.modules, "marker": args.marker,
              "rows": rows}
    write_json_and_markdown(args.out, "suite_memory", result, markdown(result))


if __name__ == "__main__":
    main()
