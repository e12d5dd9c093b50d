"""Reproduce Soteria (Sun et al. 2021, papers 003/004) on Fashion-MNIST.

Parts (each row of the output produced by this script in one run, seeds
recorded in the JSON):

1. ``cor`` table (Table 1): class-wise representation inference (App. A,
   Alg 3–4) from FedAvg uploads of LeNet-5 (the paper's Conv-6-16 /
   FC-120-84-10 base model) under E ∈ {1,5,10}, B ∈ {8,16,32}, non-IID
   (2 classes × 100 samples per client) and IID.
2. Utility–privacy (Fig 5–6): for no defense, Soteria (p_fc), GC (p_model),
   DP-Gaussian / DP-Laplace (σ) — test accuracy of FedAvg trained with the
   defense (100 clients non-IID, 10 per round, E = 1, B = 32, SGD) and the
   MSE/PSNR of DLG (LeNet, L-BFGS 300 it) and GS (ConvNet, Adam lr 0.1,
   120 it) against a single example's defended upload (batch 1, one local
   SGD step at the initial model).
3. Convergence (Fig 7): logistic regression + FedAvg with Soteria.

Usage:
  python benchmarks/reproduce_sun2021.py --quick   # the committed results
  python benchmarks/reproduce_sun2021.py           # full (hours on CPU)

Outputs ``benchmarks/results/sun2021.json``, ``.md`` and PNGs (the JSON's and
markdown's ``mode`` says which mode produced them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attacks import dlg, inverting_gradients  # noqa: E402
from attacks.api import observation_from_gradient  # noqa: E402
from attacks.metrics import mse as mse_metric, psnr as psnr_metric  # noqa: E402
from attacks.representation import (fc_kernels, infer_classes, infer_representations,  # noqa: E402
                                    representation_correlation)
from defenses.dp.update_noise import update_gaussian, update_laplace  # noqa: E402
from defenses.pruning import magnitude_prune  # noqa: E402
from defenses.soteria import representation, soteria, soteria_gradient  # noqa: E402
from fedsim.client import masked_mean_loss  # noqa: E402
from fedsim.config import load_config  # noqa: E402
from fedsim.hooks import Defense, DefenseContext  # noqa: E402
from fedsim.models import MODEL_REGISTRY, ConvNet, LeNetDLG, register_model  # noqa: E402
from fedsim.simulation import Simulation  # noqa: E402

PAPER = {
    "cor_table1_cifar10": {
        "E=1,B=32": [0.98, 0.99, 0.99], "E=5,B=32": [0.82, 0.90, 0.92],
        "E=10,B=32": [0.70, 0.78, 0.82], "E=1,B=16": [0.82, 0.93, 0.99],
        "E=1,B=8": [0.85, 0.89, 0.92], "E=1,B=32 (IID)": [0.48, 0.31, 0.18]},
    "headline": "Soteria MSE up to >160x that of GC / DP-Gaussian / DP-Laplace at no "
                "accuracy loss (DLG and GS, MNIST and CIFAR-10)",
    "table2_ranges": {"gc_p_model": "1-80 % (DLG) / 1-90 % (GS)", "dp_sigma": "1e-4 - 1e-1",
                      "soteria_p_fc": "1-40 % (DLG) / 1-80 % (GS)"},
}


COMMON_NOTES = [
    "Fashion-MNIST instead of MNIST / CIFAR-10 (offline machine).",
    "Attacks: victims are test images drawn with the seed; the attacked upload is that "
    "example's gradient at the initial model (unit lr, FedSGD), with GC / DP noise applied to "
    "the gradient and Soteria to the FC layer (exact score, per example, exact Jacobian). DLG: "
    "L-BFGS 300 it, iDLG labels, no box; GS: Inverting Gradients (cosine, TV 1e-6 = the "
    "project default, signed "
    "Adam lr 0.1, 120 it, box).",
    "DLG model: the DLG LeNet with the DLG / Soteria reference code's U(-0.5, 0.5) weight "
    "init (`lenet_dlginit`): with flax's default init it stayed at 10 % test accuracy for 60 "
    "rounds at lr 0.5 and 1.0 (even IID), so no accuracy comparison was possible.",
    "Accuracy: FedAvg, 100 non-IID clients (2 classes × 100 samples), 10 per round, E = 1, "
    "B = 32, SGD lr 0.3 (paper 0.01: with the U(-0.5, 0.5) init lr 0.01 is still at 10 % "
    "after 60 rounds here, lr 0.1 at 52 %, lr 0.3 at 58 %); accuracy = mean test accuracy "
    "of the last 5 rounds (non-IID FedAvg oscillates), same rule and same seed (init, client "
    "sampling) for every defense. Training GC / DP act on the client update Δ (stage "
    "upload), the attack's on the gradient, so equal σ is not equal noise-to-signal in the "
    "two.",
    "cor: LeNet-5 (the paper's Conv-6-16/FC-120-84-10 base model), SGD lr 0.01; cor = "
    "Pearson correlation of r̂ with the true mean class representation at the round's global "
    "model; M = 5 (Alg 4).",
    "Logistic regression (Fig 7): 28×28 Fashion-MNIST, non-IID as above, B = 32, SGD lr 0.1 "
    "(the paper follows [27]; its lr is not given), ε = 50 of 784 features (paper's ε).",
]

NOTES = {
    "quick": COMMON_NOTES + [
        "Quick mode: 16×16 images; 2 victims per grid point; 80 training rounds; cor from 1 "
        "round × 5 clients per setting (paper: 200 rounds, CIFAR-10); logistic regression 20 "
        "rounds, E = 5, K = 10 only.",
        "Quick mode trains Soteria with SKETCHED Jacobian row norms (16 random forward-mode "
        "probes, `jacobian=\"sketch\"`, an approximation of the exact score: ~7× a plain step "
        "instead of ~100×, benchmarks/results/soteria_speed.md); its accuracies are those of "
        "that approximation. The attacked uploads use the exact defense.",
        "GS model: the ConvNet at width 16 (paper: 32) to fit the CPU budget; its test accuracy "
        "is NOT measured in quick mode (a plain ConvNet round costs ~5 s and a Soteria round "
        "~40 s even sketched, on 2 shared cores), so the GS equal-accuracy check is not "
        "evaluated in quick mode.",
    ],
    "full": COMMON_NOTES + [
        "Full mode: 28×28 images, 8 victims, 200 rounds, ConvNet width 32 with accuracy "
        "measured, exact Jacobian in training, cor over 20 rounds × 10 clients, logistic "
        "regression E ∈ {5, 10} × K ∈ {5, 10}, 100 rounds (hours of CPU; not run on this "
        "machine so far).",
    ],
}


def render(json_path):
    """Re-render the markdown and trade-off / convergence PNGs from a results JSON."""
    res = json.loads(Path(json_path).read_text())
    out_dir, stem = Path(json_path).parent, Path(json_path).stem
    write_markdown(res, out_dir / f"{stem}.md")
    plot(res, {}, out_dir, stem)


class LogisticRegression(nn.Module):
    """Multinomial logistic regression (paper 003 §6.4 / Fig 7)."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))


if "logreg" not in MODEL_REGISTRY:
    register_model("logreg")(LogisticRegression)
if "lenet_dlginit" not in MODEL_REGISTRY:
    # The DLG LeNet with the reference code's U(-0.5, 0.5) init: with flax's
    # default init it stays at chance in FedAvg (measured, see NOTES).
    register_model("lenet_dlginit")(
        lambda num_classes=10: LeNetDLG(num_classes=num_classes, init_scale=0.5))


def convnet_factory(width):
    name = f"convnet_w{width}"
    if name not in MODEL_REGISTRY:
        register_model(name)(lambda num_classes=10: ConvNet(num_classes=num_classes, width=width))
    return name


def make_cfg(args, model, rounds, *, partition="shards", E=1, B=32, name="sun2021", lr=None,
             image_size=None, clients_per_round=10):
    overrides = {
        "name": name, "seed": args.seed, "data.dataset": "fashion_mnist",
        "data.image_size": image_size or args.image_size, "data.num_clients": 100,
        "data.partition": partition, "data.classes_per_client": 2,
        "data.examples_per_client": 100, "model.name": model,
        "training.rounds": rounds, "training.clients_per_round": clients_per_round,
        "training.local_epochs": E, "training.batch_size": B, "training.lr": lr or args.lr,
        "training.optimizer": "sgd", "training.client_parallelism": "loop",
        "eval.every": 1, "output.progress": False, "output.plots": False,
        "output.dir": "/tmp/sun2021_runs",
    }
    if partition == "iid":
        overrides.pop("data.classes_per_client")
    return load_config(None, [f"{k}={v}" for k, v in overrides.items()])


# ---------------------------------------------------------------- 1. cor ----

def cor_table(args, log):
    settings = [("E=1,B=32", 1, 32, "shards"), ("E=5,B=32", 5, 32, "shards"),
                ("E=10,B=32", 10, 32, "shards"), ("E=1,B=16", 1, 16, "shards"),
                ("E=1,B=8", 1, 8, "shards"), ("E=1,B=32 (IID)", 1, 32, "iid")]
    layers = [("Dense_0",), ("Dense_1",), ("Dense_2",)]
    rows = []
    for label, E, B, part in settings:
        t0 = time.perf_counter()
        cfg = make_cfg(args, "lenet5", args.cor_rounds, partition=part, E=E, B=B)
        sim = Simulation(cfg)
        state = sim.init_state()
        update_fn = jax.jit(sim.client_update)
        cors = [[], [], []]
        class_hits = []
        for rnd in range(args.cor_rounds):
            ids = sim.cohort(rnd)
            for cid in ids[: args.cor_clients]:
                data = sim.client_data(int(cid))
                cstate = jax.tree_util.tree_map(lambda s: s[int(cid)], state.client_states)
                out = update_fn(state.params, data, cstate,
                                jax.random.fold_in(jax.random.key(args.seed + 17), rnd * 1000 + int(cid)))
                n = int(data.n)
                x, y = np.asarray(data.x[:n]), np.asarray(data.y[:n])
                true_classes = np.unique(y)
                inferred = infer_classes(out.update["Dense_2"]["kernel"], rule="gap")
                class_hits.append(bool(np.array_equal(inferred, true_classes)))
                reps = infer_representations(fc_kernels(out.update, [p[0] for p in layers]),
                                             num_top=args.alg4_m, classes=true_classes)
                for c in true_classes:
                    xc = jnp.asarray(x[y == c])
                    for li, path in enumerate(layers):
                        r_true = np.asarray(representation(sim.apply_fn, state.params, xc, path)).mean(0)
                        cors[li].append(representation_correlation(reps[int(c)][li], r_true,
                                                                  absolute=False))
            state, _ = sim.run_round(state, rnd)
        row = {"setting": label, "E": E, "B": B, "partition": part,
               "cor_fc1": float(np.nanmean(cors[0])), "cor_fc2": float(np.nanmean(cors[1])),
               "cor_fc3": float(np.nanmean(cors[2])),
               "class_inference_accuracy": float(np.mean(class_hits)),
               "rounds": args.cor_rounds, "clients_per_round": args.cor_clients,
               "paper_fc1_fc2_fc3": PAPER["cor_table1_cifar10"][label]}
        rows.append(row)
        log(f"cor {label}: {row['cor_fc1']:.3f} {row['cor_fc2']:.3f} {row['cor_fc3']:.3f} "
            f"classes {row['class_inference_accuracy']:.2f} ({time.perf_counter() - t0:.0f}s)")
    return rows


# ------------------------------------------------------ 2. utility-privacy ---

def defense_grid(args, attack):
    p_fc = args.soteria_dlg if attack == "dlg" else args.soteria_gs
    p_model = args.gc_dlg if attack == "dlg" else args.gc_gs
    grid = [("none", 0.0)]
    grid += [("soteria", p) for p in p_fc]
    grid += [("gc", p) for p in p_model]
    grid += [("dp_gaussian", s) for s in args.sigmas]
    grid += [("dp_laplace", s) for s in args.sigmas]
    return grid


def build(defense, param, layer="Dense_0", jacobian="batched"):
    """(stage, Defense) for one grid point; None for no defense."""
    if defense == "none":
        return None
    if defense == "soteria":
        return "layer", soteria(param, layer=layer, jacobian=jacobian)
    if defense == "gc":
        def apply(update, state, *, key=None, context=None):
            return magnitude_prune(update, param), state
        return "upload", Defense(lambda p: (), apply, "upload", f"gc({param})")
    if defense == "dp_gaussian":
        return "upload", update_gaussian(param)
    if defense == "dp_laplace":
        return "upload", update_laplace(param)
    raise ValueError(defense)


def defended_gradient(defense, param, params, apply_fn, x, y, lr, key, layer):
    """-Δ̃/lr for one example's single-step upload Δ = −lr·g, defended."""
    mask = jnp.ones((x.shape[0],))
    g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
    if defense == "soteria":
        ctx = DefenseContext(params=params, x=x, y=y, mask=mask, apply_fn=apply_fn)
        g, _ = soteria_gradient(g, ctx, param, layer=layer)
        return g
    built = build(defense, param, layer)
    if built is None:
        return g
    delta = jax.tree_util.tree_map(lambda v: -lr * v, g)
    delta, _ = built[1].apply(delta, (), key=key, context=None)
    return jax.tree_util.tree_map(lambda v: -v / lr, delta)


def attack_grid(args, attack, model, log):
    """MSE/PSNR of the attack against every grid point, victims at once."""
    cfg = make_cfg(args, model, 1)
    sim = Simulation(cfg)
    params = sim.init_state().params
    ds = sim.dataset
    rng = np.random.default_rng(args.seed + 5)
    victims = rng.choice(len(ds.x_test), args.victims, replace=False)
    grid = defense_grid(args, attack)
    observations, truths = [], []
    for gi, (defense, param) in enumerate(grid):
        for vi, v in enumerate(victims):
            x = jnp.asarray(ds.x_test[v:v + 1])
            y = jnp.asarray(ds.y_test[v:v + 1])
            key = jax.random.fold_in(jax.random.key(args.seed + 101), gi * 1000 + vi)
            g = defended_gradient(defense, param, params, sim.apply_fn, x, y, args.attack_lr,
                                  key, "Dense_0")
            observations.append(observation_from_gradient(
                g, params, sim.apply_fn, input_shape=ds.input_shape,
                num_classes=ds.num_classes, lr=args.attack_lr, batch_size=1))
            truths.append(np.asarray(x))
    t0 = time.perf_counter()
    key = jax.random.key(args.seed + 202)
    if attack == "dlg":
        recs = dlg.run_many(observations, {"iterations": args.dlg_iters}, key)
    else:
        recs = inverting_gradients.run_many(
            observations, {"iterations": args.gs_iters, "lr": 0.1}, key)
    log(f"{attack} on {model}: {len(observations)} victims in {time.perf_counter() - t0:.0f}s")
    out = {}
    images = {}
    for i, rec in enumerate(recs):
        gi, vi = divmod(i, len(victims))
        xr = np.clip(np.nan_to_num(np.asarray(rec.x), nan=0.5), 0.0, 1.0)
        m = float(np.mean(mse_metric(xr, truths[i])))
        p = float(np.mean(psnr_metric(xr, truths[i])))
        out.setdefault(grid[gi], []).append((m, p))
        images.setdefault(grid[gi], []).append(xr[0])
    truth_imgs = [truths[vi][0] for vi in range(len(victims))]
    return ({k: (float(np.mean([a for a, _ in v])), float(np.mean([b for _, b in v])))
             for k, v in out.items()}, images, truth_imgs, [int(v) for v in victims])


def accuracy_grid(args, attack, model, log, on_result):
    """Final test accuracy of FedAvg trained with each grid point's defense.

    The cheap defenses run first; ``on_result((defense, param), acc)`` is
    called after each, so partial results are saved as they come.
    """
    accs = {}
    grid = sorted(defense_grid(args, attack), key=lambda k: k[0] == "soteria")
    for defense, param in grid:
        t0 = time.perf_counter()
        lr = args.train_lr if attack == "dlg" else args.train_lr_gs
        cfg = make_cfg(args, model, args.rounds, lr=lr)
        built = build(defense, param, jacobian=args.train_jacobian)
        sim = Simulation(cfg, defenses={} if built is None else {built[0]: built[1]})
        state = sim.init_state()
        curve = []
        for rnd in range(args.rounds):
            state, _ = sim.run_round(state, rnd)
            if rnd >= args.rounds - args.acc_last or (rnd + 1) % 10 == 0:
                curve.append((rnd + 1, sim.evaluate(state.params)[0]))
        last = [a for r, a in curve if r > args.rounds - args.acc_last]
        # Non-IID FedAvg oscillates round to round: the utility is the mean
        # test accuracy of the last ``acc_last`` rounds (same rule for all).
        acc = float(np.mean(last))
        info = {"final_accuracy": float(last[-1]), "accuracy_curve": curve,
                "train_seconds": time.perf_counter() - t0,
                "train_jacobian": args.train_jacobian if defense == "soteria" else None}
        accs[(defense, param)] = acc
        on_result((defense, param), acc, info)
        log(f"accuracy {model} {defense} {param}: {acc:.4f} ({time.perf_counter() - t0:.0f}s)")
    return accs


# --------------------------------------------------------- 3. convergence ---

def convergence(args, log):
    """Fig 7 (§6.3): LR + FedAvg, 28×28 (784 features), ε features zeroed.

    The paper sets ε = 50 (a count, Eq 4), E ∈ {5, 10}, K ∈ {5, 10}, B = 32.
    """
    curves = {}
    num_features = 28 * 28
    for E, K, eps in args.logreg_settings:
        p = eps / num_features  # round(p · 784) = eps exactly
        t0 = time.perf_counter()
        cfg = make_cfg(args, "logreg", args.logreg_rounds, lr=args.logreg_lr, E=E,
                       image_size=28, clients_per_round=K)
        sim = Simulation(cfg, defenses={} if eps == 0 else {"layer": soteria(p)})
        state = sim.init_state()
        losses, accs = [], []
        for rnd in range(args.logreg_rounds):
            state, res = sim.run_round(state, rnd)
            acc, loss = sim.evaluate(state.params)
            losses.append(loss)
            accs.append(acc)
        label = f"E={E},K={K},eps={eps}"
        curves[label] = {"E": E, "K": K, "epsilon": eps, "p_fc": p, "test_loss": losses,
                         "test_accuracy": accs, "seconds": time.perf_counter() - t0}
        log(f"logreg {label}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, acc {accs[-1]:.3f} "
            f"({time.perf_counter() - t0:.0f}s)")
    return curves


# ------------------------------------------------------------------ main ----

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--wide", action="store_true",
                    help="quick mode: add the top of the paper's GC / DP ranges (GC 0.8 / 0.9, "
                         "sigma 0.1) and small Soteria rates (0.05, 0.1) to the grids")
    ap.add_argument("--stem", default="sun2021", help="output file stem")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny settings to check the pipeline (with --quick; not results)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--parts", default="cor,dlg,gs,logreg")
    ap.add_argument("--render", metavar="JSON",
                    help="only re-render markdown/PNGs from an existing results JSON")
    a = ap.parse_args(argv)
    if a.render:
        render(a.render)
        return
    q = a.quick
    a.image_size = 16 if q else 28
    a.lr = 0.01  # paper: SGD lr 0.01 (cor table, and the attacked single-step upload)
    # Accuracy models: the DLG LeNet with the reference code's U(-0.5, 0.5)
    # init at SGD lr 0.3 (paper 0.01). Measured here: with flax's default init
    # it stays at 10 % for 60 rounds at lr 0.5 / 1.0 (even IID); with the
    # U(-0.5, 0.5) init, lr 0.01 is still at 10 % after 60 rounds, lr 0.1
    # reaches 52 % and lr 0.3 58 % (16×16). A stated deviation.
    a.train_lr = 0.3
    a.train_lr_gs = 0.01  # ReLU ConvNet: the paper's lr (0.3 diverges to NaN, measured)
    a.rounds = 80 if q else 200
    a.acc_last = 5
    # Soteria's exact Jacobian costs ~100× a plain step on CPU
    # (benchmarks/results/soteria_speed.md): quick mode trains with the
    # sketched norms (an approximation), full mode with the exact ones.
    a.train_jacobian = "sketch" if q else "batched"
    # The attacked upload is a shared gradient (FedSGD, unit lr), as in DLG's
    # and the authors' attack experiments: DP noise σ and GC act on ∇ itself.
    a.attack_lr = 1.0
    a.cor_rounds = 1 if q else 20
    a.cor_clients = 5 if q else 10
    a.alg4_m = 5
    a.victims = 2 if q else 8
    a.dlg_iters, a.gs_iters = 300, 120
    a.soteria_dlg = [0.2, 0.4] if q else [0.01, 0.05, 0.1, 0.2, 0.3, 0.4]
    a.soteria_gs = [0.4, 0.8] if q else [0.01, 0.1, 0.2, 0.4, 0.6, 0.8]
    a.gc_dlg = [0.1, 0.5] if q else [0.01, 0.1, 0.3, 0.5, 0.7, 0.8]
    a.gc_gs = [0.1, 0.9] if q else [0.01, 0.1, 0.3, 0.5, 0.7, 0.9]
    a.sigmas = [1e-4, 1e-2] if q else [1e-4, 1e-3, 1e-2, 1e-1]
    # Fig 7: (E, K, ε) with ε a feature count of 784; ε = 392 (50 %) shows the
    # rate the previous quick run used by mistake (p_fc = 0.5).
    a.logreg_settings = ([(5, 10, 0), (5, 10, 50), (5, 10, 392)] if q else
                         [(E, K, eps) for E in (5, 10) for K in (5, 10) for eps in (0, 50)])
    a.logreg_rounds = 20 if q else 100
    a.logreg_lr = 0.1
    a.gs_width = 16 if q else 32
    a.gs_accuracy = not q  # ConvNet training does not fit the quick budget (see NOTES)
    if q and a.wide:
        a.gc_dlg, a.gc_gs = a.gc_dlg + [0.8], a.gc_gs[:1] + [0.5, 0.9]
        a.sigmas = a.sigmas + [1e-1]
        a.soteria_dlg = [0.05, 0.1] + a.soteria_dlg
        a.soteria_gs = [0.1, 0.2] + a.soteria_gs
    if a.smoke:
        a.rounds, a.acc_last, a.logreg_rounds, a.dlg_iters, a.gs_iters = 2, 1, 2, 3, 3
        a.cor_clients, a.victims = 1, 1
        a.soteria_dlg = a.soteria_gs = [0.4]
        a.gc_dlg = a.gc_gs = [0.1]
        a.sigmas = [1e-2]
        a.logreg_settings = [(1, 2, 0), (1, 2, 50)]
        a.gs_accuracy = True
    parts = set(a.parts.split(","))
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = a.stem
    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)

    result = {"mode": "quick" if q else "full", "seed": a.seed, "dataset": "fashion_mnist",
              "image_size": a.image_size, "device": f"{jax.default_backend()} "
              f"({platform.processor() or platform.machine()}, {os.cpu_count()} cpus)",
              "command": " ".join(["benchmarks/reproduce_sun2021.py"] + (argv or sys.argv[1:])),
              "settings": {k: v for k, v in vars(a).items() if k not in ("out", "parts")},
              "rows": [], "cor": [], "paper": PAPER, "complete": False}
    grids = {}

    def save():
        # Written after every part, so an interrupted run keeps what it measured.
        result["seconds"] = time.perf_counter() - t_start
        (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1))
        write_markdown(result, out_dir / f"{stem}.md")
        plot(result, grids, out_dir, stem)
        log(f"saved {out_dir / stem}.json/.md/png")

    models = {"dlg": "lenet_dlginit", "gs": convnet_factory(a.gs_width)}
    for attack in ("dlg", "gs"):
        if attack not in parts:
            continue
        metrics, images, truth, victims = attack_grid(a, attack, models[attack], log)
        for (defense, param), (m, p) in metrics.items():
            result["rows"].append({
                "dataset": "fashion_mnist", "model": models[attack], "defense": defense,
                "param": param, "attack": attack, "accuracy": None, "mse": m, "psnr": p,
                "victims": victims, "seed": a.seed})
        grids[attack] = (images, truth)
        save()
    if "cor" in parts:
        result["cor"] = cor_table(a, log)
        save()
    if "logreg" in parts:
        result["convergence_logreg"] = convergence(a, log)
        save()
    for attack in ("dlg", "gs"):
        if attack not in parts or (attack == "gs" and not a.gs_accuracy):
            continue
        for row in result["rows"]:
            if row["attack"] == attack:
                row["accuracy"] = "pending"

        def on_acc(key, acc, info, attack=attack):
            for row in result["rows"]:
                if row["attack"] == attack and (row["defense"], row["param"]) == key:
                    row["accuracy"] = acc
                    row.update(info)
            result["acceptance"] = {k: acceptance(result["rows"], k) for k in ("dlg", "gs")}
            save()
        accuracy_grid(a, attack, models[attack], log, on_acc)
    for row in result["rows"]:
        if row["accuracy"] == "pending":
            row["accuracy"] = None
    result["acceptance"] = {k: acceptance(result["rows"], k) for k in ("dlg", "gs")}
    result["complete"] = True
    save()


def acceptance(rows, attack, tol=0.01, factor=10.0):
    """The issue's check: at accuracy within ``tol`` of no defense, Soteria's
    attack MSE ≥ ``factor`` × that of GC and of each DP baseline.

    Per defense, the eligible settings are those with accuracy ≥ acc₀ − tol;
    each defense is represented by its eligible setting with the LARGEST MSE
    (its best privacy at no accuracy loss). PASS needs an eligible Soteria
    setting and a ratio ≥ ``factor`` against every baseline that has an
    eligible setting; a baseline with none is reported ("no setting keeps
    accuracy") and does not count against Soteria. None when accuracies were
    not measured for this attack's model.
    """
    rs = [r for r in rows if r["attack"] == attack and isinstance(r["accuracy"], float)]
    base = [r for r in rs if r["defense"] == "none"]
    if not base:
        return None
    acc0 = base[0]["accuracy"]
    out = {"no_defense_accuracy": acc0, "tolerance": tol, "factor": factor, "best": {},
           "ratios": {}}
    for d in ("soteria", "gc", "dp_gaussian", "dp_laplace"):
        ok = [r for r in rs if r["defense"] == d and r["accuracy"] >= acc0 - tol]
        out["best"][d] = None if not ok else {
            "param": max(ok, key=lambda r: r["mse"])["param"],
            "accuracy": max(ok, key=lambda r: r["mse"])["accuracy"],
            "mse": max(r["mse"] for r in ok)}
    sot = out["best"]["soteria"]
    for d in ("gc", "dp_gaussian", "dp_laplace"):
        b = out["best"][d]
        out["ratios"][d] = None if (sot is None or b is None) else sot["mse"] / max(b["mse"], 1e-12)
    measured = [v for v in out["ratios"].values() if v is not None]
    if acc0 <= 0.15:
        out["verdict"] = "VACUOUS (no-defense model at chance)"
    elif sot is None:
        out["verdict"] = "FAIL (no Soteria setting keeps accuracy)"
    elif not measured:
        out["verdict"] = "NOT EVALUABLE (no baseline setting keeps accuracy)"
    else:
        out["verdict"] = "PASS" if all(v >= factor for v in measured) else "FAIL"
    return out


def write_markdown(res, path):
    lines = [f"# Soteria reproduction (Sun et al. 2021) — {res['mode']} mode",
             "", f"Fashion-MNIST {res['image_size']}×{res['image_size']} (MNIST/CIFAR-10 are "
             f"not available offline), seed {res['seed']}, device {res['device']}, "
             f"{res['seconds']:.0f} s. Produced by `"
             f"{res.get('command', 'benchmarks/reproduce_sun2021.py --quick')}`"
             f"{'' if res.get('complete') else ' (INCOMPLETE: run interrupted)'}.", ""]
    if res["cor"]:
        lines += ["## Representation inference `cor` (Table 1; paper: CIFAR-10)", "",
                  "| setting | FC1 | FC2 | FC3 (last) | class inference acc | paper FC1/FC2/FC3 |",
                  "|---|---|---|---|---|---|"]
        for r in res["cor"]:
            lines.append(f"| {r['setting']} | {r['cor_fc1']:.3f} | {r['cor_fc2']:.3f} | "
                         f"{r['cor_fc3']:.3f} | {r['class_inference_accuracy']:.2f} | "
                         f"{' / '.join(f'{v:.2f}' for v in r['paper_fc1_fc2_fc3'])} |")
        lines.append("")
    for attack in ("dlg", "gs"):
        rs = [r for r in res["rows"] if r["attack"] == attack]
        if not rs:
            continue
        lines += [f"## {attack.upper()} on {rs[0]['model']} (batch 1)", "",
                  "| defense | param | test accuracy | MSE | PSNR (dB) |", "|---|---|---|---|---|"]
        for r in rs:
            acc = f"{r['accuracy']:.4f}" if isinstance(r["accuracy"], float) else \
                "not measured" if r["accuracy"] is None else str(r["accuracy"])
            lines.append(f"| {r['defense']} | {r['param']:g} | {acc} | {r['mse']:.4g} | "
                         f"{r['psnr']:.2f} |")
        sot_rows = [r for r in rs if r["defense"] == "soteria"]
        if sot_rows:
            weakest = {}
            for r in rs:
                if r["defense"] in ("gc", "dp_gaussian", "dp_laplace") and (
                        r["defense"] not in weakest or r["param"] < weakest[r["defense"]]["param"]):
                    weakest[r["defense"]] = r
            lines += ["", "MSE ratio of Soteria (each p_fc) to each baseline at its smallest "
                      "parameter in the grid (the baselines' least accuracy-costly setting):", ""]
            for srow in sot_rows:
                parts_ = [f"{d} {w['param']:g}: {srow['mse'] / max(w['mse'], 1e-12):.1f}×"
                          for d, w in weakest.items()]
                lines.append(f"- soteria {srow['param']:g}: " + ", ".join(parts_))
        acc_ = (res.get("acceptance") or {}).get(attack)
        if acc_:
            lines += ["", f"**Acceptance (equal accuracy)**: no-defense accuracy "
                      f"{acc_['no_defense_accuracy']:.4f}; per defense, the largest attack MSE "
                      f"among its settings with accuracy ≥ {acc_['no_defense_accuracy']:.4f} − "
                      f"{acc_['tolerance']:.2f}:", ""]
            for d, b in acc_["best"].items():
                ratio = acc_["ratios"].get(d)
                tail = "" if ratio is None else f" — Soteria/{d} MSE ratio {ratio:.1f}×"
                lines.append(f"- {d}: " + ("no setting keeps accuracy" if b is None else
                             f"param {b['param']:g}, acc {b['accuracy']:.4f}, MSE "
                             f"{b['mse']:.4g}{tail}"))
            lines += ["", f"Verdict (Soteria MSE ≥ {acc_['factor']:g}× each baseline): "
                      f"**{acc_['verdict']}**"]
        else:
            lines += ["", "Test accuracy not measured for this model in this mode (see notes)."]
        lines.append("")
    if "convergence_logreg" in res:
        lines += ["## Logistic regression + FedAvg with Soteria (Fig 7)", "",
                  "28×28 inputs (784 features = r, the defended layer is the only layer); "
                  "ε features zeroed per example (paper: ε = 50).", "",
                  "| E | K | ε (p_fc) | test loss round 1 | final test loss | final accuracy |",
                  "|---|---|---|---|---|---|"]
        for c in res["convergence_logreg"].values():
            lines.append(f"| {c['E']} | {c['K']} | {c['epsilon']} ({c['p_fc']:.3f}) | "
                         f"{c['test_loss'][0]:.4f} | {c['test_loss'][-1]:.4f} | "
                         f"{c['test_accuracy'][-1]:.4f} |")
        lines.append("")
    lines += ["## Notes and deviations", ""] + [f"- {n}" for n in NOTES[res["mode"]]] + [""]
    lines += ["## Paper", "", f"- {res['paper']['headline']}",
              f"- Table 2 ranges: {res['paper']['table2_ranges']}", ""]
    path.write_text("\n".join(lines))


def plot(res, grids, out_dir, stem):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attacks = [a for a in ("dlg", "gs") if any(r["attack"] == a for r in res["rows"])]
    if attacks:
        fig, axes = plt.subplots(1, len(attacks), figsize=(6 * len(attacks), 4.5), squeeze=False)
        for ax, attack in zip(axes[0], attacks):
            for d in ("soteria", "gc", "dp_gaussian", "dp_laplace", "none"):
                rs = [r for r in res["rows"] if r["attack"] == attack and r["defense"] == d]
                if not rs:
                    continue
                xs = [r["accuracy"] if isinstance(r["accuracy"], float) else float("nan") for r in rs]
                ax.plot(xs, [r["mse"] for r in rs], "o-", label=d)
            ax.set_yscale("log")
            ax.set_xlabel("test accuracy")
            ax.set_ylabel("attack MSE")
            ax.set_title(f"{attack.upper()} ({res['mode']})")
            ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / f"{stem}_tradeoff.png", dpi=110)
        plt.close(fig)
    for attack, (images, truth) in grids.items():
        keys = list(images)
        nv = len(truth)
        fig, axes = plt.subplots(nv, len(keys) + 1, figsize=(1.3 * (len(keys) + 1), 1.5 * nv),
                                 squeeze=False)
        for vi in range(nv):
            axes[vi, 0].imshow(truth[vi][..., 0], cmap="gray", vmin=0, vmax=1)
            axes[vi, 0].set_title("truth", fontsize=6)
            for ki, k in enumerate(keys):
                axes[vi, ki + 1].imshow(images[k][vi][..., 0], cmap="gray", vmin=0, vmax=1)
                axes[vi, ki + 1].set_title(f"{k[0]} {k[1]:g}", fontsize=6)
        for ax in axes.ravel():
            ax.axis("off")
        fig.tight_layout()
        fig.savefig(out_dir / f"{stem}_{attack}_grid.png", dpi=110)
        plt.close(fig)
    if "convergence_logreg" in res:
        fig, ax = plt.subplots(figsize=(5, 4))
        for p, c in res["convergence_logreg"].items():
            ax.plot(range(1, len(c["test_loss"]) + 1), c["test_loss"], label=p)
        ax.set_xlabel("round")
        ax.set_ylabel("test loss")
        ax.set_title("logistic regression + FedAvg + Soteria")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / f"{stem}_convergence.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main()
