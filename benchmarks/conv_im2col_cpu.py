"""XLA's convolution vs an im2col GEMM (``fedsim.models.conv_im2col``) on CPU.

For each model (the registry's conv models, all convolutions switched
together) and each workload below, one run times the same jitted function twice:
once with every ``fedsim.models.Conv`` computed by ``lax.conv_general_dilated``
and once by :func:`fedsim.models.conv_im2col`:

* ``train B``: the gradient of the mean cross-entropy over a batch of B
  (one local SGD step's work);
* ``per-example B``: ``vmap(grad)`` over B examples, each a batch of 1
  (DP-SGD's per-example gradients);
* ``attack b``: the gradient, with respect to a dummy input of batch b, of
  the squared distance between the dummy's parameter gradient and a target
  gradient (DLG's objective: second order); ``V=v shared`` vmaps it over v
  instances with the same parameters (restarts against one victim), ``V=v
  own`` over v instances with their own parameters (victims with their own
  local models), as ``attacks.gradient_inversion`` does.

End to end (``--end-to-end``, on by default): the attack suite's own vmapped
loops, each implementation once after a compile call: DLG
(``attacks.dlg.run_many``, L-BFGS) against 4 victims on the DLG LeNet
(32×32×3, the reference code's U(−0.5, 0.5) init) and Inverting Gradients
(``attacks.inverting_gradients.run_many``, Adam lr 0.1) against 4 victims on
a width-8 ConvNet (16×16×1), reproduce_sun2021's quick GS settings; with
each reconstruction's MSE to the truth.

Each pair of calls is interleaved ``--reps`` times after a warm-up (compile
excluded, ``block_until_ready``); the table gives medians and their ratio, and
each implementation's float32 error: max |output − float64 output| / max
|float64 output| per output array (the float64 output computed with XLA's
conv), worst array. The choice that ``Conv`` makes by itself (im2col for
batches up to ``IM2COL_MAX_BATCH``) is read off this table. Results:
``benchmarks/results/conv_im2col_cpu.{json,md}``. Shared 2-core CPU: compare
ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from attacks import dlg, inverting_gradients  # noqa: E402
from attacks.api import observation_from_gradient  # noqa: E402
from benchmarks.provenance import git_commit  # noqa: E402
from benchmarks.results_file import read_or_exit  # noqa: E402
from fedsim import models  # noqa: E402
from fedsim.client import cross_entropy  # noqa: E402

# convnet at the size of reproduce_sun2021's quick GS runs (16×16 Fashion-MNIST).
SHAPES = {"lenet": (32, 32, 3), "convnet": (16, 16, 1), "conv2": (28, 28, 1),
          "lenet5_1998": (28, 28, 1), "alexnet": (32, 32, 3), "vgg11": (32, 32, 3),
          "resnet10": (32, 32, 3)}
DEFAULT_MODELS = ["lenet", "convnet", "conv2", "lenet5_1998"]
F32 = jnp.float32
IMPLS = ("xla", "im2col")  # each forced at every layer (models.conv_implementation)


def workloads(model_name, train_batches, per_example_batches, attack_instances, attack_batches):
    """Yield (label, fn, args) for one model; fn is traced under the current impl."""
    model = models.build_model(model_name, 10)
    apply_fn = models.make_apply_fn(model)
    shape = SHAPES[model_name]
    params = models.init_params(model, shape, jax.random.key(0))

    def mean_loss(p, x, y):
        return jnp.mean(cross_entropy(apply_fn(p, x), y))

    for b in train_batches:
        x = jax.random.uniform(jax.random.key(1), (b,) + shape, F32)
        y = jax.random.randint(jax.random.key(2), (b,), 0, 10)
        yield f"train B={b}", jax.grad(mean_loss), (params, x, y)
    for b in per_example_batches:
        x = jax.random.uniform(jax.random.key(1), (b, 1) + shape, F32)
        y = jax.random.randint(jax.random.key(2), (b, 1), 0, 10)
        yield f"per-example B={b}", jax.vmap(jax.grad(mean_loss), (None, 0, 0)), (params, x, y)
    for b in attack_batches:
        match, target = dlg_objective(apply_fn, params, shape, b)
        for v in attack_instances:
            dummies = jax.random.uniform(jax.random.key(4), (v, b) + shape, F32)
            if v == 1:
                yield f"attack b={b}", jax.grad(match), (dummies[0], params, target)
                continue
            shared = jax.vmap(jax.grad(match), in_axes=(0, None, None))
            yield f"attack b={b} V={v} shared", shared, (dummies, params, target)
            stack = lambda t: jax.tree.map(  # noqa: E731
                lambda a: jnp.broadcast_to(a, (v,) + a.shape), t)
            own = jax.vmap(jax.grad(match), in_axes=(0, 0, 0))
            yield f"attack b={b} V={v} own", own, (dummies, stack(params), stack(target))


def dlg_objective(apply_fn, params, shape, b):
    """``(match, target)``: DLG's objective ``match(x, p, target)``, the squared distance
    between the parameter gradient of a dummy batch ``x`` of b and ``target``, and the
    target gradient of a fixed random batch at ``params``."""
    y1 = jnp.arange(b) % 10

    def param_grad(p, x):
        return jax.grad(lambda q: jnp.mean(cross_entropy(apply_fn(q, x), y1)))(p)

    def match(x, p, tgt):
        g = param_grad(p, x)
        return sum(jnp.sum((a - t) ** 2) for a, t in zip(jax.tree.leaves(g), jax.tree.leaves(tgt)))

    return match, param_grad(params, jax.random.uniform(jax.random.key(3), (b,) + shape, F32))


def relative_error(out, ref):
    """Worst over output arrays of max |out − ref| / max |ref| (in float64 numpy)."""
    errs = []
    for a, b in zip(jax.tree.leaves(out), ref):
        a = np.asarray(a, np.float64)
        errs.append(float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30)))
    return max(errs)


def time_pair(fn, args, reps):
    """Compile fn under each impl, measure each one's error, time interleaved calls."""
    med, errors, _ = time_traced(fn, args, reps, {impl: functools.partial(
        models.conv_implementation, impl) for impl in IMPLS})
    return med, errors


def time_traced(fn, args, reps, contexts):
    """``(median ms, error vs float64, HLO convolutions)`` per name of ``contexts``.

    ``contexts`` maps a name to a function returning the context ``fn`` is traced
    in; each is compiled once, checked against a float64 run of XLA's
    convolution, and timed in interleaved calls after that warm-up.
    """
    compiled, errors, convolutions = {}, {}, {}
    to64 = lambda t: jax.tree.map(  # noqa: E731
        lambda a: a.astype(jnp.float64) if a.dtype == F32 else a, t)
    with jax.enable_x64(True), models.conv_implementation("xla"):  # float64 reference
        ref = [np.asarray(a) for a in jax.tree.leaves(jax.jit(lambda *a: fn(*a))(*to64(args)))]
    if any(a.dtype != np.float64 for a in ref):
        raise RuntimeError("the float64 reference did not run in float64")
    for name, context in contexts.items():
        # A fresh wrapper per variant: jit caches traces by function, and the
        # implementation is chosen at trace time.
        with context():
            lowered = jax.jit(lambda *a: fn(*a)).lower(*args)
        convolutions[name] = lowered.as_text().count("stablehlo.convolution")
        compiled[name] = lowered.compile()
        out = jax.block_until_ready(compiled[name](*args))
        if any(a.dtype != F32 for a in jax.tree.leaves(out)):
            raise RuntimeError("a float32 workload produced a non-float32 output")
        errors[name] = relative_error(out, ref)
    times = {name: [] for name in contexts}
    for _ in range(reps):
        for name in contexts:
            t0 = time.perf_counter()
            jax.block_until_ready(compiled[name](*args))
            times[name].append(time.perf_counter() - t0)
    med = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
    return med, errors, convolutions


def end_to_end_cases(dlg_iterations, gs_iterations):
    """(label, model, input_shape, attack module, attack config) of the end-to-end rows."""
    lenet = models.LeNetDLG(num_classes=10, init_scale=0.5)
    return [(f"DLG, 4 victims × {dlg_iterations} L-BFGS its", lenet, (32, 32, 3), dlg,
             {"iterations": dlg_iterations}),
            (f"GS, 4 victims × {gs_iterations} Adam its", models.ConvNet(num_classes=10, width=8),
             (16, 16, 1), inverting_gradients, {"iterations": gs_iterations, "lr": 0.1})]


def end_to_end(model, shape, attack, config, victims=4):
    """Seconds of attack.run_many (after a compile call) and MSE to truth, per impl."""
    apply_fn = models.make_apply_fn(model)
    params = models.init_params(model, shape, jax.random.key(10))
    xs = jax.random.uniform(jax.random.key(11), (victims, 1) + shape, F32)
    ys = jax.random.randint(jax.random.key(12), (victims, 1), 0, 10)
    with models.conv_implementation("xla"):
        grads = [jax.grad(lambda p: jnp.mean(cross_entropy(apply_fn(p, x), y)))(params)
                 for x, y in zip(xs, ys)]
    return time_run_many(
        model, attack,
        lambda fresh: [observation_from_gradient(g, params, fresh, input_shape=shape,
                                                 num_classes=10, batch_size=1) for g in grads],
        config, jax.random.key(13), xs,
        {impl: functools.partial(models.conv_implementation, impl) for impl in IMPLS})


def time_run_many(model, attack, observations_for, config, key, xs, contexts):
    """``attack.run_many`` once per name of ``contexts``: its seconds after a compile call,
    the compile call's, and each reconstruction's MSE to its truth in ``xs``.

    ``observations_for(apply_fn)`` builds the observations around a fresh apply_fn made
    inside the context: the attack suite caches its compiled loop by apply_fn, and Conv
    chooses its implementation at trace time.
    """
    out = {}
    for name, context in contexts.items():
        with context():
            observations = observations_for(models.make_apply_fn(model))
            t0 = time.perf_counter()
            jax.block_until_ready([r.x for r in attack.run_many(observations, config, key)])
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            recs = attack.run_many(observations, config, key)
            jax.block_until_ready([r.x for r in recs])
        out[name] = {"seconds": time.perf_counter() - t0, "first_call_seconds": first,
                     "mse": [float(jnp.mean((jnp.clip(r.x, 0, 1) - x) ** 2))
                             for r, x in zip(recs, xs)]}
    return out


def render_markdown(result):
    """The markdown table of a result dict (what main writes; ``--render`` redoes it)."""
    load0, load1 = result["load_average_1min"]
    args = "".join(" " + a for a in result.get("argv", []))
    lines = ["# Convolutions on CPU: XLA's conv vs im2col GEMM (median ms)", "",
             f"Device {result['device']}; median of {result['reps']} interleaved calls; 1-min "
             f"load average {load0:.1f} → {load1:.1f}. Produced by `python "
             f"benchmarks/conv_im2col_cpu.py{args}` at commit {result['commit'][:7]}. Both "
             "implementations run the same jitted function, every `Conv` of the model switched "
             "together. `train B`: gradient of the mean loss over a batch of B. `per-example B`: "
             "vmap(grad) over B examples (DP-SGD). `attack b`: gradient w.r.t. a dummy batch of "
             "b of the squared distance between its parameter gradient and a target (DLG's "
             "objective, second order); `V=8 shared` vmaps it over 8 instances with the same "
             "parameters (restarts), `V=8 own` with one parameter set each (victims). Error: "
             "max |float32 − float64| / max |float64| per output array (float64 through XLA's "
             "conv), worst array. The 10⁻³–10⁻² errors of the ReLU ConvNet at batch ≥ 32 and "
             "per example occur in both implementations (at B = 64 and per example), which "
             "fits ReLU inputs near 0 changing sign in float32; not investigated further.", "",
             "| model | input | workload | XLA conv | im2col | XLA / im2col | XLA error | "
             "im2col error |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        shape = "×".join(map(str, r["input_shape"]))
        lines.append(f"| {r['model']} | {shape} | {r['workload']} | {r['xla_ms']:.2f} | "
                     f"{r['im2col_ms']:.2f} | {r['xla_over_im2col']:.2f} | "
                     f"{r['xla_error_vs_f64']:.1e} | {r['im2col_error_vs_f64']:.1e} |")
    if result.get("end_to_end"):
        lines += ["", "## End to end: the attack suite's vmapped loops (seconds, after a compile "
                  "call)", "", "DLG: `attacks.dlg.run_many` (L-BFGS) on the DLG LeNet with the "
                  "reference code's U(−0.5, 0.5) init; GS: `attacks.inverting_gradients.run_many` "
                  "(Adam lr 0.1) on a width-8 ConvNet, reproduce_sun2021's quick GS setting. Same "
                  "victims, targets and attack key for both; the MSE columns (reconstruction vs "
                  "truth, per victim) show how close the two implementations' "
                  "reconstructions end up.", "",
                  "| attack | input | XLA conv | im2col | XLA / im2col | MSE to truth, XLA | "
                  "MSE to truth, im2col |", "|---|---|---|---|---|---|---|"]
        for r in result["end_to_end"]:
            x, i = r["xla"], r["im2col"]
            fmt = lambda v: " / ".join(f"{m:.3g}" for m in v)  # noqa: E731
            lines.append(f"| {r['attack']} | {'×'.join(map(str, r['input_shape']))} | "
                         f"{x['seconds']:.2f} | {i['seconds']:.2f} | "
                         f"{x['seconds'] / i['seconds']:.1f} | {fmt(x['mse'])} | "
                         f"{fmt(i['mse'])} |")
    lines += ["", "`fedsim.models.Conv` uses im2col on CPU for batches up to IM2COL_MAX_BATCH = "
                  f"{result['im2col_max_batch']} (per example under vmap)"
                  + ("" if "kernel_exceeds_input" not in result else
                     ", and for layers whose kernel exceeds their input (VGG's deep layers)")
                  + "."]
    return "\n".join(lines) + "\n"


def write_outputs(result, out):
    out.mkdir(parents=True, exist_ok=True)
    (out / "conv_im2col_cpu.json").write_text(json.dumps(result, indent=2))
    (out / "conv_im2col_cpu.md").write_text(render_markdown(result))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS, choices=list(SHAPES))
    ap.add_argument("--train-batches", nargs="+", type=int, default=[1, 4, 8, 32, 64])
    ap.add_argument("--per-example-batches", nargs="+", type=int, default=[64])
    ap.add_argument("--attack-instances", nargs="+", type=int, default=[1, 8],
                    help="V: 1 = one attack, not vmapped; V > 1 = vmap over V instances")
    ap.add_argument("--attack-batches", nargs="+", type=int, default=[1, 4],
                    help="b: the dummy batch each attack instance reconstructs")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--end-to-end", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the attack suite's DLG and GS loops (default: on)")
    ap.add_argument("--dlg-iterations", type=int, default=100)
    ap.add_argument("--gs-iterations", type=int, default=120)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--render", metavar="JSON",
                    help="only rewrite the markdown next to this results JSON")
    args = ap.parse_args(argv)
    if args.render:
        path = Path(args.render)
        result = read_or_exit(ap, path, "--render")
        path.with_suffix(".md").write_text(render_markdown(result))
        return result
    for name, values in (("--train-batches", args.train_batches),
                         ("--per-example-batches", args.per_example_batches),
                         ("--attack-instances", args.attack_instances),
                         ("--attack-batches", args.attack_batches)):
        if any(v < 1 for v in values):
            ap.error(f"{name} must be >= 1, got {values}")
    if min(args.dlg_iterations, args.gs_iterations) < 1:
        ap.error("--dlg-iterations and --gs-iterations must be >= 1")
    if args.reps < 1:
        ap.error(f"--reps must be >= 1, got {args.reps}")
    default_limit = models.IM2COL_MAX_BATCH  # each impl is forced inside a block, then restored
    load0 = os.getloadavg()[0]
    rows = []
    for name in args.models:
        for label, fn, fargs in workloads(name, args.train_batches, args.per_example_batches,
                                          args.attack_instances, args.attack_batches):
            med, err = time_pair(fn, fargs, args.reps)
            rows.append({"model": name, "input_shape": list(SHAPES[name]), "workload": label,
                         "xla_ms": med["xla"], "im2col_ms": med["im2col"],
                         "xla_over_im2col": med["xla"] / med["im2col"],
                         "xla_error_vs_f64": err["xla"], "im2col_error_vs_f64": err["im2col"]})
            print(json.dumps(rows[-1]), flush=True)
    e2e = []
    if args.end_to_end:
        for label, model, shape, attack, config in end_to_end_cases(args.dlg_iterations,
                                                                args.gs_iterations):
            res = end_to_end(model, shape, attack, config)
            e2e.append({"attack": label, "input_shape": list(shape), **res})
            print(json.dumps(e2e[-1]), flush=True)
    load1 = os.getloadavg()[0]
    commit = git_commit()  # HEAD, "-dirty" where the code differed
    device = (f"{jax.default_backend()} ({platform.machine()}, {os.cpu_count()} cpus), "
              f"jax {jax.__version__}")
    result = {"device": device, "commit": commit, "load_average_1min": [load0, load1],
              "argv": list(sys.argv[1:] if argv is None else argv),
              "reps": args.reps, "im2col_max_batch": default_limit,
              "kernel_exceeds_input": "im2col", "rows": rows,
              "end_to_end": e2e}
    write_outputs(result, Path(args.out))
    return result


if __name__ == "__main__":
    main()
