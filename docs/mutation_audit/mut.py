#!/usr/bin/env python3
"""Apply one mutation, run the given tests, revert, and append the outcome to a log.

Usage (run against a scratch clone, never the working copy you edit)::

    MUTREPO=/path/to/clone MUTLOG=/path/to/log.md \\
        python docs/mutation_audit/mut.py ID FILE 'OLD' 'NEW' -- TESTS...

OLD must occur exactly once in FILE. The tests run with
``pytest -o addopts= -m "not slow" -n 0 -q -x`` and ``PYTHONPATH=.`` in the
clone; pytest's exit status 1 is KILLED, 0 is SURVIVED, anything else is
recorded as ``rc=N`` (not a verdict). The file is restored with
``git checkout`` whatever the outcome.

This is the harness behind the logs in this folder (stops 76–77); each row
of a log can be re-run with it.
"""
import os
import subprocess
import sys
import time


def main(argv):
    if len(argv) < 5 or argv[4] != "--":
        sys.exit(__doc__)
    mid, path, old, new, tests = argv[0], argv[1], argv[2], argv[3], argv[5:]
    repo, log = os.environ["MUTREPO"], os.environ["MUTLOG"]
    full = os.path.join(repo, path)
    src = open(full).read()
    if src.count(old) != 1:
        sys.exit(f"OLD occurs {src.count(old)} times in {path}; it must occur once")
    line = src[:src.index(old)].count("\n") + 1
    open(full, "w").write(src.replace(old, new))
    start = time.time()
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-m", "not slow", "-n", "0", "-q",
           "-p", "no:cacheprovider", "-x", "--tb=line", *tests]
    try:
        r = subprocess.run(cmd, cwd=repo, env=dict(os.environ, PYTHONPATH="."),
                           capture_output=True, text=True, timeout=900)
        rc, out = r.returncode, (r.stdout + r.stderr).strip().splitlines()
    except subprocess.TimeoutExpired:
        rc, out = "timeout", []
    finally:
        subprocess.run(["git", "-C", repo, "checkout", "--", path], check=True)
    status = {1: "KILLED", 0: "SURVIVED"}.get(rc, f"rc={rc}")
    fails = [l for l in out if l.startswith(("FAILED", "ERROR"))][:3]
    row = (f"| {mid} | {path}:{line} | `{old.strip()}` → `{new.strip()}` | {' '.join(tests)} | "
           f"{status} | {out[-1] if out else ''} | {'; '.join(fails)[:300]} | "
           f"{time.time() - start:.0f}s |\n")
    with open(log, "a") as f:
        f.write(row)
    print(row)


if __name__ == "__main__":
    main(sys.argv[1:])
