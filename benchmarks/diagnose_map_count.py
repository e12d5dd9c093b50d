"""How XLA:CPU programs fill a process's memory mappings, and what happens at the limit.

A CI rehearsal's xdist worker crashed at about 90 % of the suite with a
segmentation fault inside XLA (``tests/worker_health.py``). This script
measures the suspected cause in fresh processes:

1. *per program*: compile ``--programs`` distinct small jitted programs, count
   the process's memory mappings (``/proc/self/maps``) as it goes, then drop
   JAX's caches (``jax.clear_caches()``) and count again;
2. *at the limit* (only with ``--lower-max-map-count N``, as root): lower the
   kernel's ``vm.max_map_count`` to N, compile programs until the process
   ends, and record how it ended and how many mappings it had last reported;
   the limit is put back afterwards, whatever happens. It changes a setting of
   the whole machine for the seconds it runs: do it on a machine of your own.

Run::

    python -m benchmarks.diagnose_map_count --out benchmarks/results/diagnose_map_count \\
        --lower-max-map-count 3000

It writes ``diagnose_map_count.json`` and ``diagnose_map_count.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import textwrap

from benchmarks.provenance import ROOT, git_commit, short_commit
from benchmarks.results_io import write_json_and_markdown

MAX_MAP_COUNT = "/proc/sys/vm/max_map_count"

#: The child process: compiles programs and prints one JSON line per checkpoint.
_CHILD = textwrap.dedent("""
    import gc, json, sys
    import jax, jax.numpy as jnp

    def maps():
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)

    programs, every, clear = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    print(json.dumps({"programs": 0, "mappings": maps()}), flush=True)
    kept = []
    for i in range(programs):
        f = jax.jit(lambda x, i=i: jnp.sin(x @ x.T).sum() * i + jnp.cumsum(x, axis=0))
        f(jnp.ones((8 + i % 5, 8))).block_until_ready()
        kept.append(f)
        if (i + 1) % every == 0:
            print(json.dumps({"programs": i + 1, "mappings": maps()}), flush=True)
    if clear:
        kept = None
        jax.clear_caches()
        gc.collect()
        print(json.dumps({"programs": programs, "mappings": maps(), "cleared": True}), flush=True)
""")


def run_child(programs: int, every: int, clear: bool) -> dict:
    """One fresh process compiling ``programs`` programs: its checkpoints and exit code."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(programs), str(every),
                           "1" if clear else "0"], cwd=ROOT, capture_output=True, text=True,
                          env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    points = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {"exit_code": proc.returncode, "points": points,
            "stderr_tail": proc.stderr[-1500:] if proc.returncode else ""}


def read_limit() -> int:
    with open(MAX_MAP_COUNT) as f:
        return int(f.read())


def write_limit(value: int) -> None:
    with open(MAX_MAP_COUNT, "w") as f:
        f.write(str(value))


def at_the_limit(limit: int, programs: int) -> dict:
    """Compile under a lowered ``vm.max_map_count``; the old value is restored."""
    original = read_limit()
    write_limit(limit)
    try:
        child = run_child(programs, every=10, clear=False)
    finally:
        write_limit(original)
    child.update({"limit": limit, "restored_to": read_limit()})
    return child


def markdown(result: dict) -> str:
    per = result["per_program"]
    first, last = per["points"][0], [p for p in per["points"] if not p.get("cleared")][-1]
    cleared = [p for p in per["points"] if p.get("cleared")]
    lines = [f"# Memory mappings of compiled XLA:CPU programs ({result['date']}, commit "
             f"{short_commit(result['commit'])})", "",
             "Written by `benchmarks/diagnose_map_count.py`. A fresh process compiles distinct "
             "small jitted programs (`sin(x @ x.T).sum() * i + cumsum(x)`, 8-12 × 8 float32) "
             f"and counts its memory mappings (`/proc/self/maps`); the kernel's "
             f"`vm.max_map_count` here: {result['max_map_count']}.", "",
             "| programs compiled | mappings |", "|---|---|"]
    lines += [f"| {p['programs']} | {p['mappings']} |" for p in per["points"]
              if not p.get("cleared")]
    if cleared:
        lines.append(f"| {cleared[0]['programs']}, after `jax.clear_caches()` | "
                     f"{cleared[0]['mappings']} |")
    per_program = (last["mappings"] - first["mappings"]) / max(last["programs"], 1)
    lines += ["", f"{per_program:.1f} mappings per program held; at that rate a process "
              f"reaches the limit after about "
              f"{(result['max_map_count'] - first['mappings']) / per_program:,.0f} programs "
              "held at once."]
    limit = result.get("at_the_limit")
    if limit:
        reached = limit["points"][-1] if limit["points"] else {"programs": 0, "mappings": 0}
        lines += ["", f"## With `vm.max_map_count` lowered to {limit['limit']}", "",
                  f"The process ended with exit code {limit['exit_code']} (−11: SIGSEGV) "
                  f"after {reached['programs']} programs had reported {reached['mappings']} "
                  f"mappings; the limit was restored to {limit['restored_to']}. The end of its "
                  "stderr:", "", "```", limit["stderr_tail"].strip()[-800:], "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/diagnose_map_count")
    parser.add_argument("--programs", type=int, default=300)
    parser.add_argument("--lower-max-map-count", type=int, default=None, metavar="N",
                        help="also compile under vm.max_map_count = N (root; restored after)")
    args = parser.parse_args(argv)
    if args.programs < 100:
        parser.error(f"--programs: at least 100, got {args.programs}")
    if args.lower_max_map_count is not None and args.lower_max_map_count < 1000:
        parser.error(f"--lower-max-map-count: at least 1000 (a Python process starts with "
                     f"hundreds), got {args.lower_max_map_count}")
    per_program = run_child(args.programs, every=100, clear=True)
    if per_program["exit_code"] != 0:
        raise SystemExit(f"the counting process failed:\n{per_program['stderr_tail']}")
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "commit": git_commit(), "max_map_count": read_limit(), "per_program": per_program}
    if args.lower_max_map_count is not None:
        try:
            result["at_the_limit"] = at_the_limit(args.lower_max_map_count, 10 * args.programs)
        except PermissionError:
            raise SystemExit(f"--lower-max-map-count: cannot write {MAX_MAP_COUNT} "
                             "(run as root, on a machine of your own)") from None
    write_json_and_markdown(args.out, "diagnose_map_count", result, markdown(result))


if __name__ == "__main__":
    main()
