"""How much of the test suite's time is XLA compiling, and of what.

Runs the README's test command (``python -m pytest``, the options in
``pyproject.toml``; arguments after ``--`` go to pytest instead) with
:mod:`benchmarks.compile_profile_plugin`, which charges every XLA compile in
the processes that run tests to the test running at the time. Writes
``suite_compile_profile.json`` and ``.md``: the run's wall and CPU seconds
(pytest and every process under it), the compiles' count and seconds, those
under 1 s (below the persistent cache's threshold; mostly eager operations,
each compiled on its first call with its shapes), eager random draws, cache
hits, and the largest module names, files and tests.

Run::

    python -m benchmarks.suite_compile_profile            # the whole suite
    python -m benchmarks.suite_compile_profile -- tests/fedsim/test_models.py -n 0

Compile seconds are each compile's wall time, so they grow on a loaded
machine; the shares are what to compare. Compiles in subprocesses the tests
start (multi-process and command-line tests) are not counted (their CPU is in
the totals). Use ``benchmarks/ci_durations.py`` for time per test file.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.compile_profile_plugin import ENV_DIR, OUTSIDE, SMALL_S
from benchmarks.provenance import ROOT, git_commit
from benchmarks.results_file import read_or_exit
from benchmarks.results_io import write_json_and_markdown

NAME = "suite_compile_profile"
#: The module names of jax.random draws called outside jit (each compiles per shape).
RANDOM_DRAWS = re.compile(r"^jit\(_(normal|uniform|truncated_normal|randint|bernoulli|laplace|"
                          r"gumbel|gamma|categorical|choice|permutation|exponential|"
                          r"beta|dirichlet|shuffle)\)$")
_SUMMARY = re.compile(r"^=*\s*(.*\b(?:passed|failed|error)\b.* in [\d.]+s.*?)\s*=*$")


def run_suite(pytest_args: list[str]) -> tuple[dict, list[dict]]:
    """pytest with the plugin: (run facts, one record per test-running process)."""
    with tempfile.TemporaryDirectory(prefix="fedsim-compile-profile-") as out:
        env = {**os.environ, ENV_DIR: out}
        cmd = [sys.executable, "-m", "pytest", "-p", "benchmarks.compile_profile_plugin",
               *pytest_args]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        sys.stdout.write(proc.stdout[-3000:])
        summary = [m.group(1) for line in proc.stdout.splitlines()
                   if (m := _SUMMARY.match(line.strip()))]
        records = [json.loads(p.read_text()) for p in sorted(Path(out).glob("*.json"))]
    return {"exit_code": proc.returncode, "summary": summary[-1] if summary else None,
            "wall_s": round(wall, 2),
            "cpu_user_s": round(after.ru_utime - before.ru_utime, 2),
            "cpu_sys_s": round(after.ru_stime - before.ru_stime, 2)}, records


def aggregate(records: list[dict], top: int) -> dict:
    """Totals, and the ``top`` largest module names, test files and tests by compile seconds."""
    tests: dict[str, dict] = {}
    for rec in records:  # one process runs each test; every process has OUTSIDE
        for test, r in rec["tests"].items():
            if test not in tests:
                tests[test] = {**r, "modules": dict(r["modules"])}
                continue
            have = tests[test]
            for k in ("compiles", "compile_s", "cache_hits", "small_compiles",
                      "small_compile_s"):
                have[k] += r[k]
            for m, v in r["modules"].items():
                old = have["modules"].get(m, {"compiles": 0, "compile_s": 0.0})
                have["modules"][m] = {"compiles": old["compiles"] + v["compiles"],
                                      "compile_s": old["compile_s"] + v["compile_s"]}
    modules = collections.defaultdict(lambda: [0, 0.0])
    files = collections.defaultdict(lambda: [0, 0.0])
    for test, r in tests.items():
        files[test.split("::")[0]][0] += r["compiles"]
        files[test.split("::")[0]][1] += r["compile_s"]
        for m, v in r["modules"].items():
            modules[m][0] += v["compiles"]
            modules[m][1] += v["compile_s"]
    draws = [v for m, v in modules.items() if RANDOM_DRAWS.match(m)]

    def ranked(d: dict) -> list[dict]:
        rows = sorted(d.items(), key=lambda kv: -kv[1][1])[:top]
        return [{"name": k, "compiles": n, "compile_s": round(s, 2)} for k, (n, s) in rows]

    return {
        "processes": len(records),
        "tests": len(set(tests) - {OUTSIDE}),
        "compiles": sum(r["compiles"] for r in tests.values()),
        "compile_s": round(sum(r["compile_s"] for r in tests.values()), 2),
        "cache_hits": sum(r["cache_hits"] for r in tests.values()),
        "small_compiles": sum(r["small_compiles"] for r in tests.values()),
        "small_compile_s": round(sum(r["small_compile_s"] for r in tests.values()), 2),
        "random_draw_compiles": sum(n for n, _ in draws),
        "random_draw_compile_s": round(sum(s for _, s in draws), 2),
        "modules": ranked(modules), "files": ranked(files),
        "top_tests": ranked({t: [r["compiles"], r["compile_s"]] for t, r in tests.items()}),
    }


def markdown(result: dict) -> str:
    run, c = result["run"], result["compile"]
    cpu = run["cpu_user_s"] + run["cpu_sys_s"]

    def share(s):
        return f"{100 * s / cpu:.0f} %" if cpu else "-"

    lines = ["# Test suite: XLA compile time", "",
             f"`python -m benchmarks.suite_compile_profile {' '.join(result['argv'])}` at "
             f"commit {result['commit']}: `{' '.join(result['pytest_command'])}`. "
             f"{result['cpu_count']} CPUs; one run.", "",
             f"- pytest: {run['summary'] or 'no summary line'} (exit code {run['exit_code']}).",
             f"- Wall {run['wall_s']:.0f} s; CPU {cpu:.0f} s (user {run['cpu_user_s']:.0f}, "
             f"system {run['cpu_sys_s']:.0f}) over pytest and every process under it.",
             f"- XLA compiles in the {c['processes']} test-running processes: {c['compiles']}, "
             f"{c['compile_s']:.1f} s ({share(c['compile_s'])} of the CPU seconds).",
             f"  - each under {SMALL_S:g} s (below the persistent cache's threshold, so "
             f"compiled again wherever they recur): {c['small_compiles']} compiles, "
             f"{c['small_compile_s']:.1f} s ({share(c['small_compile_s'])}).",
             f"  - jax.random draws outside jit: {c['random_draw_compiles']} compiles, "
             f"{c['random_draw_compile_s']:.1f} s ({share(c['random_draw_compile_s'])}).",
             f"  - persistent-cache hits (compiles skipped): {c['cache_hits']}.",
             "- Not counted: compiles in the subprocesses tests start (their CPU is in the "
             "total above). Compile seconds are wall times: on a loaded machine they grow.", ""]
    for key, title in (("modules", "Module names"), ("files", "Test files"),
                       ("top_tests", "Tests")):
        lines += [f"## {title} by compile seconds", "", "| name | compiles | seconds |",
                  "|---|---|---|"]
        lines += [f"| `{r['name']}` | {r['compiles']} | {r['compile_s']:.1f} |"
                  for r in c[key]]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
        if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--top", type=int, default=25, help="rows per table")
    ap.add_argument("--render", metavar="JSON", help="rewrite the markdown of a results JSON")
    args = ap.parse_args(ours)
    if args.render:
        result = read_or_exit(ap, args.render, "--render")
        try:
            md = markdown(result)
        except (KeyError, TypeError) as e:
            ap.error(f"--render {args.render}: not a {NAME} result (no {e})")
        Path(args.render).with_suffix(".md").write_text(md)
        return result
    if args.top < 1:
        ap.error(f"--top must be at least 1, got {args.top}")
    commit = git_commit()
    run, records = run_suite(pytest_args)
    compiled = aggregate(records, args.top)
    if not compiled["tests"]:
        ap.error("no test-running process reported compiles (did pytest collect any test? "
                 f"exit code {run['exit_code']}, {run['summary']})")
    result = {"argv": argv, "commit": commit, "cpu_count": os.cpu_count(),
              "pytest_command": ["python", "-m", "pytest", *pytest_args], "run": run,
              "compile": compiled}
    write_json_and_markdown(args.out, NAME, result, markdown(result))
    return result


if __name__ == "__main__":
    main()
