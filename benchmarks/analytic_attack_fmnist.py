"""The closed-form input-layer attack on real Fashion-MNIST: how much of a batch it reads off.

What it measures, for ``attacks.analytic`` against McMahan et al.'s 2NN
(784-200-200-10, ReLU, biases) on FedSGD gradients of real Fashion-MNIST
28×28 batches:

1. **Batch size** (B = 1 … 128), at the initial model and after one epoch of
   SGD: the share of the batch's examples the attack returns exactly (a
   returned input within half an 8-bit level of the example in every pixel,
   checked against the truth, not taken from the attack's own flag), the
   slots it marks exact that are not, the matched PSNR, and two reference
   shares computed from the true first-layer activations: the examples with
   at least two exclusively activated units (what one pass of the attack's
   grouping rule is built to find), the closure of that count once the
   examples found are taken out of every unit (what the peeling rule is built
   to find), and the examples with at least one (what an exclusive-unit
   attack, e.g. Pan et al. 2022, can read). They are not strict ceilings: a
   unit that other examples reach with a vanishing δ gives one example's
   input to within rounding too. The attack runs twice, with peeling (its
   default) and with one pass (``peel: false``).
2. **Defenses** on the same victims at B = 1 and 8: per-example clipping
   alone and DP-SGD's Gaussian noise (``defenses.dp.dp_gaussian``, C = 1,
   σ = 1e-3 … 1), gradient compression (``defenses.pruning.magnitude_prune``,
   p = 0.5 … 0.99), and Soteria on the input layer
   (``defenses.soteria.soteria_gradient``, its exact score per example,
   p_fc = 0.01 … 0.4). There the representation Soteria prunes is the image
   itself, so the attack reads the image with the pruned pixels zeroed.
3. **The grouping tolerance**: recovered and falsely marked examples at
   ``match_tolerance`` 1e-3 … 1e-6, B = 4, 8, 16, with how far the marked
   groups' ratios spread (the measurement behind the default), for the
   gradient itself and for uploads Δ = w_local − w_global subtracted in
   float32 as the engine forms them: its FedSGD upload (one SGD step at lr
   0.1) and a FedAvg upload after 5 full-batch momentum-SGD steps at lr 0.05.
   The subtraction's rounding moves the ratios more than the gradient's. The
   gradient and the FedSGD upload are peeled (one step), the FedAvg upload is
   not; the peeling fit's relative residuals are recorded for the groups that
   are an example and for those that are not.
4. **Side by side with Inverting Gradients** (``attacks.inverting_gradients``,
   its defaults, ``--ig-iterations``) on the first ``--ig-victims`` victims at
   B = 1 and 8: PSNR and seconds per victim, in the same run.

Victims are drawn from training images the trained model did not train on;
every state and defense sees the same victims and the same noise keys.

Run:  python benchmarks/analytic_attack_fmnist.py [--quick] [--out DIR]
Writes ``analytic_attack_fmnist.{json,md,png}`` under ``--out``
(default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import pathlib
import sys
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from attacks import run_attack  # noqa: E402
from attacks.api import observation_from_gradient  # noqa: E402
from attacks.metrics import score_batch  # noqa: E402
from benchmarks.provenance import git_state  # noqa: E402
from benchmarks.results_io import write_json_and_markdown  # noqa: E402
from defenses.dp import dp_gaussian  # noqa: E402
from defenses.pruning.gc import magnitude_prune  # noqa: E402
from defenses.soteria import soteria_gradient  # noqa: E402
from fedsim.client import masked_mean_loss  # noqa: E402
from fedsim.data import Dataset, load_dataset  # noqa: E402
from fedsim.hooks import DefenseContext  # noqa: E402
from fedsim.models import build_model, init_params, make_apply_fn  # noqa: E402
from fedsim.typing import Observation  # noqa: E402

NAME = "analytic_attack_fmnist"
# A returned input within half an 8-bit level of an example in every pixel recovers it: the
# 8-bit image is then read exactly.
EXACT_PIXEL_ERROR = 0.5 / 255
CLIP_NORM = 1.0


def train_one_epoch(apply_fn, params, x, y, batch: int, lr: float, key):
    """One epoch of plain SGD (the "trained" model the victims did not train on)."""
    steps = len(y) // batch
    order = np.asarray(jax.random.permutation(key, len(y)))[:steps * batch].reshape(steps, batch)
    opt = optax.sgd(lr)

    @jax.jit
    def epoch(p):
        def step(carry, idx):
            p, s = carry
            g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, p, x[idx], y[idx],
                                                      jnp.ones(batch))
            u, s = opt.update(g, s, p)
            return (optax.apply_updates(p, u), s), None
        return jax.lax.scan(step, (p, opt.init(p)), jnp.asarray(order))[0][0]

    return epoch(params)


def accuracy(apply_fn, params, x, y) -> float:
    logits = jax.jit(apply_fn)(params, jnp.asarray(x))
    return float(np.mean(np.argmax(np.asarray(logits), -1) == y))


@functools.partial(jax.jit, static_argnums=0)
def _per_example_gradients(apply_fn, params, x, y):
    def one(xi, yi):
        return jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, xi[None], yi[None],
                                                     jnp.ones(1))
    return jax.vmap(one)(x, y)


def per_example_gradients(apply_fn, params, x, y):
    """[B, ...] per-example gradients (the rows DP-SGD clips), one vmapped grad
    (compiled once per batch size)."""
    return _per_example_gradients(apply_fn, params, jnp.asarray(x), jnp.asarray(y))


def exclusive_unit_shares(params, x) -> tuple[float, float, float]:
    """Shares of examples with ≥ 1 and ≥ 2 first-layer ReLU units active on them alone,
    and of the closure of the second: an example counts once it has two units that no
    example not yet counted reaches."""
    layer = params["Dense_0"]
    z = np.asarray(x).reshape(len(x), -1) @ np.asarray(layer["kernel"]) + np.asarray(layer["bias"])
    active = z > 0
    per_example = (active & (active.sum(0) == 1)[None, :]).sum(1)
    found = np.zeros(len(x), bool)
    while True:
        rest = active & ~found[:, None]
        new = ~found & ((rest & (rest.sum(0) == 1)[None, :]).sum(1) >= 2)
        if not new.any():
            break
        found |= new
    return (float(np.mean(per_example >= 1)), float(np.mean(per_example >= 2)),
            float(np.mean(found)))


def recovered(x_rec, x_true, exact_flags) -> tuple[int, np.ndarray]:
    """(examples returned within EXACT_PIXEL_ERROR, [B] slots marked exact that are not)."""
    b = len(x_true)
    err = np.abs(x_true.reshape(b, 1, -1) - x_rec.reshape(1, b, -1)).max(-1)  # [true, slot]
    hits = err <= EXACT_PIXEL_ERROR
    return int(hits.any(1).sum()), np.asarray(exact_flags) & ~hits.any(0)


def pixels_exact(x_rec, x_true) -> float:
    """Mean over the batch's examples of the largest share of an example's pixels that
    one returned input gives within EXACT_PIXEL_ERROR (an example partly read off)."""
    b = len(x_true)
    close = np.abs(x_true.reshape(b, 1, -1) - x_rec.reshape(1, b, -1)) <= EXACT_PIXEL_ERROR
    return float(np.mean(close.mean(-1).max(1)))


def defenses(args) -> list[tuple[str, str, float]]:
    rows = [("none", "none", 0.0), ("dp_gaussian", "clip only (σ = 0)", 0.0)]
    rows += [("dp_gaussian", f"σ = {s:g}", s) for s in args.sigmas]
    rows += [("gc", f"p = {p:g}", p) for p in args.gc_rates]
    rows += [("soteria", f"p_fc = {p:g}", p) for p in args.soteria_rates]
    return rows


@functools.partial(jax.jit, static_argnums=(0, 5))
def _soteria(apply_fn, params, grad, x, y, p_fc: float):
    """Soteria (paper 003 Alg 1–2, its exact score, per example) on the 2NN's input
    layer, whose representation is the flattened image itself."""
    context = DefenseContext(params=params, x=x, y=y, apply_fn=apply_fn)
    return soteria_gradient(grad, context, p_fc, layer="Dense_0")[0]


def defended_gradient(kind: str, param: float, apply_fn, params, x, y, key):
    per_example = per_example_gradients(apply_fn, params, x, y)
    if kind == "dp_gaussian":
        return dp_gaussian(param, CLIP_NORM, "flat").apply(per_example, (), key=key)[0]
    mean = jax.tree_util.tree_map(lambda g: jnp.mean(g, 0), per_example)
    if kind == "soteria":
        return _soteria(apply_fn, params, mean, jnp.asarray(x), jnp.asarray(y), param)
    return magnitude_prune(mean, param) if kind == "gc" else mean


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _local_update(apply_fn, params, x, y, lr: float, steps: int):
    opt = optax.sgd(lr, momentum=0.9)

    def step(carry, _):
        p, s = carry
        g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, p, x, y, jnp.ones(len(y)))
        u, s = opt.update(g, s, p)
        return (optax.apply_updates(p, u), s), None

    p = jax.lax.scan(step, (params, opt.init(params)), None, length=steps)[0][0]
    return jax.tree_util.tree_map(lambda a, b: a - b, p, params)


def fedavg_observation(apply_fn, params, x, y, num_classes, lr: float, steps: int):
    """An upload Δ = w_local − w_global (float32, as the engine forms it) after
    ``steps`` full-batch momentum-SGD steps on the victim's batch (one step: the
    engine's FedSGD upload, observed as FedAvg with one local step)."""
    delta = _local_update(apply_fn, params, jnp.asarray(x), jnp.asarray(y), lr, steps)
    return Observation(update=delta, params=params, apply_fn=apply_fn, algorithm="fedavg",
                       lr=lr, local_steps=steps, batch_size=len(y), num_examples=len(y),
                       labels=None, input_shape=tuple(x.shape[1:]), num_classes=num_classes)


def attack_one(name, config, apply_fn, params, grad, x, y, key, num_classes, obs=None):
    """Attack one victim (a FedSGD observation of ``grad``, or ``obs``) and score it."""
    if obs is None:
        obs = observation_from_gradient(grad, params, apply_fn, input_shape=x.shape[1:],
                                        num_classes=num_classes, lr=0.1, batch_size=len(y))
    t0 = time.perf_counter()
    rec = run_attack(name, obs, config, key)
    x_rec = np.asarray(rec.x)
    seconds = time.perf_counter() - t0
    score = score_batch(x_rec, x, np.asarray(rec.labels), y)
    extras = rec.extras or {}
    flags = np.asarray(extras.get("exact", np.zeros(len(y), bool)))
    hits, false_slots = recovered(x_rec, x, flags)
    # group slots (≥ 2 agreeing units), marked exact or not (a failed peeling fit)
    groups = np.asarray(extras.get("group_sizes", np.zeros(len(y), int))) > 0
    false_groups = recovered(x_rec, x, groups)[1]
    spreads = np.asarray(extras.get("group_spreads", np.full(len(y), np.nan)))
    peel_fit = np.asarray(extras.get("peel_residuals", np.full(len(y), np.nan)))
    tried = groups & ~np.isnan(peel_fit)
    return {"psnr": score.psnr, "ssim": score.ssim, "label_acc": score.label_acc,
            "recovered": hits, "pixels_exact": pixels_exact(x_rec, x),
            "marked_exact": int(np.sum(flags)), "groups": int(np.sum(groups)),
            "false_exact": int(np.sum(false_slots)), "seconds": seconds,
            # how closely each group's ratios agreed, for groups that are / are not
            # an example
            "spreads_true": spreads[groups & ~false_groups].tolist(),
            "spreads_false": spreads[false_groups].tolist(),
            "peeled": int(np.sum(extras.get("peeled", np.zeros(len(y), bool)))),
            "passes": int(np.max(extras.get("found_in_pass", np.zeros(1, int)))) + 1,
            # the peeling fit's relative residual, for groups that are / are not an example
            "peel_fit_true": peel_fit[tried & ~false_groups].tolist(),
            "peel_fit_false": peel_fit[tried & false_groups].tolist()}


class Setup(NamedTuple):
    """The model, its two states, the victims and the keys every part of a run shares."""

    ds: Dataset
    apply_fn: Callable
    states: dict  # "initial" and "trained" parameters
    victim: Callable  # victim(B, v) -> (x [B, ...], y [B]), images the model did not train on
    noise_key: jax.Array
    attack_key: jax.Array


def setup(dataset: str, seed: int, train_examples: int, largest_batch: int,
          name: str = NAME) -> Setup:
    """Load ``dataset``, train the 2NN one epoch on its first ``train_examples`` images,
    and draw victims from the rest (one key per (B, v)), all from ``seed``.

    Raises:
      SystemExit: naming ``name`` where the rest holds fewer than ``largest_batch`` images.
    """
    ds = load_dataset(dataset, seed=seed)
    x_all, y_all = ds.x_train, ds.y_train.astype(np.int32)
    if train_examples + largest_batch > len(y_all):
        raise SystemExit(f"{name}: --train-examples {train_examples} leaves fewer than "
                         f"{largest_batch} images for the victims")
    model = build_model("mlp_2nn", ds.num_classes)
    apply_fn = make_apply_fn(model)
    init_key, train_key, victim_key, noise_key, attack_key = jax.random.split(
        jax.random.key(seed), 5)
    params0 = init_params(model, x_all.shape[1:], init_key)
    n = train_examples
    train_x, train_y = jnp.asarray(x_all[:n]), jnp.asarray(y_all[:n])
    states = {"initial": params0,
              "trained": train_one_epoch(apply_fn, params0, train_x, train_y, 64, 0.1, train_key)}
    pool_x, pool_y = x_all[n:], y_all[n:]

    def victim(b, v):
        idx = np.asarray(jax.random.permutation(jax.random.fold_in(victim_key, 1000 * b + v),
                                                len(pool_y)))[:b]
        return pool_x[idx], pool_y[idx]

    return Setup(ds, apply_fn, states, victim, noise_key, attack_key)


def run(args) -> dict:
    ds, apply_fn, states, victim, noise_key, attack_key = setup(
        args.dataset, args.seed, args.train_examples, max(args.batch_sizes))
    test_acc = {s: accuracy(apply_fn, p, ds.x_test, ds.y_test) for s, p in states.items()}

    rows = []
    for state, params in states.items():
        for b in args.batch_sizes:
            defended = b in args.defense_batch_sizes
            for kind, label, param in (defenses(args) if defended else [("none", "none", 0.0)]):
                per_victim = []
                for v in range(args.victims):
                    x, y = victim(b, v)
                    k = jax.random.fold_in(jax.random.fold_in(noise_key, b), v)
                    grad = defended_gradient(kind, param, apply_fn, params, x, y, k)
                    r = attack_one("analytic", {}, apply_fn, params, grad, x, y,
                                   jax.random.fold_in(attack_key, v), ds.num_classes)
                    if kind == "none":
                        r["exclusive_1"], r["exclusive_2"], r["closure_2"] = \
                            exclusive_unit_shares(params, x)
                        one = attack_one("analytic", {"peel": False}, apply_fn, params, grad,
                                         x, y, jax.random.fold_in(attack_key, v),
                                         ds.num_classes)
                        r["recovered_one_pass"] = one["recovered"]
                        r["false_exact_one_pass"] = one["false_exact"]
                        r["label_acc_one_pass"] = one["label_acc"]
                    per_victim.append(r)
                rows.append(summarise(state, b, kind, label, param, per_victim))
                print(f"{state} B={b} {kind} {label}: recovered "
                      f"{rows[-1]['recovered_share']:.3f}", flush=True)

    tolerance = []
    # (name, local steps, lr): the gradient itself, and uploads Δ = w_local − w_global
    # subtracted in float32 as the engine forms them (its FedSGD upload is one step)
    protocols = (("gradient", 0, 0.0), ("fedsgd Δ", 1, 0.1),
                 (f"fedavg Δ, {args.fedavg_steps} steps", args.fedavg_steps, args.fedavg_lr))
    for state, params in states.items():
        for b, (protocol, steps, lr) in itertools.product(args.tolerance_batch_sizes, protocols):
            batches = [victim(b, v) for v in range(args.victims)]
            if steps == 0:
                uploads = [(defended_gradient("none", 0.0, apply_fn, params, x, y, None), None)
                           for x, y in batches]
            else:
                uploads = [(None, fedavg_observation(apply_fn, params, x, y, ds.num_classes,
                                                     lr, steps))
                           for x, y in batches]
            for tol in args.tolerances:
                per_victim = [attack_one("analytic", {"match_tolerance": tol}, apply_fn, params,
                                         grad, x, y, jax.random.fold_in(attack_key, v),
                                         ds.num_classes, obs)
                              for v, ((x, y), (grad, obs)) in enumerate(zip(batches, uploads))]
                tolerance.append({"state": state, "batch_size": b, "protocol": protocol,
                                  "match_tolerance": tol,
                                  **{k: sum(r[k] for r in per_victim)
                                     for k in ("recovered", "groups", "marked_exact",
                                               "false_exact", "peeled")},
                                  "examples": b * len(per_victim),
                                  "spreads_true": sum((r["spreads_true"] for r in per_victim), []),
                                  "spreads_false": sum((r["spreads_false"] for r in per_victim),
                                                       []),
                                  **{k: sum((r[k] for r in per_victim), [])
                                     for k in ("peel_fit_true", "peel_fit_false")}})

    reference = []
    for state, params in states.items():
        for b in args.ig_batch_sizes:
            for name, config in (("analytic", {}),
                                 ("inverting_gradients", {"iterations": args.ig_iterations})):
                per_victim = []
                for v in range(args.ig_victims):
                    x, y = victim(b, v)
                    grad = defended_gradient("none", 0.0, apply_fn, params, x, y, None)
                    per_victim.append(attack_one(name, config, apply_fn, params, grad, x, y,
                                                 jax.random.fold_in(attack_key, v),
                                                 ds.num_classes))
                reference.append({"state": state, "batch_size": b, "attack": name,
                                  "victims": per_victim,
                                  **{k: float(np.median([r[k] for r in per_victim]))
                                     for k in ("psnr", "seconds")}})
                print(f"{state} B={b} {name}: median PSNR {reference[-1]['psnr']:.1f} dB",
                      flush=True)
    return {"setting": {k: v for k, v in vars(args).items() if k != "out"},
            "model": "mlp_2nn", "test_accuracy": test_acc, "clip_norm": CLIP_NORM,
            "exact_pixel_error": EXACT_PIXEL_ERROR, "rows": rows, "tolerance": tolerance,
            "reference": reference,
            "device": jax.devices()[0].device_kind, **git_state(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def summarise(state, b, kind, label, param, per_victim) -> dict:
    n = len(per_victim) * b
    row = {"state": state, "batch_size": b, "defense": kind, "setting": label, "param": param,
           "victims": per_victim,
           "recovered_share": sum(r["recovered"] for r in per_victim) / n,
           "false_exact": sum(r["false_exact"] for r in per_victim),
           "pixels_exact": float(np.mean([r["pixels_exact"] for r in per_victim])),
           "median_psnr": float(np.median([r["psnr"] for r in per_victim])),
           "median_ms": 1e3 * float(np.median([r["seconds"] for r in per_victim]))}
    if kind == "none":
        for k in ("exclusive_1", "exclusive_2", "closure_2"):
            row[k] = float(np.mean([r[k] for r in per_victim]))
        row["recovered_share_one_pass"] = sum(r["recovered_one_pass"] for r in per_victim) / n
        row["false_exact_one_pass"] = sum(r["false_exact_one_pass"] for r in per_victim)
        for k in ("label_acc", "label_acc_one_pass"):
            row[k] = float(np.mean([r[k] for r in per_victim]))
    row["peeled_share"] = sum(r["peeled"] for r in per_victim) / n
    row["max_passes"] = max(r["passes"] for r in per_victim)
    return row


def markdown(result: dict) -> str:
    s = result["setting"]
    acc = result["test_accuracy"]
    lines = [
        "# The closed-form input-layer attack on Fashion-MNIST (`attacks.analytic`)", "",
        f"Written by `benchmarks/analytic_attack_fmnist.py` on {result['date']} "
        f"({result['device']}, commit {result.get('commit', '?')}"
        f"{', dirty' if result.get('dirty') else ''}). Model: McMahan et al.'s 2NN "
        f"(784-200-200-10 ReLU, biases), FedSGD gradients of {s['dataset']} batches; "
        f"{s['victims']} victims per batch size, seed {s['seed']}. Test accuracy: "
        f"{acc['initial']:.4f} at the initial model, {acc['trained']:.4f} after one epoch of "
        f"SGD on the first {s['train_examples']} training images (the victims are drawn from "
        "the others).", "",
        f"*Recovered*: a returned input within {result['exact_pixel_error']:.3g} (half an 8-bit "
        "level) of the example in every pixel, checked against the truth; *one pass*: the "
        "attack without peeling (`peel: false`). *Exclusive ≥ 2 / ≥ 1*: the share of "
        "examples with at least two / one first-layer units active on them alone, from the "
        "true activations: what one pass is built to find / what an exclusive-unit attack "
        "can read; *closure*: the examples counted once the examples counted so far are "
        "taken out of every unit, what peeling is built to find (not strict ceilings: a "
        "unit that other examples reach with a vanishing δ also gives one input to within "
        "rounding). *Passes*: the most passes one victim took. *Label accuracy*: the "
        "mean over victims of the share of the batch's label multiset the attack returns "
        "(with peeling a peeled slot's label is its fitted class, the others come from "
        "the count-based inference; one pass: the count-based inference alone). "
        "*False exact*: slots the attack marked exact (with peeling: groups whose "
        "peeling fit passed) that "
        "match no example. PSNR: the median over victims of the batch's matched mean "
        "(capped at 100 dB per image).", "",
        "## Batch size, no defense", "",
        "| model | B | recovered | closure | passes | recovered, one pass | exclusive ≥ 2 | "
        "exclusive ≥ 1 | false exact | false exact, one pass | label accuracy | "
        "label accuracy, one pass | median PSNR (dB) | median ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if r["defense"] == "none":
            lines.append(f"| {r['state']} | {r['batch_size']} | {r['recovered_share']:.3f} | "
                         f"{r['closure_2']:.3f} | {r['max_passes']} | "
                         f"{r['recovered_share_one_pass']:.3f} | "
                         f"{r['exclusive_2']:.3f} | {r['exclusive_1']:.3f} | "
                         f"{r['false_exact']} | {r['false_exact_one_pass']} | "
                         f"{r['label_acc']:.3f} | {r['label_acc_one_pass']:.3f} | "
                         f"{r['median_psnr']:.1f} | {r['median_ms']:.0f} |")
    lines += ["", f"## Defenses (per-example clip C = {result['clip_norm']:g}; GC prunes the "
              "whole model's smallest gradient entries; Soteria prunes the input layer's "
              "representation, here the image)", "",
              "*Pixels exact*: per example, the largest share of its pixels one returned input "
              "gives within half a level, averaged.", "",
              "| model | B | defense | setting | recovered | pixels exact | peeled | "
              "false exact | median PSNR (dB) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if r["batch_size"] in s["defense_batch_sizes"]:
            lines.append(f"| {r['state']} | {r['batch_size']} | {r['defense']} | {r['setting']} "
                         f"| {r['recovered_share']:.3f} | {r['pixels_exact']:.3f} | "
                         f"{r['peeled_share']:.3f} | "
                         f"{r['false_exact']} | {r['median_psnr']:.1f} |")
    lines += ["", "## The grouping tolerance (`match_tolerance`), no defense", "",
              "Two units' ratios are grouped when their relative distance is below the "
              "tolerance. *Groups (false)*: groups of ≥ 2 agreeing units, and in brackets "
              "those that match no example, marked or not. *Spread*: how far a group's "
              "ratios lie from its estimate (relative), for the groups that are an example "
              "and for those that are not. *Peel fit*: the relative residual of the peeling "
              "rule's class-and-scale fit, likewise; a group is peeled and marked exact where "
              "it is ≤ `peel_tolerance` (1e-3). The FedAvg upload is not peeled, and there "
              "every group is marked.", "",
              "| model | B | upload | tolerance | recovered | groups (false) | marked exact | "
              "false exact | largest spread, true groups | smallest spread, false groups | "
              "largest peel fit, true groups | smallest peel fit, false groups |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def extreme(values, pick):
        return f"{pick(values):.2g}" if values else "–"

    for r in result["tolerance"]:
        lines.append(f"| {r['state']} | {r['batch_size']} | {r['protocol']} | "
                     f"{r['match_tolerance']:g} | "
                     f"{r['recovered']}/{r['examples']} | "
                     f"{r['groups']} ({len(r['spreads_false'])}) | "
                     f"{r['marked_exact']} | {r['false_exact']} | "
                     f"{extreme(r['spreads_true'], max)} | {extreme(r['spreads_false'], min)} | "
                     f"{extreme(r['peel_fit_true'], max)} | "
                     f"{extreme(r['peel_fit_false'], min)} |")
    lines += ["", f"## Side by side with Inverting Gradients ({s['ig_iterations']} iterations, "
              f"its defaults otherwise; first {s['ig_victims']} victims, same run)", "",
              "| model | B | attack | median PSNR (dB) | median seconds per victim |",
              "|---|---|---|---|---|"]
    for r in result["reference"]:
        lines.append(f"| {r['state']} | {r['batch_size']} | {r['attack']} | {r['psnr']:.1f} | "
                     f"{r['seconds']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for state, colour in (("initial", "C0"), ("trained", "C1")):
        rows = [r for r in result["rows"] if r["state"] == state and r["defense"] == "none"]
        bs = [r["batch_size"] for r in rows]
        ax.plot(bs, [r["recovered_share"] for r in rows], "o-", color=colour,
                label=f"{state}: recovered (peeling)")
        ax.plot(bs, [r["recovered_share_one_pass"] for r in rows], "s-", color=colour,
                alpha=0.5, label=f"{state}: recovered (one pass)")
        ax.plot(bs, [r["exclusive_2"] for r in rows], "--", color=colour,
                label=f"{state}: ≥ 2 exclusive units")
        ax.plot(bs, [r["exclusive_1"] for r in rows], ":", color=colour,
                label=f"{state}: ≥ 1 exclusive unit")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("share of the batch")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("closed-form attack on the 2NN's input layer (Fashion-MNIST)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="5 victims, B up to 32, 200 IG iterations on 2 victims")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--dataset", default="fashion_mnist")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--victims", type=int, default=None)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    ap.add_argument("--defense-batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--sigmas", type=float, nargs="+", default=[1e-3, 1e-2, 1e-1, 1.0])
    ap.add_argument("--gc-rates", type=float, nargs="+", default=[0.5, 0.9, 0.99])
    ap.add_argument("--soteria-rates", type=float, nargs="+", default=[0.01, 0.1, 0.4],
                    help="Soteria's p_fc on the input layer (paper 003 Table 2: 1-40 %% vs DLG)")
    ap.add_argument("--train-examples", type=int, default=50_000)
    ap.add_argument("--tolerance-batch-sizes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--tolerances", type=float, nargs="+", default=[1e-3, 1e-4, 1e-5, 1e-6])
    ap.add_argument("--fedavg-steps", type=int, default=5,
                    help="local full-batch momentum-SGD steps of the tolerance part's FedAvg rows")
    ap.add_argument("--fedavg-lr", type=float, default=0.05)
    ap.add_argument("--ig-batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--ig-victims", type=int, default=None)
    ap.add_argument("--ig-iterations", type=int, default=None)
    args = ap.parse_args(argv)
    quick = args.quick
    for name, full, short in (("victims", 25, 5), ("ig_victims", 5, 2),
                              ("ig_iterations", 1000, 200),
                              ("batch_sizes", [1, 2, 4, 8, 16, 32, 64, 128],
                               [1, 2, 4, 8, 16, 32])):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else full)
    if args.victims > 1000:
        # victim v of batch size B is drawn with fold_in(key, 1000·B + v)
        ap.error("--victims must be <= 1000 (victims of different batch sizes would share keys)")
    if not args.fedavg_lr > 0:
        ap.error("--fedavg-lr must be > 0")
    for name in ("victims", "ig_victims", "ig_iterations", "train_examples", "fedavg_steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if any(b < 1 for b in args.batch_sizes + args.ig_batch_sizes + args.tolerance_batch_sizes):
        ap.error("batch sizes must be >= 1")
    missing = set(args.defense_batch_sizes) - set(args.batch_sizes)
    if missing:
        ap.error(f"--defense-batch-sizes {sorted(missing)} are not in --batch-sizes")
    if any(not s > 0 for s in args.sigmas) or any(
            not 0 <= p <= 1 for p in args.gc_rates + args.soteria_rates):
        ap.error("--sigmas must be > 0, --gc-rates and --soteria-rates in [0, 1]")
    if any(not t > 0 for t in args.tolerances):
        ap.error("--tolerances must be > 0")
    result = run(args)
    out = pathlib.Path(args.out)
    name = NAME + ("_quick" if quick else "")
    write_json_and_markdown(out, name, result, markdown(result))
    plot(result, out / f"{name}.png")
    return result


if __name__ == "__main__":
    main()
