"""Does VGG-11 (no batch norm) leave chance in a short run? LeCun vs He init.

The registry's VGG had flax's default LeCun-normal convolutions until
2026-11-26; a quick ``reproduce_chu2023 --b-model vgg11`` run stayed at 0.100
test accuracy after 30 FedSGD rounds. This diagnostic trains VGG-11 centrally
(plain SGD, the same sampled batches and initial key for every setting) from
each init at each learning rate, and records the training loss and the test
accuracy every ``--every`` steps, plus the variance of the last
convolution's output at init (the signal that reaches the top of the stack). A FedSGD round
of part B (10 clients × batch 20, one step, weights averaged) is one such step
at batch 200 on IID data, which is why the default batch is 200.

Writes ``<out>/vgg_init.{json,md}``. Run as ``python -m benchmarks.diagnose_vgg_init``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.provenance import git_commit
from benchmarks.results_io import write_json_and_markdown
from fedsim import models
from fedsim.keys import experiment_key, numpy_generator

ROOT = Path(__file__).resolve().parents[1]
INITS = {"lecun": nn.initializers.lecun_normal(), "he": nn.initializers.he_normal()}


def build(init: str, model: str, num_classes: int) -> nn.Module:
    return models.VGG(cfg=models._VGG_CFG[model], num_classes=num_classes,
                      kernel_init=INITS[init])


def last_conv_variance(module, params, x) -> float:
    """Variance of the last convolution's output (pre-ReLU) on ``x``: how much of the
    input's signal reaches the top of the conv stack."""
    _, state = module.apply({"params": params}, x, capture_intermediates=True,
                            mutable=["intermediates"])
    convs = sorted((k for k in state["intermediates"] if k.startswith("Conv_")),
                   key=lambda k: int(k.split("_")[1]))
    return float(jnp.var(state["intermediates"][convs[-1]]["__call__"][0]))


def run(args, ds) -> list[dict]:
    key = experiment_key(args.seed, "diagnose_vgg_init/params")
    xt = jnp.asarray(ds.x_test[:args.test_examples])
    yt = jnp.asarray(ds.y_test[:args.test_examples])
    rows = []
    for init in args.inits:
        module = build(init, args.model, ds.num_classes)
        apply_fn = models.make_apply_fn(module)
        params0 = models.init_params(module, ds.input_shape, key)
        conv_var = last_conv_variance(module, params0, xt[:256])

        def loss(p, x, y):
            return optax.softmax_cross_entropy_with_integer_labels(apply_fn(p, x), y).mean()

        step = jax.jit(jax.value_and_grad(loss))
        accuracy = jax.jit(lambda p: jnp.mean(jnp.argmax(apply_fn(p, xt), -1) == yt))
        for lr in args.lrs:
            # The same batches for every (init, lr): one stream, restarted.
            rng = numpy_generator(args.seed, "diagnose_vgg_init/batches")
            params, curve, t0 = params0, [], time.perf_counter()
            for s in range(1, args.steps + 1):
                idx = rng.choice(len(ds.y_train), args.batch, replace=False)
                value, grads = step(params, jnp.asarray(ds.x_train[idx]),
                                    jnp.asarray(ds.y_train[idx]))
                if not np.isfinite(float(value)):
                    curve.append({"step": s, "loss": float(value), "accuracy": None})
                    break
                params = jax.tree.map(lambda a, g: a - lr * g, params, grads)
                if s % args.every == 0:
                    curve.append({"step": s, "loss": float(value),
                                  "accuracy": float(accuracy(params))})
            rows.append({"init": init, "lr": lr, "last_conv_variance_at_init": conv_var,
                         "curve": curve, "seconds": time.perf_counter() - t0})
            print(json.dumps({k: v for k, v in rows[-1].items()}), flush=True)
    return rows


def markdown(result) -> str:
    a = result["settings"]
    steps = list(range(a["every"], a["steps"] + 1, a["every"]))
    lines = [f"# {a['model']} without batch norm: LeCun vs He init, central SGD", "",
             f"`python -m benchmarks.diagnose_vgg_init {' '.join(result['argv'])}`".replace(
                 " `", "`") + f" at {result['commit']}, {result['seconds']:.0f} s. "
             f"{a['dataset']} at {a['image_size']}×{a['image_size']}, plain SGD, batch "
             f"{a['batch']}, {a['steps']} steps (the same batches and initial key for every "
             f"row); training loss of the step's batch and test accuracy on the first "
             f"{a['test_examples']} test images, every {a['every']} steps. Chance: loss "
             f"{np.log(result['num_classes']):.2f}, accuracy {1 / result['num_classes']:.2f}.",
             "", "| init | lr | last conv variance at init | "
             + " | ".join(f"step {k}" for k in steps) + " |",
             "|---|---|---|" + "---|" * len(steps)]
    for r in result["rows"]:
        # A diverged row ends with its non-finite step; its later columns stay empty.
        cells = [f"{c['loss']:.2f} / {c['accuracy']:.2f}" if c["accuracy"] is not None
                 else f"non-finite (step {c['step']})" for c in r["curve"]]
        cells += ["—"] * (len(steps) - len(cells))
        lines.append(f"| {r['init']} | {r['lr']:g} | {r['last_conv_variance_at_init']:.2e} "
                     f"| " + " | ".join(cells) + " |")
    lines += ["", "Cells: loss / accuracy. Last conv variance: variance of the last "
              "convolution's output (before its ReLU) over 256 test images, at init."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vgg11", choices=sorted(models._VGG_CFG))
    ap.add_argument("--inits", nargs="+", default=["lecun", "he"], choices=sorted(INITS))
    ap.add_argument("--lrs", type=float, nargs="+", default=[0.02, 0.1, 0.5])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--image-size", type=int, default=16)
    ap.add_argument("--test-examples", type=int, default=2000)
    ap.add_argument("--dataset", default="fashion_mnist")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    for name in ("steps", "every", "batch", "image_size", "test_examples"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.every > args.steps:
        ap.error(f"--every ({args.every}) must be at most --steps ({args.steps})")
    if any(lr <= 0 for lr in args.lrs):
        ap.error(f"--lrs must be > 0, got {args.lrs}")
    import fedsim.data
    try:
        # seed: the synthetic dataset's own (real data has none); 0, the seed
        # this script has always loaded it with.
        ds = fedsim.data.load_dataset(args.dataset, image_size=args.image_size, seed=0)
    except fedsim.data.DatasetError as e:
        ap.error(f"--dataset {args.dataset}: {e}")
    if args.batch > len(ds.y_train):
        ap.error(f"--batch {args.batch} exceeds the {len(ds.y_train)} training examples")
    commit, t0 = git_commit(), time.perf_counter()
    rows = run(args, ds)
    result = {"commit": commit, "argv": list(sys.argv[1:] if argv is None else argv),
              "seconds": time.perf_counter() - t0, "num_classes": ds.num_classes,
              "settings": {k: v for k, v in vars(args).items() if k != "out"}, "rows": rows}
    write_json_and_markdown(args.out, "vgg_init", result, markdown(result))
    return result


if __name__ == "__main__":
    main()
