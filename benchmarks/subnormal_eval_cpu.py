"""What subnormal floats cost a Conv-2 forward pass on XLA:CPU.

Part B of ``reproduce_chu2023.py`` evaluates the global Conv-2 on the test set
after every round. Its Largest runs' training phase (rounds plus those
evaluations, ``train_seconds``) takes 2–4× as long as its no-defense runs',
although the network is the same. One candidate: weights that
shrink round after round (a withheld weight averaged as 0 under the ``weights``
and ``split`` semantics) reach the subnormal range, where x86 arithmetic is slow
unless it flushes them to zero. This script measures that cost alone: the
jitted forward pass (argmax over the logits, as the evaluation) of the
part-B Conv-2 on random 16×16 inputs, with

- the initial weights;
- every weight scaled by 1e-13 (activations become subnormal);
- a random half of every kernel set to 1e-40 (subnormal weights, normal
  activations elsewhere).

Each variant runs in this process and, in a child process, under
``XLA_FLAGS=--xla_cpu_ftz=true``
(XLA:CPU's flush-to-zero option), calls interleaved, medians reported. It does
not inspect part B's own models: whether their weights are subnormal is not
measured here.

Run: ``python benchmarks/subnormal_eval_cpu.py [--repeats 15] [--examples 2000]``
Writes ``benchmarks/results/subnormal_eval_cpu.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script, too
from benchmarks.provenance import git_commit, short_commit  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
FTZ_FLAGS = "--xla_cpu_ftz=true"
VARIANTS = ("initial weights", "weights x 1e-13 (subnormal activations)",
            "half of each kernel at 1e-40 (subnormal weights)")


def measure(repeats: int, examples: int) -> dict:
    """Median seconds per forward pass of each variant, in this process."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(ROOT))
    from fedsim.models import build_model

    model = build_model("conv2", 10)
    # Inputs, model and masks from fixed keys: the same arrays in both processes.
    kx, kp, km = jax.random.split(jax.random.key(0), 3)
    x = jax.random.uniform(kx, (examples, 16, 16, 1))
    params = model.init(kp, x[:1])
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(km, len(leaves))
    half = [jnp.where(jax.random.bernoulli(k, 0.5, a.shape), jnp.float32(1e-40), a)
            if a.ndim > 1 else a for k, a in zip(keys, leaves)]
    variants = {VARIANTS[0]: params,
                VARIANTS[1]: jax.tree_util.tree_map(lambda a: a * 1e-13, params),
                VARIANTS[2]: jax.tree_util.tree_unflatten(tree, half)}
    forward = jax.jit(lambda p, x: jnp.argmax(model.apply(p, x), -1).sum())
    for p in variants.values():
        forward(p, x).block_until_ready()
    times = {k: [] for k in variants}
    for _ in range(repeats):
        for k, p in variants.items():
            t0 = time.perf_counter()
            forward(p, x).block_until_ready()
            times[k].append(time.perf_counter() - t0)
    subnormal = {k: float(np.mean([np.mean((np.abs(np.asarray(a)) > 0)
                                           & (np.abs(np.asarray(a)) < np.finfo(np.float32).tiny))
                                   for a in jax.tree_util.tree_leaves(p) if a.ndim > 1]))
                 for k, p in variants.items()}
    return {"median_s": {k: float(np.median(v)) for k, v in times.items()},
            "mean_subnormal_share_of_kernels": subnormal,
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax": jax.__version__}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.examples < 1:
        ap.error("--repeats and --examples must be >= 1")
    if args.child:
        print(json.dumps(measure(args.repeats, args.examples)))
        return {}
    commit = git_commit()  # at start: the code this process loaded
    load0 = os.getloadavg()[0]
    default = measure(args.repeats, args.examples)
    env = {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + FTZ_FLAGS).strip()}
    child = subprocess.run([sys.executable, __file__, "--child", "--repeats", str(args.repeats),
                            "--examples", str(args.examples)], env=env, capture_output=True,
                           text=True)
    if child.returncode != 0:
        raise SystemExit(f"flush-to-zero child process failed:\n{child.stderr[-2000:]}")
    ftz = json.loads(child.stdout.strip().splitlines()[-1])
    result = {"examples": args.examples, "repeats": args.repeats, "commit": commit,
              "device": f"cpu ({platform.machine()}, {os.cpu_count()} cpus)",
              "load_average_1min": [load0, os.getloadavg()[0]],
              "default": default, "flush_to_zero": ftz}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "subnormal_eval_cpu.json").write_text(json.dumps(result, indent=1))
    base = default["median_s"][VARIANTS[0]]
    lines = ["# Subnormal floats in a Conv-2 forward pass on XLA:CPU", "",
             f"Device {result['device']}, jax {default['jax']}; the jitted forward pass (argmax "
             f"of the logits) of part B's Conv-2 on {args.examples} random 16×16 inputs; median "
             f"of {args.repeats} interleaved calls; 1-min load average "
             f"{load0:.1f} → {result['load_average_1min'][1]:.1f}. Flush to zero: a child "
             f"process with `XLA_FLAGS={FTZ_FLAGS}`. Produced by "
             f"`python benchmarks/subnormal_eval_cpu.py` at commit {short_commit(commit)}.", "",
             "| parameters | subnormal share of kernels | default (ms) | ratio to initial | "
             "flush to zero (ms) | ratio to initial, default |", "|---|---|---|---|---|---|"]
    for k in VARIANTS:
        d, f = default["median_s"][k], ftz["median_s"][k]
        lines.append(f"| {k} | {default['mean_subnormal_share_of_kernels'][k]:.2f} | "
                     f"{1e3 * d:.0f} | {d / base:.2f} | {1e3 * f:.0f} | {f / base:.2f} |")
    (args.out / "subnormal_eval_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


if __name__ == "__main__":
    main()
