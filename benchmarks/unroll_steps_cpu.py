"""``training.unroll_steps`` on CPU: compile time against run time of a round.

A client's local steps, up to ``training.unroll_steps`` of them, are unrolled
into straight-line code; more run in a ``lax.scan``. Unrolled steps run faster
on XLA:CPU (``control_flow_cpu.md``: 2.6× for two LeNet-5 steps) but the round
step takes longer to compile, once per process (and once per machine with the
persistent compilation cache). This benchmark measures both sides for one
workload, each setting in fresh processes with no persistent cache:

* ``first_s``: the first round (its compile and its run);
* ``round_s``: the median of the next ``--rounds`` rounds (run only);
* ``compile_s``: XLA's compile seconds in the first round.

From the medians over passes it gives the break-even number of rounds, after
which the unrolled setting's faster rounds have paid for its longer compile,
and a digest of the final parameters: XLA may round the two settings
differently (LeNet-5's digests differ), which is why the key is in the
checkpoint fingerprint.

Usage::

    python -m benchmarks.unroll_steps_cpu                        # LeNet-5, 30 local steps
    python -m benchmarks.unroll_steps_cpu --model mlp --steps 8 --passes 5
    python -m benchmarks.unroll_steps_cpu --model mlp --image-size 16 --batch 8 \
        --clients 1 --defense '{"name": "dp_vmf", "kappa": 1000}' --name unroll_steps_vmf_cpu

Writes ``benchmarks/results/NAME.{json,md}`` (``--name``, default
``unroll_steps_cpu``). ``--defense`` adds one defense (a config spec); one
whose steps the engine keeps in a scan (``Defense.scan_local_steps``, e.g.
``dp_vmf``) runs here with that hint turned off, so that ``unroll_steps``
decides as it would without it: that is what the benchmark weighs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's fedsim, not an installed one
from benchmarks.provenance import git_state, short_commit  # noqa: E402
from benchmarks.results_io import write_json_and_markdown  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"

# Runs in the fresh process: argv = JSON of the workload and the setting.
CHILD = r"""
import hashlib, json, statistics, sys, time
import jax, numpy as np
from fedsim.config import load_config
from fedsim.data import synthetic_dataset
from fedsim.simulation import Simulation
w = json.loads(sys.argv[1])
compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: compiles.append(secs)
    if event == "/jax/core/compile/backend_compile_duration" else None)
n = w["clients"] * w["steps"] * w["batch"]
ds = synthetic_dataset(seed=0, image_size=w["image_size"], num_train=n, num_test=100)
cfg = load_config(None, [
    "data.dataset=synthetic", f"data.image_size={w['image_size']}",
    f"data.num_clients={w['clients']}", "data.partition=iid",
    f"data.examples_per_client={w['steps'] * w['batch']}", f"model.name={w['model']}",
    f"training.batch_size={w['batch']}", "training.local_epochs=1",
    f"training.clients_per_round={w['clients']}", "training.client_parallelism=loop",
    f"training.unroll_steps={w['unroll']}", f"training.rounds={w['rounds'] + 1}",
    "output.progress=false", "output.plots=false"])
defenses = None
if w.get("defense") is not None:
    from fedsim.simulation import _load_defenses, build_defenses
    _load_defenses()
    defenses = {stage: d._replace(scan_local_steps=False)
                for stage, d in build_defenses([w["defense"]]).items()}
sim = Simulation(cfg, dataset=ds, defenses=defenses)
state = jax.block_until_ready(sim.init_state())
steps = sim.settings.num_steps
before = len(compiles)
t0 = time.perf_counter()
state, _ = sim.run_round(state, 0)
state = jax.block_until_ready(state)
first = time.perf_counter() - t0
first_compiles = compiles[before:]
rounds = []
for r in range(1, w["rounds"] + 1):
    t0 = time.perf_counter()
    state, _ = sim.run_round(state, r)
    state = jax.block_until_ready(state)
    rounds.append(time.perf_counter() - t0)
digest = hashlib.sha256()
for leaf in jax.tree_util.tree_leaves(state.params):
    digest.update(np.asarray(leaf).tobytes())
print("RESULT" + json.dumps({"local_steps": steps, "first_s": first,
                             "compile_s": sum(first_compiles), "compiles": len(first_compiles),
                             "round_s": statistics.median(rounds), "rounds_s": rounds,
                             "digest": digest.hexdigest(),
                             "scan_hint": any(d.scan_local_steps for d in sim.defenses.values())}))
"""


def run_child(workload: dict, unroll: int) -> dict:
    """One setting in a fresh process without a persistent compilation cache."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_ENABLE_COMPILATION_CACHE": "false",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    load = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps({**workload, "unroll": unroll})],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"unroll_steps={unroll}: the child failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT")][-1]
    return {"unroll_steps": unroll, "load_before": load, **json.loads(line[len("RESULT"):])}


def measure(workload: dict, settings: list[int], passes: int) -> list[dict]:
    """Every setting ``passes`` times, the order reversed from pass to pass."""
    rows = []
    for p in range(passes):
        for unroll in (settings if p % 2 == 0 else settings[::-1]):
            r = run_child(workload, unroll)
            rows.append({"pass": p, **r})
            print(f"[pass {p}] unroll_steps={unroll}: first round {r['first_s']:.2f}s "
                  f"(compile {r['compile_s']:.2f}s), then {r['round_s']:.3f}s a round",
                  flush=True)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per setting: medians over passes, whether it unrolled, and its digests."""
    out = []
    for unroll in dict.fromkeys(r["unroll_steps"] for r in rows):
        rs = [r for r in rows if r["unroll_steps"] == unroll]
        steps = rs[0]["local_steps"]
        out.append({"unroll_steps": unroll, "local_steps": steps, "unrolled": steps <= unroll,
                    "n": len(rs),
                    **{k: statistics.median(r[k] for r in rs)
                       for k in ("first_s", "compile_s", "round_s")},
                    "digests": sorted({r["digest"] for r in rs})})
    return out


def break_even(summary: list[dict]) -> dict | None:
    """Rounds after which the unrolled setting's run has cost no more than the scan's
    (None unless the summary has one of each; ``rounds`` None where unrolling does not
    run faster, so it never pays)."""
    unrolled = [s for s in summary if s["unrolled"]]
    scanned = [s for s in summary if not s["unrolled"]]
    if not unrolled or not scanned:
        return None
    u, s = unrolled[0], scanned[0]
    saved = s["round_s"] - u["round_s"]
    extra = u["first_s"] - s["first_s"]
    rounds = extra / saved if saved > 0 else None
    return {"unrolled": u["unroll_steps"], "scan": s["unroll_steps"],
            "first_round_ratio": u["first_s"] / s["first_s"],
            "round_ratio": s["round_s"] / u["round_s"], "rounds": rounds}


def total_seconds(cell: dict, rounds: int) -> float:
    """A run of ``rounds`` rounds at a setting's medians: the first, then the rest."""
    return cell["first_s"] + (rounds - 1) * cell["round_s"]


def _defense_words(defense: dict | None) -> str:
    if defense is None:
        return ""
    return (f", defense `{json.dumps(defense)}` (its scan hint turned off, so that "
            "`unroll_steps` decides)")


def markdown(result: dict) -> str:
    w = result["workload"]
    lines = [
        "# `training.unroll_steps` on CPU: compile time against run time "
        "(`benchmarks/unroll_steps_cpu.py`)", "",
        f"{w['model']} at {w['image_size']}×{w['image_size']}, {w['clients']} "
        f"client{'s' if w['clients'] != 1 else ''} a round "
        f"(loop), each {w['steps']} local steps of batch {w['batch']}"
        f"{_defense_words(w.get('defense'))}; fresh processes without "
        f"a persistent compilation cache; medians over {result['passes']} passes (the order "
        f"reversed from pass to pass). First round: its compile and its run; a round: the "
        f"median of the {w['rounds']} rounds after it. {result['device']}. Code: "
        f"{short_commit(result['commit'])}"
        f"{' (with uncommitted changes)' if result['dirty'] else ''}.", "",
        "| unroll_steps | local steps | unrolled | first round (s) | XLA compile in it (s) "
        "| a round (s) | 10 rounds (s) | 100 rounds (s) |",
        "|---|---|---|---|---|---|---|---|"]
    for s in result["summary"]:
        lines.append(f"| {s['unroll_steps']} | {s['local_steps']} | "
                     f"{'yes' if s['unrolled'] else 'no (scan)'} | {s['first_s']:.2f} | "
                     f"{s['compile_s']:.2f} | {s['round_s']:.3f} | "
                     f"{total_seconds(s, 10):.1f} | {total_seconds(s, 100):.1f} |")
    b = result["break_even"]
    if b is not None:
        pays = (f"Unrolling pays for itself after {b['rounds']:.0f} rounds in one process (a "
                "persistent compilation cache, which `fedsim run` keeps, pays the compile "
                "once per machine)." if b["rounds"] is not None else
                "Unrolling does not run faster here, so it never pays.")
        later = (f"1/{b['round_ratio']:.1f}" if b["round_ratio"] >= 1
                 else f"{1 / b['round_ratio']:.1f}×")
        lines += ["", f"Unrolled / scan: the first round takes {b['first_round_ratio']:.1f}× "
                      f"as long, a later round {later} as long. {pays}"]
    digests = {s["unroll_steps"]: s["digests"] for s in result["summary"]}
    one_each = all(len(d) == 1 for d in digests.values())
    distinct = len({d[0] for d in digests.values()}) == len(digests)
    same = one_each and len({d[0] for d in digests.values()}) == 1
    lines += ["", "Final parameters: " + (
        "one digest per setting over the passes, and the settings' digests differ (the two "
        "round differently)." if one_each and distinct else
        "one digest over every pass and setting (the settings gave the same parameters bit "
        "for bit)." if same else
        f"digests {json.dumps(digests)}."), "", f"Whole benchmark: {result['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--image-size", type=int, default=28)
    ap.add_argument("--steps", type=int, default=30, help="local steps per client")
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--clients", type=int, default=4, help="clients per round (all of them)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds after the first")
    ap.add_argument("--unroll", default="32,0", help="training.unroll_steps values, comma-separated")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--defense", default=None,
                    help="one defense as a JSON config spec, e.g. '{\"name\": \"dp_vmf\", "
                         "\"kappa\": 1000}' (its scan hint turned off)")
    ap.add_argument("--name", default="unroll_steps_cpu", help="output file stem")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    from fedsim.models import MODEL_REGISTRY
    from fedsim.suggest import did_you_mean

    if args.model not in MODEL_REGISTRY:
        ap.error(f"--model {args.model!r}: unknown; known: {', '.join(sorted(MODEL_REGISTRY))}"
                 f"{did_you_mean(args.model, MODEL_REGISTRY)}")
    for name in ("image_size", "steps", "batch", "clients", "rounds", "passes"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    try:
        settings = [int(v) for v in args.unroll.split(",")]
    except ValueError:
        settings = []
    if not settings or min(settings) < 0 or len(set(settings)) < len(settings):
        ap.error(f"--unroll {args.unroll!r}: expected distinct integers >= 0, e.g. 32,0")
    defense = None
    if args.defense is not None:
        try:
            defense = json.loads(args.defense)
        except json.JSONDecodeError as e:
            ap.error(f"--defense {args.defense!r}: not JSON ({e})")
        if not isinstance(defense, dict) or "name" not in defense:
            ap.error(f"--defense {args.defense!r}: expected a JSON object with a 'name'")
        from fedsim.config import ConfigError
        from fedsim.simulation import _load_defenses, build_defenses
        _load_defenses()
        try:
            build_defenses([defense])
        except (ConfigError, TypeError, ValueError) as e:
            ap.error(f"--defense {args.defense!r}: {e}")
    if not args.name or "/" in args.name:
        ap.error(f"--name {args.name!r}: expected a file stem")
    workload = {"model": args.model, "image_size": args.image_size, "steps": args.steps,
                "batch": args.batch, "clients": args.clients, "rounds": args.rounds,
                "defense": defense}
    state = git_state(ROOT)
    t0 = time.perf_counter()
    rows = measure(workload, settings, args.passes)
    summary = summarize(rows)
    result = {"workload": workload, "settings": settings, "passes": args.passes,
              "commit": state["commit"], "dirty": state["dirty"],
              "device": f"cpu ({platform.processor() or platform.machine()}, "
                        f"{os.cpu_count()} cores)",
              "command": "python -m benchmarks.unroll_steps_cpu " + " ".join(
                  argv if argv is not None else sys.argv[1:]),
              "seconds": time.perf_counter() - t0, "rows": rows, "summary": summary,
              "break_even": break_even(summary)}
    write_json_and_markdown(args.out, args.name, result, markdown(result))


if __name__ == "__main__":
    main()
