"""Where a short CPU run's time goes: compiling vs training, and what caches save.

The README's quickstart (``configs/quickstart.yaml``: LeNet-5 on Fashion-MNIST,
10 clients a round, 19 local steps each, unrolled) trains a round in about half
a second on XLA:CPU but compiles its first round for tens of seconds, and
``client_parallelism: auto`` first compiles and times every candidate strategy.
This benchmark runs ``fedsim run`` on that config in fresh processes and
records, per setting:

* ``round0_s``: round 0's seconds (compile + one round), from metrics.jsonl;
* ``steady_s``: the median of the later rounds' seconds;
* ``wall_s``: the whole process (imports, data, calibration, all rounds);
* ``projected_s``: the whole process for the config's own R rounds,
  ``wall_s − Σ rounds' seconds + round0_s + (R − 1) · steady_s`` (imports, data,
  calibration and compiling counted once, as in a real run).

Settings:

* ``loop`` with ``training.loop_clients_per_call`` k (clients Python-unrolled
  into one jitted call), each run three times in a row with one fresh cache
  directory: ``off`` (``FEDSIM_COMPILE_CACHE=0``), ``cold`` (JAX's persistent
  compilation cache on, empty: compiles and writes), ``warm`` (the same
  directory again: loads);
* ``auto`` (the config's own setting): ``cold`` (no calibration cache, no
  compilation cache: a first run on a new machine) and ``warm`` (both caches
  from the cold run: the same command again).

``--baseline LABEL=PATH`` runs another checkout's ``fedsim`` the same way in the
same passes (e.g. a ``git worktree`` of the commit before a change), so before
and after are measured side by side.

Every run's final train loss and accuracy are recorded: a cached executable
must give the numbers of the compiled one (``same_numbers``). Run on an idle
machine; the load average before each run is recorded.

Usage::

    python -m benchmarks.compile_time_cpu                 # k = 1, 2, 4; 6 rounds
    python -m benchmarks.compile_time_cpu --ks 1,4 --rounds 4 --passes 2
    git worktree add /tmp/before 151b44f
    python -m benchmarks.compile_time_cpu --baseline before=/tmp/before --baseline-ks 4

Writes ``benchmarks/results/compile_time_cpu.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's fedsim, not an installed one
from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from benchmarks.results_file import read_or_exit  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CONFIG = ROOT / "configs" / "quickstart.yaml"


def run_once(tree: Path, config: Path, overrides: list[str], cache_dir: Path,
             compile_cache: bool, out_dir: Path) -> dict:
    """One ``fedsim run`` of checkout ``tree``'s code in a fresh process; its timings
    and final numbers."""
    env = {**os.environ, "FEDSIM_CACHE_DIR": str(cache_dir),
           "FEDSIM_COMPILE_CACHE": "1" if compile_cache else "0",
           "PYTHONPATH": str(tree) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the benchmark owns the cache
    cmd = [sys.executable, "-m", "fedsim", "run", str(config), "--quiet",
           "--set", f"output.dir={out_dir}"]
    for o in overrides:
        cmd += ["--set", o]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out_dir / "summary.json").read_text())
    log = (out_dir / "run.log").read_text().splitlines()
    secs = [r["seconds"] for r in rows]
    last_acc = [r["test_accuracy"] for r in rows if "test_accuracy" in r]
    return {"load_before": load, "wall_s": wall, "round0_s": secs[0],
            "steady_s": statistics.median(secs[1:]) if len(secs) > 1 else None,
            "round_seconds": secs, "final_train_loss": rows[-1]["train_loss"],
            "final_accuracy": last_acc[-1] if last_acc else None,
            "strategy_line": next((line for line in log if "client_parallelism" in line or
                                   "strategy" in line), None),
            "peak_rss_mb": summary.get("peak_rss_mb")}


def projected(r: dict, rounds: int) -> float:
    """The process's wall time had it run ``rounds`` rounds (see the module doc)."""
    outside_rounds = r["wall_s"] - sum(r["round_seconds"])
    return outside_rounds + r["round0_s"] + (rounds - 1) * (r["steady_s"] or 0.0)


def measure_tree(label: str, tree: Path, config: Path, ks: list[int], rounds: int,
                 p: int, sets: list[str] = ()) -> list[dict]:
    """One pass of every setting with checkout ``tree``'s code (``sets``: config
    overrides for every run)."""
    rows = []
    for k in ks:
        with tempfile.TemporaryDirectory(prefix="fedsim-compile-") as tmp:
            tmp = Path(tmp)
            over = ["training.client_parallelism=loop", f"training.rounds={rounds}",
                    f"training.loop_clients_per_call={k}", *sets]
            for mode in ("off", "cold", "warm"):
                r = run_once(tree, config, over, tmp / "cache", mode != "off",
                             tmp / f"run_{mode}")
                rows.append({"tree": label, "pass": p, "strategy": "loop", "k": k,
                             "cache": mode, **r})
                print(f"[pass {p}] {label} loop k={k} {mode}: round 0 {r['round0_s']:.1f}s, "
                      f"steady {r['steady_s']:.3f}s, wall {r['wall_s']:.1f}s", flush=True)
    with tempfile.TemporaryDirectory(prefix="fedsim-compile-") as tmp:
        tmp = Path(tmp)
        for mode in ("cold", "warm"):
            r = run_once(tree, config, [f"training.rounds={rounds}", *sets], tmp / "cache", True,
                         tmp / f"run_{mode}")
            rows.append({"tree": label, "pass": p, "strategy": "auto", "k": None,
                         "cache": mode, **r})
            print(f"[pass {p}] {label} auto {mode}: round 0 {r['round0_s']:.1f}s, wall "
                  f"{r['wall_s']:.1f}s ({r['strategy_line']})", flush=True)
    return rows


def summarize(rows: list[dict], rounds_full: int) -> list[dict]:
    """Medians over passes per (tree, strategy, k, cache)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["tree"], r["strategy"], r["k"], r["cache"]), []).append(r)
    out = []
    for (tree, strategy, k, cache), rs in groups.items():
        med = lambda f: statistics.median(f(r) for r in rs)
        out.append({"tree": tree, "strategy": strategy, "k": k, "cache": cache, "n": len(rs),
                    "round0_s": med(lambda r: r["round0_s"]),
                    "steady_s": med(lambda r: r["steady_s"]),
                    "wall_s": med(lambda r: r["wall_s"]),
                    "projected_s": med(lambda r: projected(r, rounds_full))})
    return out


def same_numbers(rows: list[dict]) -> dict:
    """Per (tree, strategy, k, pass): do off/cold/warm end at the same loss and accuracy?"""
    groups: dict[tuple, set] = {}
    for r in rows:
        groups.setdefault((r["tree"], r["strategy"], r["k"], r["pass"]), set()).add(
            (r["final_train_loss"], r["final_accuracy"]))
    return {f"{t} {s} k={k} pass {p}": len(v) == 1 for (t, s, k, p), v in groups.items()}


def same_across_trees(rows: list[dict]) -> dict:
    """Per (strategy, k, cache, pass) run by more than one tree: the same loss and accuracy?"""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r["strategy"], r["k"], r["cache"], r["pass"]), []).append(
            (r["final_train_loss"], r["final_accuracy"]))
    return {f"{s} k={k} {c} pass {p}": len(set(v)) == 1
            for (s, k, c, p), v in groups.items() if len(v) > 1}


def markdown(result: dict) -> str:
    lines = [
        "# Compile time vs training time on CPU (`benchmarks/compile_time_cpu.py`)", "",
        f"Config `{result['config']}` run for {result['rounds']} rounds per process "
        f"({result['passes']} pass(es), medians)"
        + "".join(f", `--set {o}`" for o in result.get("sets", [])) + "; `projected` = the process's wall time "
        f"with the rounds' part replaced by round 0 + {result['rounds_full'] - 1} × steady "
        f"(the config's {result['rounds_full']} rounds). "
        f"{result['device']}. Code: " + ", ".join(
            f"`{label}` = {short_commit(c)}" for label, c in result["trees"].items()) + ".", "",
        "| code | strategy | k | compile cache | round 0 (s) | steady round (s) "
        "| process wall (s) | projected full run (s) |", "|---|---|---|---|---|---|---|---|"]
    for s in result["summary"]:
        lines.append(f"| {s['tree']} | {s['strategy']} | {s['k'] if s['k'] is not None else ''} | {s['cache']} "
                     f"| {s['round0_s']:.1f} | {s['steady_s']:.3f} | {s['wall_s']:.1f} "
                     f"| {s['projected_s']:.1f} |")
    ok = all(result["same_numbers"].values())
    lines += ["", f"Same final loss and accuracy with the cache off, cold and warm: "
              f"{'yes, every group' if ok else 'NO: ' + str(result['same_numbers'])}."]
    across = same_across_trees(result["rows"])
    if across:
        lines += ["", "Same final loss and accuracy in every code tree, setting by setting: "
                  + ("yes" if all(across.values()) else "NO: " + str(across)) + "."]
    autos = [r for r in result["rows"] if r["strategy"] == "auto" and r["cache"] == "cold"]
    for r in autos:
        line = str(r["strategy_line"])
        line = line[line.find("client_parallelism"):]
        lines += ["", f"`{r['tree']}` pass {r['pass']}, `auto` cold (run.log): {line}"]
    return "\n".join(lines) + "\n"


def _ks(ap, option: str, text: str) -> list[int]:
    """A comma list of loop k values, or an argparse error naming the option."""
    try:
        ks = [int(k) for k in text.split(",")]
    except ValueError:
        ap.error(f"{option} must be comma-separated integers, got {text!r}")
    if any(k < 1 for k in ks):
        ap.error(f"{option} values must be >= 1, got {ks}")
    return ks


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("--ks", default="1,2,4", help="loop_clients_per_call values")
    ap.add_argument("--rounds", type=int, default=6, help="rounds per process (>= 2)")
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--baseline", action="append", default=[], metavar="LABEL=PATH",
                    help="also run the fedsim of another checkout (e.g. a `git worktree` of "
                         "an older commit), interleaved with this one; repeatable")
    ap.add_argument("--baseline-ks", default=None,
                    help="loop k values for the baselines (default: --ks)")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                    help="config override for every run (fedsim run --set); repeatable")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--render", action="store_true",
                    help="only re-derive the summary and markdown from --out's JSON")
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error(f"--rounds must be >= 2 (a steady round after round 0), got {args.rounds}")
    if args.passes < 1:
        ap.error(f"--passes must be >= 1, got {args.passes}")
    ks = _ks(ap, "--ks", args.ks)
    base_ks = _ks(ap, "--baseline-ks", args.baseline_ks) if args.baseline_ks else ks
    if args.render:
        path = Path(args.out) / "compile_time_cpu.json"
        result = read_or_exit(ap, path, "--render (reads --out's compile_time_cpu.json)")
        result["summary"] = summarize(result["rows"], result["rounds_full"])
        path.write_text(json.dumps(result, indent=1))
        (Path(args.out) / "compile_time_cpu.md").write_text(markdown(result))
        print(markdown(result))
        return
    config = Path(args.config)
    if not config.is_file():
        ap.error(f"--config {config}: no such file")
    from fedsim.config import ConfigError, load_config
    try:
        rounds_full = load_config(str(config)).training.rounds
    except ConfigError as e:
        ap.error(f"--config {config}: {e}")
    trees = {"this": ROOT}
    for b in args.baseline:
        label, sep, path = b.partition("=")
        if not sep or not label or label in trees or not (Path(path) / "fedsim").is_dir():
            ap.error(f"--baseline must be LABEL=PATH to another fedsim checkout with a unique "
                     f"label, got {b!r}")
        trees[label] = Path(path).resolve()
    commits = {label: git_commit(tree) for label, tree in trees.items()}
    t0 = time.perf_counter()
    rows = []
    for p in range(args.passes):
        for label, tree in trees.items():
            rows += measure_tree(label, tree, config, ks if label == "this" else base_ks,
                                 args.rounds, p, args.sets)
    result = {"config": str(config.relative_to(ROOT) if config.is_relative_to(ROOT) else config),
              "config_text": config.read_text(),
              "rounds": args.rounds, "rounds_full": rounds_full, "passes": args.passes,
              "sets": args.sets,
              "ks": ks, "commit": commits["this"], "trees": commits,
              "tree_paths": {label: str(t) for label, t in trees.items()},
              "device": f"cpu ({platform.processor() or platform.machine()}, "
                        f"{os.cpu_count()} cores)",
              "seconds": time.perf_counter() - t0, "rows": rows,
              "summary": summarize(rows, rounds_full), "same_numbers": same_numbers(rows)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compile_time_cpu.json").write_text(json.dumps(result, indent=1))
    (out / "compile_time_cpu.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
