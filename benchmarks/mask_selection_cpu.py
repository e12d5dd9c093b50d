"""What the Largest defense's share mask costs on XLA:CPU, flat vector vs leaf by leaf.

The Largest defense (``defenses.pruning.defense_prune``) withholds the
``round(0.3·n)`` largest |Δ| of a client's n shared coordinates, ranked over
the whole model. Part B of ``reproduce_chu2023.py`` runs it once per client
per round under the ``loop`` strategy (one jitted call per client), on a
Conv-2 of d = 2.2·10⁶ (16×16 inputs, ``--quick``) or 6.5·10⁶ (28×28)
coordinates. Until this benchmark, the selection concatenated every leaf into
one flat vector first (``masks.flatten``) and split the mask back; it now
works leaf by leaf (``masks._keep_tree``) with the same result. This script
measures, in one run, on a random update of that Conv-2 (|Δ| uniform, 40 %
of coordinates 0 as after base pruning):

- ``flatten``: XLA:CPU's concatenate of the leaves alone, beside numpy's;
- ``flat``: the selection as before (flatten, select on the one vector,
  split back), written here from the ``masks`` functions (with today's
  exact count, ``masks.rate_count``);
- ``leaf-wise``: the defense's share mask as it is now (``defense_mask``);
- ``numpy argsort``: an independent stable argsort of the flat |Δ|, the
  correctness reference (every mask is checked equal to it).

Each is timed as one jitted call (the loop strategy's case) and vmapped over
``--clients`` clients (the vmap strategy's case), calls interleaved, medians
reported.

Run: ``python benchmarks/mask_selection_cpu.py [--repeats 7] [--clients 10]``
Writes ``benchmarks/results/mask_selection_cpu.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RATE = 0.3  # part B's defense rate p̂
ZERO_SHARE = 0.4  # coordinates already 0 in the update (base pruning, dead units)
METHODS = ("flat", "leaf-wise")


def conv2_update(image_size: int, seed: int = 0):
    """A random update with the structure of part B's Conv-2 (10 classes)."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(ROOT))
    from fedsim.models import build_model, init_params

    params = init_params(build_model("conv2", 10), (image_size, image_size, 1),
                         jax.random.key(seed))
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), 2 * len(leaves))
    upd = [jnp.where(jax.random.bernoulli(keys[2 * i], ZERO_SHARE, a.shape), 0.0,
                     jax.random.uniform(keys[2 * i + 1], a.shape, minval=-1.0))
           for i, a in enumerate(leaves)]
    return jax.tree_util.tree_unflatten(tree, upd)


def selections():
    """The jitted-able selections: {name: f(update) -> share mask pytree}."""
    import jax
    import jax.numpy as jnp

    from defenses.pruning.defense_prune import defense_mask
    from defenses.pruning.masks import flatten, mask_pruning_count, rate_count, unflatten

    def flat(update):
        s = jnp.abs(flatten(update))
        shared = (s != 0).astype(jnp.float32)
        k = rate_count(RATE, jnp.sum(s != 0, dtype=jnp.int32))
        keep = mask_pruning_count({"v": s}, k, "highest", {"v": shared})["v"]
        return unflatten(keep, update)

    def leaf_wise(update):
        return defense_mask(update, jax.random.key(0), RATE, 0.0)  # key unused at p_random 0

    return {"flat": flat, "leaf-wise": leaf_wise}


def numpy_reference(update) -> np.ndarray:
    """The flat share mask from a stable numpy argsort (independent of ``masks``)."""
    import jax

    v = np.abs(np.concatenate([np.asarray(a).ravel() for a in jax.tree_util.tree_leaves(update)]))
    shared = np.flatnonzero(v != 0)
    k = int(np.round(RATE * shared.size))
    keep = np.ones(v.size, np.float32)
    keep[shared[np.argsort(-v[shared], kind="stable")[:k]]] = 0.0
    return keep


def measure(image_size: int, clients: int, repeats: int) -> dict:
    """Median seconds of each selection at one Conv-2 size, single and vmapped."""
    import jax
    import jax.numpy as jnp

    from defenses.pruning.masks import flatten

    update = conv2_update(image_size)
    d = int(sum(a.size for a in jax.tree_util.tree_leaves(update)))
    stacked = jax.tree_util.tree_map(
        lambda a: jnp.stack([jnp.roll(a.ravel(), c).reshape(a.shape) for c in range(clients)]),
        update)
    t0 = time.perf_counter()
    ref = numpy_reference(update)
    numpy_s = time.perf_counter() - t0
    calls = {"flatten (XLA concatenate)": (jax.jit(flatten), update)}
    identical = {}
    for name, f in selections().items():
        single, many = jax.jit(f), jax.jit(jax.vmap(f))
        identical[name] = bool(np.array_equal(np.asarray(flatten(single(update))), ref))
        calls[f"{name}, 1 client"] = (single, update)
        calls[f"{name}, {clients} clients vmapped"] = (many, stacked)
    for f, x in calls.values():
        jax.block_until_ready(f(x))
    times = {k: [] for k in calls}
    for _ in range(repeats):
        for k, (f, x) in calls.items():
            t = time.perf_counter()
            jax.block_until_ready(f(x))
            times[k].append(time.perf_counter() - t)
    t0 = time.perf_counter()
    np.concatenate([np.asarray(a).ravel() for a in jax.tree_util.tree_leaves(update)])
    numpy_concat_s = time.perf_counter() - t0
    return {"image_size": image_size, "d": d, "identical_to_numpy_argsort": identical,
            "median_s": {k: float(np.median(v)) for k, v in times.items()},
            "numpy_argsort_s": numpy_s, "numpy_concatenate_s": numpy_concat_s}


def _markdown(result: dict) -> str:
    clients = result["clients"]
    lines = ["# The Largest defense's share mask on XLA:CPU: flat vector vs leaf by leaf", "",
             f"Device {result['device']}, jax {result['jax']}; a random update of part B's "
             f"Conv-2 (10 classes, {int(100 * ZERO_SHARE)} % zeros), p̂ = {RATE}; median of "
             f"{result['repeats']} interleaved jitted calls; 1-min load average "
             f"{result['load_average_1min'][0]:.1f} → {result['load_average_1min'][1]:.1f}. "
             f"Produced by `python benchmarks/mask_selection_cpu.py` at commit "
             f"{result['commit'][:7]}.", "",
             "| inputs | d | flatten: XLA (ms) | flatten: numpy (ms) | flat, 1 client (ms) | "
             f"leaf-wise, 1 client (ms) | ratio | flat, {clients} vmapped (ms) | "
             f"leaf-wise, {clients} vmapped (ms) | ratio | numpy argsort (ms) | "
             "masks equal argsort's |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["sizes"]:
        m = r["median_s"]
        f1, l1 = m["flat, 1 client"], m["leaf-wise, 1 client"]
        fv, lv = m[f"flat, {clients} clients vmapped"], m[f"leaf-wise, {clients} clients vmapped"]
        eq = "yes" if all(r["identical_to_numpy_argsort"].values()) else "NO"
        lines.append(f"| {r['image_size']}×{r['image_size']} | {r['d']:,} | "
                     f"{1e3 * m['flatten (XLA concatenate)']:.0f} | "
                     f"{1e3 * r['numpy_concatenate_s']:.0f} | {1e3 * f1:.0f} | {1e3 * l1:.0f} | "
                     f"{f1 / l1:.1f} | {1e3 * fv:.0f} | {1e3 * lv:.0f} | {fv / lv:.1f} | "
                     f"{1e3 * r['numpy_argsort_s']:.0f} | {eq} |")
    lines += ["", "Ratio: flat / leaf-wise (above 1: leaf-wise is faster)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--image-sizes", type=int, nargs="+", default=[16, 28])
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.clients < 1:
        ap.error("--repeats and --clients must be >= 1")
    if any(s < 4 for s in args.image_sizes):
        ap.error(f"--image-sizes must be >= 4 (Conv-2 pools twice), got {args.image_sizes}")
    import jax

    load0 = os.getloadavg()[0]
    sizes = [measure(s, args.clients, args.repeats) for s in args.image_sizes]
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.provenance import git_commit

    commit = git_commit()  # HEAD, "-dirty" where the code differed
    result = {"repeats": args.repeats, "clients": args.clients, "rate": RATE,
              "zero_share": ZERO_SHARE, "commit": commit, "jax": jax.__version__,
              "device": f"cpu ({platform.machine()}, {os.cpu_count()} cpus)",
              "load_average_1min": [load0, os.getloadavg()[0]], "sizes": sizes}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mask_selection_cpu.json").write_text(json.dumps(result, indent=1))
    md = _markdown(result)
    (args.out / "mask_selection_cpu.md").write_text(md)
    print(md)
    bad = [(r["image_size"], k) for r in sizes for k, ok in r["identical_to_numpy_argsort"].items()
           if not ok]
    if bad:
        raise SystemExit(f"masks differ from the numpy argsort reference: {bad}")
    return result


if __name__ == "__main__":
    main()
