"""Why a multi-dimensional ``jax.random`` draw compiles slowly on XLA:CPU.

``benchmarks/suite_compile_profile.py`` found the test suite's eager random
draws compiling for about a second each, and ``fedsim.models`` compiles a
model's initialisation at XLA's backend optimisation level 2 because at the
default level 3 the initializers' draws took seconds. This script measures
where that comes from. In fresh processes (no persistent compilation cache),
for each setting of

- ``jax_threefry_partitionable`` (on is JAX's default; it changes how the
  counters of a multi-dimensional draw are built), and
- XLA's backend optimisation level (3, the default, and 2),

it times ``jax.jit(...).lower(key).compile()`` of two programs per shape that
return the same values:

- ``multi-dim``: ``jax.random.normal(key, shape)``;
- ``flat``: ``jax.random.normal(key, (n,)).reshape(shape)``, n = prod(shape);

and of one program drawing N(0, 1) noise for every parameter of LeNet-5 (ten
leaves) both ways. Each child process checks that both forms return the same
bits (they do whenever the draw's counters are the flattened index, as with
threefry either way). Medians over ``--passes`` processes per setting, the
settings interleaved within a pass.

Then, at JAX's defaults, the library's own programs that contain such draws,
compiled in fresh processes from this checkout and from each ``--baseline
LABEL=PATH`` (another checkout, e.g. a ``git worktree`` of the commit before
``fedsim.random_draws``), interleaved:

- ``attack``: the gradient-inversion program of ``invert_victims`` (Conv-2 at
  16×16×1, 4 victims × 2 restarts of batch 8, 200 Adam iterations, shared
  weights), with uniform and with Gaussian dummies;
- ``gumbel``: PriPrune's Gumbel-softmax sample over LeNet-5's parameters
  (``defenses.pruning.gumbel.gumbel_tree``).

Run: ``python -m benchmarks.random_draw_compile_cpu [--passes 3] [--baseline LABEL=PATH]``.
Writes ``benchmarks/results/random_draw_compile_cpu.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script, too
from benchmarks.baselines import code_trees  # noqa: E402
from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from benchmarks.results_io import write_json_and_markdown  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
NAME = "random_draw_compile_cpu"
#: Shapes drawn alone: image batches (NHWC) and LeNet-5-sized kernels.
SHAPES = ((64, 10), (4, 16, 16, 3), (5, 5, 6, 16), (32, 28, 28, 1))
#: LeNet-5's parameter shapes (28×28×1 input), one draw each in the "tree" program.
LENET5_SHAPES = ((5, 5, 1, 6), (6,), (5, 5, 6, 16), (16,), (256, 120), (120,), (120, 84),
                 (84,), (84, 10), (10,))
SETTINGS = ((True, 3), (True, 2), (False, 3), (False, 2))  # (partitionable, level)
FORMS = ("multi-dim", "flat")


def _draw(form: str, shape: tuple[int, ...]):
    import jax

    if form == "flat":
        return lambda key: jax.random.normal(key, (math.prod(shape),)).reshape(shape)
    return lambda key: jax.random.normal(key, shape)


def _tree_draw(form: str, shapes):
    import jax

    def draw(key):
        keys = jax.random.split(key, len(shapes))
        return [_draw(form, s)(k) for k, s in zip(keys, shapes)]
    return draw


def measure(shapes=SHAPES, tree_shapes=LENET5_SHAPES) -> dict:
    """Compile seconds of each (program, form) in this process, and whether the
    two forms give the same bits."""
    import jax
    import numpy as np

    key = jax.random.key(0)
    programs = {str(tuple(s)): (lambda f, s=s: _draw(f, s)) for s in shapes}
    programs["LeNet-5 tree"] = lambda f: _tree_draw(f, tree_shapes)
    seconds, same_bits = {}, {}
    for i, (name, make) in enumerate(programs.items()):
        # Alternate which form compiles first, so neither always pays a warm-up.
        order = FORMS if i % 2 == 0 else FORMS[::-1]
        outputs = {}
        for form in order:
            fn = jax.jit(make(form))
            t0 = time.perf_counter()
            compiled = fn.lower(key).compile()
            seconds.setdefault(name, {})[form] = time.perf_counter() - t0
            outputs[form] = jax.tree_util.tree_leaves(compiled(key))
        same_bits[name] = all(np.array_equal(a, b)
                              for a, b in zip(outputs["multi-dim"], outputs["flat"]))
    return {"seconds": seconds, "same_bits": same_bits,
            "partitionable": bool(jax.config.jax_threefry_partitionable),
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax": jax.__version__}


#: Run as ``python -c _LIBRARY_CHILD TREE``: TREE's fedsim, attacks and defenses.
_LIBRARY_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp
from attacks.gradient_inversion import InversionConfig, _compiled
from defenses.pruning.gumbel import gumbel_tree
from fedsim.models import build_model

def seconds(lowered):
    t0 = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - t0

out = {}
model = build_model("conv2", 10)
params = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 1)))
V, B = 4, 8
targets = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (V,) + a.shape), params)
labels = jnp.zeros((V, B), jnp.int32)
keys = jax.random.split(jax.random.key(1), V)
for init in ("uniform", "gaussian"):
    cfg = InversionConfig(iterations=200, restarts=2, init=init)
    fn = _compiled(model.apply, cfg, B, (16, 16, 1), 10, shared_params=True)
    out[f"attack ({init} dummies)"] = seconds(fn.lower(params, targets, labels, keys))
lenet = build_model("lenet5", 10)
thetas = lenet.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
sample = jax.jit(lambda k, th: gumbel_tree(k, th, 0.5))
out["gumbel (LeNet-5)"] = seconds(sample.lower(jax.random.key(2), thetas))
print(json.dumps(out))
"""


def _library_child(tree: Path) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_ENABLE_COMPILATION_CACHE": "false",
           "FEDSIM_COMPILE_CACHE": "0"}
    proc = subprocess.run([sys.executable, "-c", _LIBRARY_CHILD, str(tree)], env=env,
                          cwd=tree, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"library child process ({tree}) failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _child(partitionable: bool, level: int, shapes) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_ENABLE_COMPILATION_CACHE": "false",
           "JAX_THREEFRY_PARTITIONABLE": "true" if partitionable else "false",
           "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "")
                         + f" --xla_backend_optimization_level={level}").strip()}
    spec = json.dumps([list(s) for s in shapes])
    proc = subprocess.run([sys.executable, "-m", "benchmarks.random_draw_compile_cpu",
                           "--child", spec], env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child process (partitionable={partitionable}, level {level}) "
                         f"failed:\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["partitionable"] != partitionable:
        raise SystemExit(f"child process ignored JAX_THREEFRY_PARTITIONABLE={partitionable}")
    return out


def _label(partitionable: bool, level: int) -> str:
    return f"partitionable {'on' if partitionable else 'off'}, level {level}"


def render(result: dict) -> str:
    labels = [_label(p, lv) for p, lv in SETTINGS]
    med = result["median_s"]
    programs = list(med[labels[0]])
    lines = [
        "# Compiling a `jax.random.normal` draw on XLA:CPU: multi-dimensional vs flat",
        "",
        f"Device {result['device']}, jax {result['jax']}; `python -m benchmarks.{NAME} "
        f"--passes {result['passes']}` at commit {short_commit(result['commit'])}. Seconds of "
        "`jax.jit(f).lower(key).compile()`, median over one fresh process per pass and "
        "setting (settings interleaved; no persistent cache). `multi-dim` draws "
        "`normal(key, shape)`, `flat` draws `normal(key, (n,)).reshape(shape)`; ratio = "
        f"multi-dim / flat. 1-min load average {result['load_average_1min'][0]:.1f} → "
        f"{result['load_average_1min'][1]:.1f}.",
        "",
        "| program | setting | multi-dim (s) | flat (s) | multi-dim / flat |",
        "|---|---|---|---|---|",
    ]
    for prog in programs:
        for lb in labels:
            m, f = med[lb][prog]["multi-dim"], med[lb][prog]["flat"]
            lines.append(f"| {prog} | {lb} | {m:.2f} | {f:.2f} | {m / f:.2f}× |")
    lines += ["", "Same bits from both forms in every process: "
              + ("yes" if result["same_bits_everywhere"] else "**no**") + ".", ""]
    library = result.get("library_median_s")
    if library:
        trees = list(library)
        lines += ["## The library's programs (JAX defaults: partitionable on, level 3)", "",
                  "Compile seconds, median over one fresh process per pass and code tree; "
                  + "; ".join(f"`{t}` = {short_commit(result['library_commits'][t])}"
                              for t in trees) + ".", "",
                  "| program | " + " | ".join(f"{t} (s)" for t in trees)
                  + "".join(f" | {trees[0]} / {t}" for t in trees[1:]) + " |",
                  "|---|" + "---|" * (2 * len(trees) - 1)]
        for prog in library[trees[0]]:
            this = library[trees[0]][prog]
            lines.append(f"| {prog} | " + " | ".join(f"{library[t][prog]:.2f}" for t in trees)
                         + "".join(f" | {this / library[t][prog]:.2f}×" for t in trees[1:])
                         + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--shapes", default=None, help=argparse.SUPPRESS)  # tests: JSON list
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--baseline", action="append", default=[], metavar="LABEL=PATH",
                    help="another checkout whose library programs to compile alongside")
    ap.add_argument("--no-library", action="store_true", help=argparse.SUPPRESS)  # tests
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.child is not None:
        shapes = [tuple(s) for s in json.loads(args.child)]
        print(json.dumps(measure(shapes)))
        return {}
    if args.passes < 1:
        ap.error("--passes must be >= 1")
    trees = code_trees(ap, args.baseline, ROOT)
    shapes = SHAPES if args.shapes is None else [tuple(s) for s in json.loads(args.shapes)]
    commit = git_commit()  # at start: the code the children load
    load0 = os.getloadavg()[0]
    runs = {_label(p, lv): [] for p, lv in SETTINGS}
    library = {t: [] for t in trees}
    for _ in range(args.passes):
        for p, lv in SETTINGS:
            runs[_label(p, lv)].append(_child(p, lv, shapes))
        if not args.no_library:
            for t, path in trees.items():
                library[t].append(_library_child(path))
    median = {lb: {prog: {f: statistics.median(r["seconds"][prog][f] for r in rs) for f in FORMS}
                   for prog in rs[0]["seconds"]} for lb, rs in runs.items()}
    result = {"commit": commit, "passes": args.passes,
              "device": f"cpu ({platform.machine()}, {os.cpu_count()} cpus)",
              "jax": runs[_label(*SETTINGS[0])][0]["jax"],
              "load_average_1min": [load0, os.getloadavg()[0]],
              "shapes": [list(s) for s in shapes], "tree_shapes": [list(s) for s in LENET5_SHAPES],
              "median_s": median,
              "same_bits_everywhere": all(all(r["same_bits"].values())
                                          for rs in runs.values() for r in rs),
              "runs": runs}
    if not args.no_library:
        result["library_commits"] = {t: git_commit(path) for t, path in trees.items()}
        result["library_median_s"] = {t: {prog: statistics.median(r[prog] for r in rs)
                                          for prog in rs[0]} for t, rs in library.items()}
        result["library_runs"] = library
    write_json_and_markdown(args.out, NAME, result, render(result))
    return result


if __name__ == "__main__":
    main()
