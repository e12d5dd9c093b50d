"""Model initialisation on CPU: op by op (``model.init``) vs one jitted program.

``fedsim.models.init_params`` used to call flax's ``model.init`` eagerly: every
initializer (one truncated normal per shape, ...) and every layer of the forward
pass on zeros compiled its own small program. It now jits the whole
initialisation, one program per (model, input shape), on CPU at XLA's backend
optimisation level 2 (``INIT_CPU_COMPILER_OPTIONS``): at the default level 3 the
program's compile took most of its time. This benchmark measures the three ways
(``eager``; ``jit``, what ``init_params`` runs now; ``jit_default``, the same
program at XLA's default options, what it ran before) in fresh processes (a
first initialisation, as at the start of a run), per model, with JAX's
persistent compilation cache:

* ``off``: no persistent cache (a process that compiles everything);
* ``cold``: the cache on, empty (compiles and writes what takes over JAX's
  threshold, 1 s by default);
* ``warm``: the same cache directory again (what ``fedsim run`` did on its
  second start before ce2303e; the CLI's cache now keeps compiles of any
  length, ``fedsim.compile_cache.MIN_COMPILE_SECS``, while this benchmark
  keeps JAX's threshold).

Per process it records the seconds of the initialisation alone (imports and
model construction excluded), the number of XLA compiles it made, and a digest
of the parameters' bytes: every way must give the same bits
(``same_bits``), as ``tests/fedsim/test_models.py`` also checks.

Usage::

    python -m benchmarks.init_time_cpu                       # default models, 3 passes
    python -m benchmarks.init_time_cpu --models lenet5:28x28x1 --passes 5

Writes ``benchmarks/results/init_time_cpu.{json,md}``.
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
from benchmarks.provenance import git_state, short_commit  # noqa: E402
from benchmarks.results_io import write_json_and_markdown  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_MODELS = ("mlp:16x16x1,lenet:32x32x3,lenet5:28x28x1,conv2:28x28x1,convnet:32x32x3,"
                  "alexnet:32x32x3,vgg11:32x32x3,resnet10:32x32x3")
WAYS = ("eager", "jit", "jit_default")
CACHES = ("off", "cold", "warm")

# Runs in the fresh process: argv = model name, shape "HxWxC", way.
CHILD = r"""
import hashlib, json, sys, time
import jax, jax.numpy as jnp, numpy as np
from fedsim.models import _init_eager, build_model, init_params
name, shape, way = sys.argv[1], tuple(int(d) for d in sys.argv[2].split("x")), sys.argv[3]
compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: compiles.append(secs)
    if event == "/jax/core/compile/backend_compile_duration" else None)
model = build_model(name)
key = jax.random.key(0)
before = len(compiles)  # the key's own programs are not the initialisation's
t0 = time.perf_counter()
if way == "eager":
    params = model.init(key, jnp.zeros((1, *shape), jnp.float32))["params"]
elif way == "jit":
    params = init_params(model, shape, key)
else:  # jit_default: the same program at XLA's default compiler options
    params = jax.jit(_init_eager, static_argnums=(0, 1))(model, shape, key)
params = jax.block_until_ready(params)
seconds = time.perf_counter() - t0
digest = hashlib.sha256()
for leaf in jax.tree_util.tree_leaves(params):
    digest.update(np.asarray(leaf).tobytes())
print("RESULT" + json.dumps({"seconds": seconds, "compiles": len(compiles) - before,
                             "compile_seconds": sum(compiles[before:]),
                             "digest": digest.hexdigest()}))
"""


def run_child(name: str, shape: str, way: str, cache_dir: Path | None) -> dict:
    """One initialisation in a fresh process; its seconds, compiles and digest."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the benchmark owns the cache
    if cache_dir is None:
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    else:
        env["JAX_ENABLE_COMPILATION_CACHE"] = "true"
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
    load = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, "-c", CHILD, name, shape, way], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} {shape} {way}: the child failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT")][-1]
    return {"load_before": load, **json.loads(line[len("RESULT"):])}


def measure(models: list[tuple[str, str]], passes: int) -> list[dict]:
    """Every model × way × cache setting, ``passes`` times; the ways take turns
    going first from pass to pass."""
    rows = []
    for p in range(passes):
        ways = WAYS[p % len(WAYS):] + WAYS[:p % len(WAYS)]
        for name, shape in models:
            for way in ways:
                with tempfile.TemporaryDirectory(prefix="fedsim-init-") as tmp:
                    for cache in CACHES:
                        r = run_child(name, shape, way, None if cache == "off" else Path(tmp))
                        rows.append({"pass": p, "model": name, "shape": shape, "way": way,
                                     "cache": cache, **r})
                        print(f"[pass {p}] {name} {shape} {way} cache {cache}: "
                              f"{r['seconds']:.2f}s, {r['compiles']} compiles", flush=True)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per model and cache setting: medians over passes of every way present, and
    the ratios of ``jit`` to the others."""
    out = []
    keys = list(dict.fromkeys((r["model"], r["shape"], r["cache"]) for r in rows))
    for name, shape, cache in keys:
        cell = {"model": name, "shape": shape, "cache": cache}
        for way in WAYS:
            rs = [r for r in rows if (r["model"], r["shape"], r["cache"], r["way"]) ==
                  (name, shape, cache, way)]
            if not rs:  # a file from before jit_default was measured
                continue
            cell[f"{way}_s"] = statistics.median(r["seconds"] for r in rs)
            cell[f"{way}_compiles"] = statistics.median(r["compiles"] for r in rs)
            cell[f"{way}_compile_s"] = statistics.median(r["compile_seconds"] for r in rs)
            cell["n"] = len(rs)
        cell["jit_over_eager"] = cell["jit_s"] / cell["eager_s"]
        if "jit_default_s" in cell:
            cell["jit_over_jit_default"] = cell["jit_s"] / cell["jit_default_s"]
        out.append(cell)
    return out


def same_bits(rows: list[dict]) -> dict:
    """Per model: do every way and cache setting give parameters with one digest?"""
    digests: dict[str, set] = {}
    for r in rows:
        digests.setdefault(f"{r['model']} {r['shape']}", set()).add(r["digest"])
    return {k: len(v) == 1 for k, v in digests.items()}


def markdown(result: dict) -> str:
    lines = [
        "# Model initialisation on CPU: op by op vs one jitted program "
        "(`benchmarks/init_time_cpu.py`)", "",
        f"A first `init_params` in a fresh process, medians over {result['passes']} passes "
        f"(the ways take turns going first). `eager`: flax's `model.init` op by op; `jit`: "
        f"`init_params` now, one program per (model, input shape), compiled on CPU at XLA's "
        f"backend optimisation level 2; `jit default`: the same program at XLA's default "
        f"options (level 3), what `init_params` ran before. Compile cache: `off` none, "
        f"`cold` JAX's persistent cache on and empty, `warm` the same directory again. "
        f"XLA compile: the seconds of XLA's backend compiles in the initialisation. "
        f"{result['device']}. Code: {short_commit(result['commit'])}"
        f"{' (with uncommitted changes)' if result['dirty'] else ''}.", ""]
    default = all("jit_default_s" in s for s in result["summary"])
    if default:
        lines += ["| model | input | compile cache | eager (s) | jit (s) | jit default (s) "
                  "| jit / eager | jit / jit default | XLA compile jit (s) | jit default (s) "
                  "| XLA compiles eager | jit |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    else:  # a file measured before the jit_default way existed
        lines += ["| model | input | compile cache | eager (s) | jit (s) | jit / eager "
                  "| XLA compiles eager | jit |", "|---|---|---|---|---|---|---|---|"]
    for s in result["summary"]:
        if default:
            lines.append(f"| {s['model']} | {s['shape']} | {s['cache']} | {s['eager_s']:.2f} "
                         f"| {s['jit_s']:.2f} | {s['jit_default_s']:.2f} "
                         f"| {s['jit_over_eager']:.2f} | {s['jit_over_jit_default']:.2f} "
                         f"| {s['jit_compile_s']:.2f} | {s['jit_default_compile_s']:.2f} "
                         f"| {s['eager_compiles']:g} | {s['jit_compiles']:g} |")
        else:
            lines.append(f"| {s['model']} | {s['shape']} | {s['cache']} | {s['eager_s']:.2f} "
                         f"| {s['jit_s']:.2f} | {s['jit_over_eager']:.2f} "
                         f"| {s['eager_compiles']:g} | {s['jit_compiles']:g} |")
    ok = all(result["same_bits"].values())
    lines += ["", "Same parameter bits from every way and cache setting: " +
              ("yes, every model." if ok else "NO: " + json.dumps(result["same_bits"])),
              "", f"Whole benchmark: {result['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def parse_models(ap: argparse.ArgumentParser, text: str) -> list[tuple[str, str]]:
    """``name:HxWxC,...`` into pairs, or an argparse error naming the bad entry."""
    from fedsim.models import MODEL_REGISTRY
    models = []
    for entry in text.split(","):
        name, sep, shape = entry.strip().partition(":")
        dims = shape.split("x")
        if not sep or len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            ap.error(f"--models entry {entry!r}: expected NAME:HxWxC, e.g. lenet5:28x28x1")
        if name not in MODEL_REGISTRY:
            ap.error(f"--models entry {entry!r}: unknown model {name!r}; known: "
                     f"{', '.join(sorted(MODEL_REGISTRY))}")
        models.append((name, shape))
    return models


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS, help="NAME:HxWxC, comma-separated")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if args.passes < 1:
        ap.error(f"--passes must be >= 1, got {args.passes}")
    models = parse_models(ap, args.models)
    state = git_state(ROOT)
    t0 = time.perf_counter()
    rows = measure(models, args.passes)
    result = {"models": [f"{n}:{s}" for n, s in models], "passes": args.passes,
              "commit": state["commit"], "dirty": state["dirty"],
              "device": f"cpu ({platform.processor() or platform.machine()}, "
                        f"{os.cpu_count()} cores)",
              "command": "python -m benchmarks.init_time_cpu " + " ".join(
                  argv if argv is not None else sys.argv[1:]),
              "seconds": time.perf_counter() - t0, "rows": rows,
              "summary": summarize(rows), "same_bits": same_bits(rows)}
    write_json_and_markdown(args.out, "init_time_cpu", result, markdown(result))


if __name__ == "__main__":
    main()
