"""Reproduce the trends of Chu et al. 2023 (PriPrune, paper 002) on Fashion-MNIST.

FEMNIST / CIFAR-10 are not available offline: we use Fashion-MNIST (real
data, /usr/share/datasets/fashion-mnist) with Dirichlet(0.5) label partitions.

Two parts, every row from this script in one run (seeds in the JSON):

A. Attacks on pruned uploads (Fig 2, Fig 7, Fig 8/9): the six base schemes
   mask the model at rate p; a victim batch's FedSGD upload Δ = −lr·(g ⊙ m)
   at the initial global model is attacked by GI (Inverting Gradients, cosine,
   Geiping et al.) and SGI (Alg 2). Axes: p, B, model size.
B. Pruned FL training with PruneFL as the base (p = 0.3) and the defenses of
   §5: none, Largest / Random / Mix (p̂ = 0.3; Mix 0.15 + 0.15), each with and
   without Pseudo-Pruning, and PriPrune (Fig 4, Fig 5). Test accuracy at the
   end; SGI on the observed client's upload in the observed rounds (Fig 2(d):
   vs rounds) and GI on the last one.

Clients run one local SGD step on their batch of B = 20 (the paper's FEMNIST
setting "FedSGD, batch 20, one local update"): each client holds B examples.

Usage:
  python -m benchmarks.reproduce_chu2023 --quick   # ~minutes on 2 CPU cores
  python -m benchmarks.reproduce_chu2023           # larger (not run here)
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attacks import inverting_gradients, sgi
from attacks.metrics import match_reconstructions, nmi, psnr
from defenses.pruning import apply_mask, flatten
from defenses.pruning.defense_prune import prune_largest, prune_mix, prune_random
from defenses.pruning.global_mask import masked_gradient, masked_upload
from defenses.pruning.priprune import (PriPruneConfig, defense_rate, priprune_client_update,
                                       priprune_defense)
from defenses.pruning.schemes import (SCHEMES, feddst_prune_regrow, initial_mask, prunable,
                                      prunefl_reprune)
from fedsim.client import masked_mean_loss
from fedsim.config import load_config
from fedsim.data import load_dataset
from fedsim.hooks import chain
from fedsim.models import build_model, init_params, make_apply_fn
from fedsim.observer import restrict
from fedsim.simulation import Simulation
from fedsim.typing import Observation

OUT = Path(__file__).parent / "results"
PAPER = {
    "source": "Chu et al. 2023 (arXiv v2), FEMNIST; shared/reference/paper_numbers.md",
    "priprune_vs_prunefl_privacy_gain_femnist": 0.363,
    "priprune_accuracy_loss": "none (same accuracy as PruneFL)",
    "trends": ["NMI/PSNR fall as p grows (0.1-0.9)", "NMI falls as B grows",
               "NMI rises with model size and rounds T", "SGI >= GI at every p",
               "Largest: most privacy, least accuracy; Pseudo-Pruning restores accuracy"],
    "base_rate": 0.3, "defense_rate": 0.3, "mix": [0.15, 0.15], "lr": 0.25, "batch": 20,
}


def git_commit() -> str:
    """HEAD of the checkout running this script (+ "-dirty" with uncommitted changes)."""
    import subprocess
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def scheme_mask(scheme, key, params, p, apply_fn, x, y, input_shape, synflow_its):
    """A scheme's mask at rate p on the initial model (iterative ones: one step)."""
    if scheme == "prunefl":
        return prunefl_reprune(params, initial_mask("prunefl", key, params, p), p, 1, 1)
    m = initial_mask(scheme, key, params, p, apply_fn=apply_fn, x=x, y=y,
                     input_shape=input_shape, synflow_iterations=synflow_its)
    if scheme == "feddst":
        m = feddst_prune_regrow(jax.random.fold_in(key, 1), params, m, 0.2)
    return m


def score(x_rec, x_true):
    x_rec, x_true = np.asarray(x_rec), np.asarray(x_true)
    x_rec = x_rec[match_reconstructions(x_rec, x_true)]
    return nmi(x_rec, x_true), float(np.mean(psnr(x_rec, x_true)))


def attack_all(obs_list, attack_cfg, key):
    """GI and SGI on every observation (vmapped, one compile per attack).

    Paired: both attacks get the same key, hence the same labels and the same
    initial dummies per victim and restart; they differ only in SGI's mask.
    """
    gi = inverting_gradients.run_many(obs_list, attack_cfg, key)
    sg = sgi.run_many(obs_list, attack_cfg, key)
    return gi, sg


def part_a(args, ds, rows, seed):
    """Attacks on pruned FedSGD uploads at the initial model.

    Every setting of a (model, B) group attacks the same ``args.victims``
    victim batches (paired across schemes, p and the two attacks); rows hold
    the mean over victims and the per-victim values.
    """
    rng = np.random.default_rng(seed)
    shape = ds.input_shape
    lr = 0.25
    probe_idx = rng.choice(len(ds.y_train), 64, replace=False)  # server batch for SNIP/GraSP
    xp, yp = jnp.asarray(ds.x_train[probe_idx]), jnp.asarray(ds.y_train[probe_idx])
    jobs = []  # (model, B, scheme, p)
    for s in SCHEMES:
        for p in args.rates:
            jobs.append(("conv2", 1, s, p))
    if 0.3 not in args.rates:  # the reference point of the B and model-size axes
        jobs.append(("conv2", 1, "prunefl", 0.3))
    for B in args.batch_sizes:
        if B != 1:
            jobs.append(("conv2", B, "prunefl", 0.3))
    for model in args.model_sizes:
        if model != "conv2":
            jobs.append((model, 1, "prunefl", 0.3))
    groups = {}
    for j in jobs:
        groups.setdefault((j[0], j[1]), []).append(j)
    for (model_name, B), group in groups.items():
        model = build_model(model_name, ds.num_classes)
        apply_fn = make_apply_fn(model)
        params = init_params(model, shape, jax.random.key(seed))
        d_w = int(np.sum(np.asarray(flatten(prunable(params)))))
        victims = [rng.choice(len(ds.y_train), B, replace=False) for _ in range(args.victims)]
        obs_list, truths, meta = [], [], []
        for i, (_, _, scheme, p) in enumerate(group):
            t0 = time.perf_counter()
            mask = scheme_mask(scheme, jax.random.key(seed + 17 * i), params, p, apply_fn, xp, yp,
                               shape, args.synflow_iterations)
            pm = apply_mask(params, mask)
            for idx in victims:
                x, y = jnp.asarray(ds.x_train[idx]), jnp.asarray(ds.y_train[idx])
                g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, pm, x, y, jnp.ones(B))
                upd = jax.tree_util.tree_map(lambda a: -lr * a, apply_mask(g, mask))
                obs = Observation(upd, pm, apply_fn, "fedsgd", lr, 1, B, B, y, shape,
                                  ds.num_classes)
                obs_list.append(restrict(obs, {"labels": True, "batch_size": True}))
                truths.append(np.asarray(x))
            meta.append((scheme, p, time.perf_counter() - t0))
        t0 = time.perf_counter()
        attack_key = jax.random.key(seed + 1000 + B)
        gi, sg = attack_all(obs_list, args.attack, attack_key)
        secs = time.perf_counter() - t0
        V = args.victims
        for j, (scheme, p, mask_s) in enumerate(meta):
            for name, recs in (("gi", gi), ("sgi", sg)):
                sc = [score(recs[j * V + v].x, truths[j * V + v]) for v in range(V)]
                rows.append({"part": "A", "dataset": "fashion_mnist", "model": model_name,
                             "params": int(sum(l.size for l in jax.tree_util.tree_leaves(params))),
                             "prunable_params": d_w, "base": scheme, "defense": "none", "p": p,
                             "B": B, "attack": name,
                             "nmi": float(np.mean([a for a, _ in sc])),
                             "psnr": float(np.mean([b for _, b in sc])), "accuracy": None,
                             "nmi_victims": [a for a, _ in sc], "psnr_victims": [b for _, b in sc],
                             "attack_loss_victims": [float(recs[j * V + v].loss) for v in range(V)],
                             "victim_indices": [np.asarray(v).tolist() for v in victims],
                             "attack_seed": seed + 1000 + B, "mask_seed": seed + 17 * j,
                             "round": 0, "mask_seconds": mask_s,
                             "attack_seconds_group": secs})
        print(f"[A] {model_name} B={B}: {len(obs_list)} victims x 2 attacks in {secs:.1f}s",
              flush=True)


def fl_config(args, seed, rounds, observe_rounds):
    o = {"name": "chu2023", "seed": seed, "data.dataset": "fashion_mnist",
         "data.image_size": args.image_size, "data.num_clients": args.clients,
         "data.partition": "dirichlet", "data.alpha": 0.5, "data.examples_per_client": args.local_batch,
         "model.name": "conv2", "training.rounds": rounds,
         "training.clients_per_round": args.clients_per_round, "training.algorithm": "fedavg",
         "training.local_epochs": 1, "training.batch_size": args.local_batch, "training.lr": args.lr,
         "training.client_parallelism": "loop", "observer.clients": "[0]",
         "observer.rounds": json.dumps(observe_rounds), "output.progress": False,
         "output.plots": False}
    return load_config(None, [f"{k}={v}" for k, v in o.items()])


def part_b(args, ds, rows, seed):
    """Pruned FL with PruneFL (p = 0.3) and the defenses."""
    R = args.rounds
    reconfig = [int(R * k / args.reconfigs) for k in range(args.reconfigs)]
    observe = [R - 1]
    cfg = fl_config(args, seed, R, observe)
    hp = PriPruneConfig(lambda_acc=args.lambda_acc, lambda_pri=args.lambda_pri,
                        lambda_sha=args.lambda_sha, tau=0.5, alpha_lr=args.alpha_lr,
                        alpha_init=0.1)
    defenses = {
        "none": lambda: None,
        "largest": lambda: prune_largest(0.3), "random": lambda: prune_random(0.3),
        "mix": lambda: prune_mix(0.15, 0.15),
        "largest_pseudo": lambda: prune_largest(0.3, pseudo=True),
        "random_pseudo": lambda: prune_random(0.3, pseudo=True),
        "mix_pseudo": lambda: prune_mix(0.15, 0.15, pseudo=True),
        "priprune": lambda: "priprune",
    }
    pending = []
    for name in args.defenses:
        t0 = time.perf_counter()
        d = defenses[name]()
        state, mask, sim, observed, k = None, None, None, [], 0
        rates = []
        for r in range(R):
            if r in reconfig:
                k += 1
                params = (sim.init_state().params if state is None else state.params) \
                    if sim is not None else None
                if sim is None:
                    sim0 = Simulation(cfg, dataset=ds)
                    params = sim0.init_state().params
                    mask = initial_mask("prunefl", None, params, 0.3)
                mask = prunefl_reprune(params if state is None else state.params, mask, 0.3, k,
                                       args.reconfigs)
                up = [masked_upload(mask)]
                kw = {}
                if d == "priprune":
                    defs = {"layer": masked_gradient(mask), "upload": priprune_defense(hp)}
                    kw["client_update_factory"] = priprune_client_update(hp)
                else:
                    defs = {"layer": masked_gradient(mask),
                            "upload": chain(*(up + ([d] if d is not None else [])))}
                sim = Simulation(cfg, dataset=ds, defenses=defs, **kw)
                if state is None:
                    state = sim.init_state()
                state = state._replace(params=apply_mask(state.params, mask))
            state, res = sim.run_round(state, r)
            state = state._replace(params=apply_mask(state.params, mask))  # Alg 1 line 11
            observed.extend(res.observed)
            if d == "priprune":
                cs = jax.tree_util.tree_map(lambda s: s[0], state.client_states["upload"])
                rates.append(float(defense_rate(cs["withheld"])))
        acc, _ = sim.evaluate(state.params)
        train_s = time.perf_counter() - t0
        (o,) = observed
        pending.append((name, acc, train_s, rates, o))
        print(f"[B] {name}: acc {acc:.4f} ({train_s:.0f}s train)", flush=True)
    # One vmapped attack over every defense's upload (one compile per attack).
    obs = [restrict(o.observation, {"labels": True, "batch_size": True, "local_steps": True})
           for *_, o in pending]
    t1 = time.perf_counter()
    sg = sgi.run_many(obs, args.attack_b, jax.random.key(seed + 7))
    gi = inverting_gradients.run_many(obs, args.attack_b, jax.random.key(seed + 8))
    att_s = time.perf_counter() - t1
    print(f"[B] attacks: {len(obs)} victims x 2 attacks in {att_s:.0f}s", flush=True)
    for (name, acc, train_s, rates, o), ob, rs, rg in zip(pending, obs, sg, gi):
        zf = float(np.mean(np.asarray(flatten(ob.update)) == 0))
        for att, rec in (("sgi", rs), ("gi", rg)):
            n, ps = score(rec.x, o.x)
            rows.append({"part": "B", "dataset": "fashion_mnist", "model": "conv2",
                         "base": "prunefl", "defense": name, "p": 0.3, "B": args.local_batch,
                         "attack": att, "nmi": n, "psnr": ps, "accuracy": acc,
                         "round": ob.round, "upload_zero_fraction": zf,
                         "priprune_defense_rate": rates if name == "priprune" else None,
                         "train_seconds": train_s, "attack_seconds_all": att_s})


def bound_table(ds, seed, d_star=8, n_examples=256, chunk=16):
    """Thm 1 / Cor 1 (defenses.bounds.priprune_leakage_bound) per p, B and T.

    Σ is the empirical covariance of the d* gradient coordinates with the
    largest mean |g| of per-example gradients at the initial Conv-2 model
    (our choice of "the d*-dimensional sub-vector"; the paper gives no recipe).
    """
    from defenses.bounds import priprune_leakage_bound
    model = build_model("conv2", ds.num_classes)
    apply_fn = make_apply_fn(model)
    params = init_params(model, ds.input_shape, jax.random.key(seed))
    idx = np.random.default_rng(seed + 99).choice(len(ds.y_train), n_examples, replace=False)
    x, y = jnp.asarray(ds.x_train[idx]), jnp.asarray(ds.y_train[idx])
    per_ex = jax.jit(jax.vmap(lambda xi, yi: flatten(jax.grad(masked_mean_loss, argnums=1)(
        apply_fn, params, xi[None], yi[None], jnp.ones(1))), in_axes=(0, 0)))
    mean_abs = 0.0
    for i in range(0, n_examples, chunk):
        mean_abs = mean_abs + jnp.sum(jnp.abs(per_ex(x[i:i + chunk], y[i:i + chunk])), 0)
    sel = jnp.argsort(-mean_abs)[:d_star]
    g = np.concatenate([np.asarray(per_ex(x[i:i + chunk], y[i:i + chunk])[:, sel])
                        for i in range(0, n_examples, chunk)])
    cov = np.cov(g.astype(np.float64), rowvar=False)
    out = []
    for p in (0.1, 0.3, 0.5, 0.7, 0.9):
        for B in (1, 4, 8, 20):
            for T in (1, 20):
                out.append({"p": p, "B": B, "T": T, "d_star": d_star,
                            "bound_bits": priprune_leakage_bound(p, B, cov, rounds=T)})
    return {"rows": out, "logdet_sigma": float(np.linalg.slogdet(cov)[1]), "d_star": d_star,
            "n_examples": n_examples, "seed": seed}


def markdown(result) -> str:
    rows = result["rows"]
    lines = [f"# Chu et al. 2023 (PriPrune) reproduction — {result['mode']} mode",
             "", f"Device: {result['device']}; seed {result['seed']}; dataset Fashion-MNIST "
             f"{result['image_size']}×{result['image_size']} (FEMNIST/CIFAR-10 unavailable offline); "
             f"wall time {result['seconds']:.0f} s. Produced by `benchmarks/reproduce_chu2023.py"
             f"{' --quick' if result['mode'] == 'quick' else ''}`.", "",
             "## A. GI vs SGI on pruned FedSGD uploads (initial Conv-2 model)", "",
             "| model | B | base | p | GI NMI | SGI NMI | GI PSNR | SGI PSNR |",
             "|---|---|---|---|---|---|---|---|"]
    a = [r for r in rows if r["part"] == "A"]
    keys = sorted({(r["model"], r["B"], r["base"], r["p"]) for r in a},
                  key=lambda k: (k[0], k[1], k[2], k[3]))
    for k in keys:
        g = next(r for r in a if (r["model"], r["B"], r["base"], r["p"]) == k and r["attack"] == "gi")
        s = next(r for r in a if (r["model"], r["B"], r["base"], r["p"]) == k and r["attack"] == "sgi")
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {g['nmi']:.4f} | {s['nmi']:.4f} | "
                     f"{g['psnr']:.2f} | {s['psnr']:.2f} |")
    lines += ["", "## B. PruneFL (p = 0.3) + defenses: accuracy and SGI leakage", "",
              "| defense | test acc | SGI NMI | SGI PSNR | GI NMI | GI PSNR | upload zeros |",
              "|---|---|---|---|---|---|---|"]
    b = [r for r in rows if r["part"] == "B"]
    for name in dict.fromkeys(r["defense"] for r in b):
        s = [r for r in b if r["defense"] == name and r["attack"] == "sgi"]
        g = [r for r in b if r["defense"] == name and r["attack"] == "gi"]
        last = s[-1]
        lines.append(f"| {name} | {last['accuracy']:.4f} | {last['nmi']:.4f} | {last['psnr']:.2f} | "
                     f"{g[0]['nmi']:.4f} | {g[0]['psnr']:.2f} | {last['upload_zero_fraction']:.3f} |")
    if result.get("bound"):
        bd = result["bound"]
        lines += ["", f"## Info bound (Thm 1 / Cor 1), bits; d* = {bd['d_star']}, "
                  f"ln det Σ = {bd['logdet_sigma']:.2f}", "",
                  "| p | B=1,T=1 | B=20,T=1 | B=20,T=20 |", "|---|---|---|---|"]
        for p in sorted({r["p"] for r in bd["rows"]}):
            v = {(r["B"], r["T"]): r["bound_bits"] for r in bd["rows"] if r["p"] == p}
            lines.append(f"| {p} | {v[(1, 1)]:.2f} | {v[(20, 1)]:.2f} | {v[(20, 20)]:.2f} |")
    pp = [r for r in b if r["defense"] == "priprune" and r["attack"] == "sgi"]
    if pp and pp[-1]["priprune_defense_rate"]:
        rates = pp[-1]["priprune_defense_rate"]
        lines += ["", f"PriPrune defense rate p̂ of client 0 over rounds: first {rates[0]:.3f}, "
                  f"last {rates[-1]:.3f}."]
    lines += ["", "Paper (FEMNIST): " + "; ".join(PAPER["trends"]) +
              f"; PriPrune improves PruneFL's privacy by {PAPER['priprune_vs_prunefl_privacy_gain_femnist']:.1%} "
              "at equal accuracy.", ""]
    return "\n".join(lines)


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    a = [r for r in result["rows"] if r["part"] == "A" and r["model"] == "conv2" and r["B"] == 1]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for scheme in SCHEMES:
        for att, ls in (("gi", "--"), ("sgi", "-")):
            pts = sorted((r["p"], r["nmi"]) for r in a if r["base"] == scheme and r["attack"] == att)
            if pts:
                axes[0].plot(*zip(*pts), ls, marker="o", label=f"{scheme} {att.upper()}")
    axes[0].set(xlabel="pruning rate p", ylabel="NMI", title="NMI vs p (Conv-2, B=1)")
    axes[0].legend(fontsize=6)
    for scheme in SCHEMES:
        pts = sorted((r["p"], r["psnr"]) for r in a if r["base"] == scheme and r["attack"] == "sgi")
        if pts:
            axes[1].plot(*zip(*pts), marker="o", label=scheme)
    axes[1].set(xlabel="pruning rate p", ylabel="PSNR (dB)", title="SGI PSNR vs p")
    axes[1].legend(fontsize=7)
    b = [r for r in result["rows"] if r["part"] == "B" and r["attack"] == "sgi"]
    for name in dict.fromkeys(r["defense"] for r in b):
        last = [r for r in b if r["defense"] == name][-1]
        axes[2].scatter(last["accuracy"], last["nmi"])
        axes[2].annotate(name, (last["accuracy"], last["nmi"]), fontsize=7)
    axes[2].set(xlabel="test accuracy", ylabel="SGI NMI (last round)",
                title="PruneFL + defenses (Fig 4/5)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parts", default="AB")
    ap.add_argument("--combine", action="store_true",
                    help="merge chu2023_A.json and chu2023_B.json (two processes of one commit)")
    ap.add_argument("--rounds", type=int, default=None, help="override the FL rounds")
    ap.add_argument("--defenses", default=None, help="comma list overriding part B's defenses")
    args = ap.parse_args(argv)
    if args.combine:
        a = json.loads((OUT / "chu2023_A.json").read_text())
        b = json.loads((OUT / "chu2023_B.json").read_text())
        result = {**a, "rows": a["rows"] + b["rows"], "seconds": max(a["seconds"], b["seconds"]),
                  "note": "parts A and B ran as two concurrent processes of the same commit "
                          "and seed (--parts A / --parts B), merged by --combine",
                  "settings_B": b["settings"]}
        ds = load_dataset("fashion_mnist", image_size=a["image_size"])
        result["bound"] = bound_table(ds, a["seed"])
        (OUT / "chu2023.json").write_text(json.dumps(result, indent=1, default=float))
        (OUT / "chu2023.md").write_text(markdown(result) + "\n" + result["note"] + "\n")
        plot(result, OUT / "chu2023.png")
        print(markdown(result))
        return
    q = args.quick
    args.image_size = 16 if q else 28
    args.rates = [0.1, 0.5, 0.9] if q else [0.1, 0.3, 0.5, 0.7, 0.9]
    args.batch_sizes = [1, 4] if q else [1, 4, 8, 16]
    args.model_sizes = ["lenet5", "conv2"] if q else ["lenet5", "conv2", "vgg11"]
    args.synflow_iterations = 20 if q else 100
    # Same budget for GI and SGI (paired keys); best of `restarts` by attack loss.
    args.attack = {"iterations": 200 if q else 1000, "tv": 1e-3, "restarts": 2 if q else 4}
    args.victims = 2 if q else 4
    args.attack_b = {"iterations": 100 if q else 1000, "tv": 1e-3, "restarts": 1}
    args.local_batch = 8 if q else 20
    args.clients, args.clients_per_round = (50, 10) if q else (193, 10)
    args.rounds = args.rounds or (20 if q else 300)
    args.reconfigs = 2 if q else 5
    args.lr = 0.1
    args.lambda_acc, args.lambda_pri, args.lambda_sha, args.alpha_lr = 1.0, 10.0, 2e-5, 0.05
    full = ["none", "largest", "random", "mix", "largest_pseudo", "random_pseudo", "mix_pseudo",
            "priprune"]
    quick = ["none", "largest", "random", "mix", "largest_pseudo", "priprune"]
    args.defenses = args.defenses.split(",") if args.defenses else (quick if q else full)
    ds = load_dataset("fashion_mnist", image_size=args.image_size)
    rows, t0 = [], time.perf_counter()
    if "A" in args.parts:
        part_a(args, ds, rows, args.seed)
    if "B" in args.parts:
        part_b(args, ds, rows, args.seed)
    result = {"mode": "quick" if q else "full", "seed": args.seed, "image_size": args.image_size,
              "commit": git_commit(),
              "device": f"{jax.default_backend()} ({platform.processor() or platform.machine()})",
              "seconds": time.perf_counter() - t0, "settings": {
                  k: v for k, v in vars(args).items() if k not in ("quick",)},
              "rows": rows, "paper": PAPER}
    OUT.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.parts == "AB" else f"_{args.parts}"
    (OUT / f"chu2023{suffix}.json").write_text(json.dumps(result, indent=1, default=float))
    (OUT / f"chu2023{suffix}.md").write_text(markdown(result))
    plot(result, OUT / f"chu2023{suffix}.png")
    print(markdown(result))


if __name__ == "__main__":
    main()
