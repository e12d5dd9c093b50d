"""Does a float32 run give the same numbers with ``jax_enable_x64`` on?

Same config and seed, same numbers: a user who turns on 64-bit JAX for
anything else in the process (``JAX_ENABLE_X64=1``, or ``jax.config.update``)
must get the float32 run they would get without it. Each case below runs in
fresh processes under ``JAX_ENABLE_X64=0`` and ``=1`` (no persistent
compilation cache) from this checkout and from each ``--baseline`` checkout,
and the two settings' results are compared bit for bit:

- ``run`` cases: ``Simulation`` for a few rounds; the final parameters (their
  SHA-1, and the largest difference between the settings), the per-round
  training losses, the test accuracy and the training images' SHA-1.
- ``attack`` cases: ``fedsim attack CONFIG``; every victim's reconstruction
  scores in ``attack_summary.json`` (MSE, PSNR, SSIM, NMI, AMI, the attack
  loss, the labels; timings left out).

Run: ``python -m benchmarks.x64_invariance [--baseline LABEL=PATH ...]``.
Writes ``benchmarks/results/x64_invariance.{json,md}``; ``--render JSON``
writes the markdown of a saved result again.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script, too
from benchmarks.baselines import code_trees  # noqa: E402
from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from benchmarks.results_io import write_json_and_markdown  # noqa: E402

NAME = "x64_invariance"
RESULTS = ROOT / "benchmarks" / "results"

#: name -> (kind, config, overrides, rounds). Overrides shrink the quickstart so
#: that a case runs in about a minute on a 2-core CPU.
CASES = {
    "quickstart LeNet-5, 2 rounds (momentum SGD, loop)": (
        "run", "configs/quickstart.yaml",
        ["training.client_parallelism=loop", "data.max_train=2000", "data.num_clients=20"], 2),
    "convnet_bn at 16x16 (resized), Adam clients, Yogi server, vmap, 1 round": (
        "run", "configs/quickstart.yaml",
        ["model.name=convnet_bn", "data.image_size=16", "training.client_parallelism=vmap",
         "data.max_train=1000", "data.num_clients=20", "training.clients_per_round=3",
         "training.optimizer=adam", "training.lr=0.001", "training.server_optimizer=yogi",
         "training.server_lr=0.01"], 1),
    "attack quickstart (Inverting Gradients, 4 victims, 1,000 iterations)": (
        "attack", "configs/attack_quickstart.yaml", [], None),
}

# Run with the checked-out tree's own code (cwd and sys.path), so that a
# baseline checkout runs its code, not this one's.
_CHILD = r"""
import hashlib, json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import jax
import numpy as np
kind, config, overrides, rounds, params_out = json.loads(sys.argv[2])
sha = lambda b: hashlib.sha1(b).hexdigest()
out = {"x64": bool(jax.config.jax_enable_x64), "jax": jax.__version__}
if kind == "run":
    from fedsim.config import load_config
    from fedsim.simulation import Simulation
    sim = Simulation(load_config(config, overrides))
    state = sim.init_state()
    losses = []
    for r in range(rounds):
        state, res = sim.run_round(state, r)
        losses.append(float(res.train_loss))
    leaves = jax.tree_util.tree_leaves(state.params)
    flat = np.concatenate([np.asarray(a, np.float64).ravel() for a in leaves])
    np.save(params_out, flat)
    acc, loss = sim.evaluate(state.params)
    out.update(params_sha1=sha(flat.tobytes()), params_dtypes=sorted({str(a.dtype) for a in leaves}),
               train_losses=losses, test_accuracy=float(acc), test_loss=float(loss),
               x_train_sha1=sha(np.ascontiguousarray(sim.dataset.x_train).tobytes()))
else:
    from fedsim.cli import main
    with tempfile.TemporaryDirectory() as d:
        sets = [a for o in overrides for a in ("--set", o)]
        main(["attack", config, *sets, "--set", f"output.dir={d}/run"])
        summary = json.loads(Path(d, "run", "attack_summary.json").read_text())
    keep = ("mse", "psnr", "ssim", "nmi", "ami", "loss", "labels", "label_accuracy")
    victims = [{k: v[k] for k in keep if k in v} for v in summary["victims"]]
    out.update(victims=victims, victims_sha1=sha(json.dumps(victims, sort_keys=True).encode()))
print("X64_INVARIANCE " + json.dumps(out))
"""


def child(tree: Path, x64: bool, case: tuple, params_out: str) -> dict:
    """One case in a fresh process of ``tree``'s code under ``JAX_ENABLE_X64``."""
    kind, config, overrides, rounds = case
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_ENABLE_X64": "1" if x64 else "0",
           "FEDSIM_COMPILE_CACHE": "0"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tree),
                           json.dumps([kind, config, overrides, rounds, params_out])],
                          env=env, cwd=tree, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("X64_INVARIANCE ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"child process ({tree}, JAX_ENABLE_X64={int(x64)}, {config}) "
                         f"failed:\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1].split(" ", 1)[1])
    if out["x64"] != x64:
        raise SystemExit(f"child process ignored JAX_ENABLE_X64={int(x64)}")
    return out


def compare(case: tuple, tree: Path) -> dict:
    """Run ``case`` from ``tree`` without and with x64 and compare the results."""
    kind = case[0]
    with tempfile.TemporaryDirectory() as d:
        off = child(tree, False, case, str(Path(d, "off.npy")))
        on = child(tree, True, case, str(Path(d, "on.npy")))
        row = {"off": off, "on": on}
        if kind == "run":
            a, b = np.load(Path(d, "off.npy")), np.load(Path(d, "on.npy"))
            row["max_abs_param_difference"] = float(np.max(np.abs(a - b)))
            row["params_differing"] = float(np.mean(a != b))
            row["same"] = (off["params_sha1"] == on["params_sha1"]
                           and off["train_losses"] == on["train_losses"]
                           and off["test_accuracy"] == on["test_accuracy"]
                           and off["x_train_sha1"] == on["x_train_sha1"])
        else:
            row["max_abs_psnr_difference"] = max(
                abs(u["psnr"] - v["psnr"]) for u, v in zip(off["victims"], on["victims"]))
            row["same"] = off["victims_sha1"] == on["victims_sha1"]
    return row


def render(result: dict) -> str:
    trees = list(result["trees"])
    lines = [
        "# A float32 run with and without `jax_enable_x64`", "",
        f"Device {result['device']}, jax {result['jax']}; `python -m benchmarks.{NAME}` at "
        f"commit {short_commit(result['commit'])}. Each case ran in fresh processes under "
        "`JAX_ENABLE_X64=0` and `=1` (no persistent compilation cache) from each code tree: "
        + "; ".join(f"`{t}` = {short_commit(result['tree_commits'][t])}" for t in trees)
        + ". \"Same\" means bit for bit: for a run, the final parameters, every round's "
        "training loss, the test accuracy and the training images; for an attack, every "
        "victim's MSE, PSNR, SSIM, NMI, AMI, attack loss and labels.", "",
        "| case | code | same | final parameters that differ | largest difference |",
        "|---|---|---|---|---|"]
    for case, by_tree in result["cases"].items():
        for t in trees:
            row = by_tree[t]
            if "max_abs_param_difference" in row:
                share = f"{100 * row['params_differing']:.1f} %"
                diff = f"{row['max_abs_param_difference']:.2e} (a parameter)"
            else:
                share = "(attack)"
                diff = f"{row['max_abs_psnr_difference']:.4f} dB (a victim's PSNR)"
            lines.append(f"| {case} | {t} | {'yes' if row['same'] else '**no**'} | {share} | "
                         f"{diff} |")
    if len(trees) > 1:
        lines += ["", f"Without x64, does each other tree give `{trees[0]}`'s numbers bit for bit "
                  "(what a change that only concerns x64 must keep)?", "",
                  "| case | " + " | ".join(f"`{t}`" for t in trees[1:]) + " |",
                  "|---|" + "---|" * (len(trees) - 1)]
        for case, by_tree in result["cases"].items():
            lines.append(f"| {case} | " + " | ".join(
                "yes" if _digest(by_tree[t]["off"]) == _digest(by_tree[trees[0]]["off"])
                else "**no**" for t in trees[1:]) + " |")
    return "\n".join(lines) + "\n"


def _digest(out: dict) -> str:
    """What a child's numbers hash to: a run's parameters and losses, an attack's victims."""
    if "params_sha1" in out:
        return json.dumps([out["params_sha1"], out["train_losses"], out["test_accuracy"],
                           out["x_train_sha1"]])
    return out["victims_sha1"]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", action="append", default=[], metavar="LABEL=PATH",
                    help="another checkout to run the same cases from")
    ap.add_argument("--cases", default=None, help=argparse.SUPPRESS)  # tests: JSON object
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--render", type=Path, default=None, metavar="JSON",
                    help="write the markdown of a saved result again, running nothing")
    args = ap.parse_args(argv)
    if args.render is not None:
        try:
            result = json.loads(args.render.read_text())
        except (OSError, json.JSONDecodeError) as e:
            ap.error(f"--render {args.render}: cannot read a saved result ({e})")
        if not isinstance(result, dict) or not {"cases", "trees", "tree_commits"} <= set(result):
            ap.error(f"--render {args.render}: not an {NAME} result (no cases, trees, tree_commits)")
        write_json_and_markdown(args.out, NAME, result, render(result))
        return result
    trees = code_trees(ap, args.baseline, ROOT)
    cases = CASES if args.cases is None else {k: tuple(v) for k, v in json.loads(args.cases).items()}
    commit = git_commit()  # at start: the code the children load
    tree_commits = {t: git_commit(p) for t, p in trees.items()}
    load0 = os.getloadavg()[0]
    results = {name: {t: compare(case, path) for t, path in trees.items()}
               for name, case in cases.items()}
    first = next(iter(next(iter(results.values())).values()))
    result = {"commit": commit, "device": f"cpu ({platform.machine()}, {os.cpu_count()} cpus)",
              "jax": first["off"]["jax"], "load_average_1min": [load0, os.getloadavg()[0]],
              "tree_commits": tree_commits,
              "trees": {t: str(p) for t, p in trees.items()},
              "case_specs": {k: list(v) for k, v in cases.items()}, "cases": results}
    write_json_and_markdown(args.out, NAME, result, render(result))
    return result


if __name__ == "__main__":
    main()
