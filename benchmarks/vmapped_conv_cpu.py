"""Convolutions under ``vmap`` over instances on CPU: the rule without and with
:func:`fedsim.models.vmapped_instances`.

Under a ``vmap`` over instances (gradient-inversion victims and restarts, a
cohort's clients) each instance has its own kernel, or differentiates with
respect to the kernel, so XLA:CPU sees convolutions with a batched kernel and
computes them as grouped convolutions. ``fedsim.models.Conv`` uses im2col at a
per-instance batch ≤ ``IM2COL_MAX_BATCH`` (4) anyway; this script measures
what the per-instance batches above it cost, each workload's jitted function
traced two ways:

* ``rule``: ``Conv``'s batch rule alone (XLA's convolution above batch 4,
  except layers whose kernel exceeds their input; what ran before the hint);
* ``vmapped``: traced inside :func:`fedsim.models.vmapped_instances`
  (im2col up to ``VMAPPED_IM2COL_MAX_BATCH``).

Workloads (``V`` instances, each with its own parameters unless ``shared``):

* ``attack b=… V=… own|shared``: the gradient, with respect to a dummy batch
  of b, of the squared distance between its parameter gradient and a target
  (DLG's objective, second order), vmapped as ``attacks.gradient_inversion``
  vmaps victims (own) and restarts (shared);
* ``train B=… V=… own``: one local SGD step's gradient over a batch of B,
  vmapped over V clients (the engine's ``vmap`` strategy).

End to end (``--end-to-end``, on by default): ``attacks.inverting_gradients``
against 4 Conv-2 victims with their own parameters at reproduce_chu2023's
quick batches (8 on the p axis, 20 in part B), 16×16×1, each variant timed
after a compile call, with each reconstruction's MSE to the truth.

Each pair of calls is interleaved ``--reps`` times after a warm-up (compile
excluded); medians and their ratio, and each variant's float32 error against
a float64 run of XLA's convolution. Results:
``benchmarks/results/vmapped_conv_cpu.{json,md}``. Shared 2-core CPU: compare
ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from attacks import inverting_gradients  # noqa: E402
from attacks.api import observation_from_gradient  # noqa: E402
from benchmarks.conv_im2col_cpu import dlg_objective, time_run_many, time_traced  # noqa: E402
from benchmarks.provenance import git_commit  # noqa: E402
from benchmarks.results_file import read_or_exit  # noqa: E402
from fedsim import models  # noqa: E402
from fedsim.client import cross_entropy  # noqa: E402

# The sizes the reproductions run at: reproduce_chu2023 --quick (16×16 Fashion-MNIST,
# Conv-2 and VGG-11), reproduce_sun2021 --quick (ConvNet 16×16, the DLG LeNet 32×32×3).
SHAPES = {"conv2": (16, 16, 1), "vgg11": (16, 16, 1), "convnet": (16, 16, 1),
          "lenet": (32, 32, 3), "lenet5": (32, 32, 1), "lenet5_1998": (28, 28, 1)}
DEFAULT_MODELS = ["conv2", "vgg11", "convnet", "lenet", "lenet5"]
F32 = jnp.float32
VARIANTS = ("rule", "vmapped")


def variant(name):
    """The context a variant's function is traced in."""
    return models.vmapped_instances() if name == "vmapped" else contextlib.nullcontext()


def _stack(tree, v):
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (v,) + a.shape), tree)


def workloads(model_name, attack_batches, attack_instances, train_batches, train_instances):
    """Yield (label, fn, args) for one model; fn is traced under the current variant."""
    model = models.build_model(model_name, 10)
    apply_fn = models.make_apply_fn(model)
    shape = SHAPES[model_name]
    params = models.init_params(model, shape, jax.random.key(0))

    def mean_loss(p, x, y):
        return jnp.mean(cross_entropy(apply_fn(p, x), y))

    for b in attack_batches:
        match, target = dlg_objective(apply_fn, params, shape, b)
        for v in attack_instances:
            dummies = jax.random.uniform(jax.random.key(4), (v, b) + shape, F32)
            own = jax.vmap(jax.grad(match), in_axes=(0, 0, 0))
            yield f"attack b={b} V={v} own", own, (dummies, _stack(params, v), _stack(target, v))
            shared = jax.vmap(jax.grad(match), in_axes=(0, None, None))
            yield f"attack b={b} V={v} shared", shared, (dummies, params, target)
    for b in train_batches:
        for v in train_instances:
            x = jax.random.uniform(jax.random.key(1), (v, b) + shape, F32)
            y = jax.random.randint(jax.random.key(2), (v, b), 0, 10)
            yield (f"train B={b} V={v} own", jax.vmap(jax.grad(mean_loss)),
                   (_stack(params, v), x, y))


def time_variants(fn, args, reps):
    """Compile fn under each variant, measure each one's error, time interleaved calls."""
    return time_traced(fn, args, reps, {name: functools.partial(variant, name)
                                        for name in VARIANTS})


def end_to_end(batch, iterations, victims=4):
    """Seconds of inverting_gradients.run_many (after a compile call) per variant, and
    each reconstruction's MSE to the truth: Conv-2, 16×16×1, victims with own params."""
    model = models.build_model("conv2", 10)
    shape = SHAPES["conv2"]
    apply_fn = models.make_apply_fn(model)
    keys = jax.random.split(jax.random.key(20), victims)
    params = [models.init_params(model, shape, k) for k in keys]
    xs = jax.random.uniform(jax.random.key(21), (victims, batch) + shape, F32)
    ys = jax.random.randint(jax.random.key(22), (victims, batch), 0, 10)
    grads = [jax.grad(lambda p: jnp.mean(cross_entropy(apply_fn(p, x), y)))(p)
             for p, x, y in zip(params, xs, ys)]
    config = {"iterations": iterations, "lr": 0.1, "tv": 1e-3}
    # "rule" switches the hint off (the attack suite sets it itself).
    limits = {"rule": 0, "vmapped": models.VMAPPED_IM2COL_MAX_BATCH}
    return time_run_many(
        model, inverting_gradients,
        lambda fresh: [observation_from_gradient(g, p, fresh, input_shape=shape, num_classes=10,
                                                 batch_size=batch, labels=y)
                       for g, p, y in zip(grads, params, ys)],
        config, jax.random.key(23), xs,
        {name: functools.partial(models.vmapped_im2col_max_batch, limits[name])
         for name in VARIANTS})


def render_markdown(result):
    """The markdown of a result dict (what main writes; ``--render`` redoes it)."""
    load0, load1 = result["load_average_1min"]
    args = "".join(" " + a for a in result.get("argv", []))
    lines = ["# Convolutions under vmap over instances on CPU: the batch rule vs "
             "`vmapped_instances()` (median ms)", "",
             f"Device {result['device']}; median of {result['reps']} interleaved calls; 1-min "
             f"load average {load0:.1f} → {load1:.1f}. Produced by `python -m "
             f"benchmarks.vmapped_conv_cpu{args}` at commit {result['commit'][:7]}. `rule`: "
             "`Conv`'s batch rule alone (im2col at a per-instance batch ≤ "
             f"{result['im2col_max_batch']} or where the kernel exceeds the input, XLA's "
             "convolution otherwise); `vmapped`: traced inside "
             "`fedsim.models.vmapped_instances()` (im2col up to a per-instance batch of "
             f"{result['vmapped_im2col_max_batch']}). `attack b V own|shared`: DLG's second-order "
             "objective over a dummy batch of b, vmapped over V instances with their own "
             "parameters (victims) or the same ones (restarts). `train B V own`: one SGD step's "
             "gradient over a batch of B, vmapped over V clients (the engine's `vmap` strategy). "
             "convs: HLO convolutions left in the traced function. Error: max |float32 − "
             "float64| / max |float64| per output array (float64 through XLA's conv), worst "
             "array.", "",
             "| model | input | workload | rule | vmapped | rule / vmapped | convs (rule / "
             "vmapped) | error rule | error vmapped |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        shape = "×".join(map(str, r["input_shape"]))
        lines.append(f"| {r['model']} | {shape} | {r['workload']} | {r['rule_ms']:.1f} | "
                     f"{r['vmapped_ms']:.1f} | {r['rule_over_vmapped']:.2f} | "
                     f"{r['convolutions']['rule']} / {r['convolutions']['vmapped']} | "
                     f"{r['rule_error_vs_f64']:.1e} | {r['vmapped_error_vs_f64']:.1e} |")
    if result.get("end_to_end"):
        lines += ["", "## End to end: `attacks.inverting_gradients.run_many` (seconds, after a "
                  "compile call)", "", "4 Conv-2 victims (16×16×1), each with its own "
                  "parameters, labels granted, Adam lr 0.1, TV 1e-3; the same victims, targets "
                  "and attack key for both variants. `rule` switches the hint off "
                  "(`vmapped_im2col_max_batch(0)`), `vmapped` is what the attack suite runs.",
                  "", "| batch | iterations | rule | vmapped | rule / vmapped | MSE to truth, "
                  "rule | MSE to truth, vmapped |", "|---|---|---|---|---|---|---|"]
        fmt = lambda v: " / ".join(f"{m:.3g}" for m in v)  # noqa: E731
        for r in result["end_to_end"]:
            a, b = r["rule"], r["vmapped"]
            lines.append(f"| {r['batch']} | {r['iterations']} | {a['seconds']:.2f} | "
                         f"{b['seconds']:.2f} | {a['seconds'] / b['seconds']:.1f} | "
                         f"{fmt(a['mse'])} | {fmt(b['mse'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS, choices=list(SHAPES))
    ap.add_argument("--attack-batches", nargs="*", type=int, default=[8, 20])
    ap.add_argument("--attack-instances", nargs="*", type=int, default=[4])
    ap.add_argument("--train-batches", nargs="*", type=int, default=[20, 32, 64])
    ap.add_argument("--train-instances", nargs="*", type=int, default=[8])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--end-to-end", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--end-to-end-batches", nargs="*", type=int, default=[8, 20])
    ap.add_argument("--iterations", type=int, default=30,
                    help="attack iterations of the end-to-end rows")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--render", metavar="JSON",
                    help="only rewrite the markdown next to this results JSON")
    args = ap.parse_args(argv)
    if args.render:
        path = Path(args.render)
        path.with_suffix(".md").write_text(render_markdown(read_or_exit(ap, path, "--render")))
        return None
    for name in ("attack_batches", "attack_instances", "train_batches", "train_instances",
                 "end_to_end_batches"):
        values = getattr(args, name)
        if any(v < 1 for v in values):
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {values}")
    if args.reps < 1 or args.iterations < 1:
        ap.error(f"--reps and --iterations must be >= 1, got {args.reps} and {args.iterations}")
    commit = git_commit()  # at the start: the code that runs
    load0 = os.getloadavg()[0]
    rows = []
    for name in args.models:
        for label, fn, fargs in workloads(name, args.attack_batches, args.attack_instances,
                                          args.train_batches, args.train_instances):
            med, err, convs = time_variants(fn, fargs, args.reps)
            rows.append({"model": name, "input_shape": list(SHAPES[name]), "workload": label,
                         "rule_ms": med["rule"], "vmapped_ms": med["vmapped"],
                         "rule_over_vmapped": med["rule"] / med["vmapped"],
                         "convolutions": convs, "rule_error_vs_f64": err["rule"],
                         "vmapped_error_vs_f64": err["vmapped"]})
            print(json.dumps(rows[-1]), flush=True)
    e2e = []
    if args.end_to_end:
        for b in args.end_to_end_batches:
            e2e.append({"batch": b, "iterations": args.iterations,
                        **end_to_end(b, args.iterations)})
            print(json.dumps(e2e[-1]), flush=True)
    result = {"device": f"{jax.default_backend()} ({platform.machine()}, {os.cpu_count()} cpus), "
                        f"jax {jax.__version__}",
              "commit": commit, "load_average_1min": [load0, os.getloadavg()[0]],
              "argv": list(sys.argv[1:] if argv is None else argv), "reps": args.reps,
              "im2col_max_batch": models.IM2COL_MAX_BATCH,
              "vmapped_im2col_max_batch": models.VMAPPED_IM2COL_MAX_BATCH,
              "rows": rows, "end_to_end": e2e}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vmapped_conv_cpu.json").write_text(json.dumps(result, indent=2))
    (out / "vmapped_conv_cpu.md").write_text(render_markdown(result))
    return result


if __name__ == "__main__":
    main()
