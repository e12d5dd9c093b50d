"""DP-FedAvg with adaptive clipping (Andrew et al. 2021) against fixed clips, in plain JAX.

What it shows: ``defenses.dp.quantile_dp_fedavg`` used in one's own JAX
training loop (the engine has no server-side stage for it yet, see
``defenses/dp/adaptive_clipping.py``), and the two claims of Andrew et al.
that can be checked on one CPU:

1. the clip norm tracks the target quantile of the cohort's update norms
   (the median, γ = 0.5, and γ = 0.1 here) from C₀ = 0.1 (§2): the run
   records C_t and, for evaluation only (not released, not private), the
   norm quantile of each round's cohort;
2. adaptive clipping to the median is competitive with the best of a grid of
   fixed clips at the same noise multiplier z (§4), without tuning. Run at
   z = 0 (no noise), 0.3 and 1.

Setting: Fashion-MNIST (the Debian IDX files) standardised, McMahan et al.'s
shards (2 per client, 50 examples each, 1,200 clients), a 784-64-10 ReLU MLP,
m = 100 clients a round sampled without replacement (accounted as Poisson at
q = m/K, as the engine's ``client_level_dp`` is), E = 1 epoch of B = 10 at
client lr 0.1, server SGD with momentum 0.9 and lr 1 (not tuned). Every
configuration sees the same cohorts and the same client keys; only the
aggregation differs. The fixed-clip rows are DP-FedAvg (McMahan et al. 2018)
at noise z·C; the adaptive rows add the count at σ_b = m/20 and put z_Δ on
the update, so all are accounted at z.

Run:  python benchmarks/adaptive_clipping_fmnist.py [--quick] [--out DIR]
Writes ``adaptive_clipping_fmnist.{json,md,png}`` under ``--out``
(default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.provenance import git_state  # noqa: E402
from benchmarks.results_io import write_json_and_markdown  # noqa: E402
from defenses.accounting import dp_fedavg_epsilon  # noqa: E402
from defenses.dp import clip_to_quantile_estimate, quantile_dp_fedavg  # noqa: E402
from fedsim.data import load_dataset  # noqa: E402
from fedsim.partition import shards  # noqa: E402

NAME = "adaptive_clipping_fmnist"
FIXED_CLIPS = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)


def init_mlp(key, sizes):
    params = []
    for k, (a, b) in zip(jax.random.split(key, len(sizes) - 1), zip(sizes[:-1], sizes[1:])):
        params.append({"w": jax.random.normal(k, (a, b)) * math.sqrt(2.0 / a),
                       "b": jnp.zeros((b,))})
    return params


def mlp(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, y):
    logits = mlp(params, x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))


def make_local_update(batch: int, lr: float):
    """One client's FedAvg update Δ = w_E − w for one epoch of mini-batches."""

    def local_update(params, x, y, key):
        order = jax.random.permutation(key, x.shape[0])
        xb = x[order].reshape((-1, batch) + x.shape[1:])
        yb = y[order].reshape((-1, batch))

        def step(p, xy):
            g = jax.grad(loss_fn)(p, *xy)
            return jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g), None

        new, _ = jax.lax.scan(step, params, (xb, yb))
        return jax.tree_util.tree_map(jnp.subtract, new, params)

    return local_update


def build(args, z, gamma, x_clients, y_clients, x_test, y_test):
    """Jitted round functions for the adaptive (target γ) and the fixed aggregations at z."""
    local = jax.vmap(make_local_update(args.batch, args.client_lr), in_axes=(None, 0, 0, 0))
    m = args.cohort
    # The paper's C0 = 0.1, η_C = 0.2 and σ_b = m/20 (0 without noise).
    adaptive = quantile_dp_fedavg(z, m, target_unclipped_quantile=gamma)

    def server_step(params, velocity, mean):
        velocity = jax.tree_util.tree_map(lambda v, d: args.server_momentum * v + d,
                                          velocity, mean)
        params = jax.tree_util.tree_map(lambda p, v: p + args.server_lr * v, params, velocity)
        return params, velocity

    def updates_of(params, ids, key):
        keys = jax.random.split(key, ids.shape[0])
        ups = local(params, x_clients[ids], y_clients[ids], keys)
        flat = jnp.concatenate([u.reshape(ids.shape[0], -1)
                                for u in jax.tree_util.tree_leaves(ups)], axis=1)
        return ups, jnp.sqrt(jnp.sum(flat * flat, axis=1))

    @jax.jit
    def adaptive_round(params, velocity, state, ids, client_key, noise_key):
        ups, norms = updates_of(params, ids, client_key)
        mean, state, info = adaptive.apply(ups, state, key=noise_key)
        params, velocity = server_step(params, velocity, mean)
        # Evaluation only (not released): the cohort's norm quantile at the target.
        return params, velocity, state, info, jnp.quantile(norms, gamma), jnp.median(norms)

    @jax.jit
    def fixed_round(params, velocity, clip, ids, client_key, noise_key):
        # DP-FedAvg at a fixed C (McMahan et al. 2018): clip, sum, N(0, z²C²), / m.
        ups, norms = updates_of(params, ids, client_key)
        clipped, _ = jax.vmap(clip_to_quantile_estimate, in_axes=(0, None))(ups, clip)
        leaves, treedef = jax.tree_util.tree_flatten(clipped)
        keys = jax.random.split(noise_key, len(leaves))
        mean = jax.tree_util.tree_unflatten(treedef, [
            (jnp.sum(c, 0) + z * clip * jax.random.normal(k, c.shape[1:])) / m
            for c, k in zip(leaves, keys)])
        params, velocity = server_step(params, velocity, mean)
        return params, velocity, jnp.mean((norms <= clip).astype(jnp.float32)), jnp.median(norms)

    @jax.jit
    def accuracy(params):
        return jnp.mean(jnp.argmax(mlp(params, x_test), -1) == y_test)

    return adaptive, adaptive_round, fixed_round, accuracy


def run(args) -> dict:
    ds = load_dataset(args.dataset, seed=args.seed)  # synthetic needs a seed; real data ignores it
    def prep(x):
        return ((x - ds.mean) / ds.std).reshape(x.shape[0], -1).astype(np.float32)
    parts = shards(ds.y_train, args.clients, 2, args.seed)
    n = min(len(p) for p in parts)
    n -= n % args.batch
    if n < args.batch:
        raise SystemExit(f"{NAME}: {args.clients} clients leave {n} examples each, fewer than "
                         f"--batch {args.batch}")
    idx = np.stack([p[:n] for p in parts])
    x_clients = jnp.asarray(prep(ds.x_train)[idx])
    y_clients = jnp.asarray(ds.y_train[idx])
    x_test, y_test = jnp.asarray(prep(ds.x_test)), jnp.asarray(ds.y_test)
    root = jax.random.key(args.seed)
    init_key, cohort_key, client_key, noise_key = jax.random.split(root, 4)
    params0 = init_mlp(init_key, (x_clients.shape[-1], args.hidden, ds.num_classes))
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params0)
    cohorts = [np.asarray(jax.random.choice(jax.random.fold_in(cohort_key, r), args.clients,
                                            (args.cohort,), replace=False))
               for r in range(args.rounds)]
    eval_rounds = sorted(set(range(args.eval_every - 1, args.rounds, args.eval_every))
                         | {args.rounds - 1})

    q, delta = args.cohort / args.clients, 1.0 / args.clients
    rows, settings = [], []
    for z in args.noise_multipliers:
        eps = (dp_fedavg_epsilon(z, q, delta, sampled_rounds=args.rounds).epsilon if z > 0
               else None)
        configs = ([("adaptive", g, None) for g in args.quantiles]
                   + [("fixed", None, c) for c in FIXED_CLIPS])
        for kind, gamma, clip in configs:
            adaptive, adaptive_round, fixed_round, accuracy = build(
                args, z, 0.5 if gamma is None else gamma, x_clients, y_clients, x_test, y_test)
            if kind == "adaptive":
                settings.append({"noise_multiplier": z, "target_unclipped_quantile": gamma,
                                 "update_noise_multiplier": adaptive.update_noise_multiplier,
                                 "clipped_count_stddev": adaptive.clipped_count_stddev})
            name = (f"adaptive γ={gamma:g}" if kind == "adaptive" else f"fixed C={clip:g}")
            params, velocity = params0, zeros
            state = adaptive.init()
            trace, accs = [], []
            t0 = time.perf_counter()
            for r in range(args.rounds):
                ids = jnp.asarray(cohorts[r])
                ck, nk = jax.random.fold_in(client_key, r), jax.random.fold_in(noise_key, r)
                if kind == "adaptive":
                    params, velocity, state, info, quantile, median = adaptive_round(
                        params, velocity, state, ids, ck, nk)
                    trace.append({"round": r, "clip_norm": float(info["clip_norm"]),
                                  "noised_unclipped_fraction":
                                      float(info["noised_unclipped_fraction"]),
                                  "quantile_update_norm": float(quantile),
                                  "median_update_norm": float(median)})
                else:
                    params, velocity, unclipped, median = fixed_round(params, velocity, clip,
                                                                      ids, ck, nk)
                    trace.append({"round": r, "clip_norm": clip,
                                  "unclipped_fraction": float(unclipped),
                                  "median_update_norm": float(median)})
                if r in eval_rounds:
                    accs.append({"round": r, "accuracy": float(accuracy(params))})
            if not all(math.isfinite(a["accuracy"]) for a in accs):
                raise SystemExit(f"{NAME}: {name} at z={z:g} gave a non-finite accuracy")
            rows.append({"config": name, "kind": kind, "noise_multiplier": z, "epsilon": eps,
                         "target_unclipped_quantile": gamma, "clip_norm": clip,
                         "trace": trace, "accuracy": accs,
                         "final_accuracy": accs[-1]["accuracy"],
                         "mean_accuracy_last_5_evals": float(np.mean(
                             [a["accuracy"] for a in accs[-5:]])),
                         "seconds": time.perf_counter() - t0})
            print(f"z={z:g} {name}: final accuracy {accs[-1]['accuracy']:.4f}", flush=True)

    return {
        "setting": {k: v for k, v in vars(args).items() if k != "out"},
        "adaptive_settings": settings,
        "examples_per_client": int(n),
        "delta": delta, "sample_rate": q,
        "rows": rows, "device": jax.devices()[0].device_kind, **git_state(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def tracking(row, start: int) -> dict:
    """Median over rounds ≥ start of log(C_t / the cohort's target-quantile norm), and spread."""
    ratios = np.array([t["clip_norm"] / t["quantile_update_norm"] for t in row["trace"][start:]])
    logs = np.log(ratios)
    return {"median_ratio": float(np.exp(np.median(logs))),
            "q10_ratio": float(np.exp(np.quantile(logs, 0.1))),
            "q90_ratio": float(np.exp(np.quantile(logs, 0.9)))}


def markdown(result: dict) -> str:
    s = result["setting"]
    rows = result["rows"]
    start = s["rounds"] // 2
    lines = [
        "# DP-FedAvg with adaptive clipping (Andrew et al. 2021) against fixed clips",
        "",
        f"`python benchmarks/{NAME}.py{' --quick' if s['quick'] else ''}` "
        f"({result['date']}, commit {result.get('commit', '?')}"
        f"{', code differed from it' if result.get('dirty') else ''}, {result['device']}).",
        "",
        f"{s['dataset']}, {s['clients']} clients × {result['examples_per_client']} examples "
        f"(2 shards each), MLP 784-{s['hidden']}-10, m = {s['cohort']} a round, "
        f"{s['rounds']} rounds, E = 1, B = {s['batch']}, client lr {s['client_lr']}, server "
        f"momentum {s['server_momentum']} lr {s['server_lr']}, seed {s['seed']}. Every row "
        "sees the same cohorts, client keys and initial model. At each noise multiplier z "
        f"every row is accounted at z (user-level, q = {result['sample_rate']:.3g}, "
        f"δ = {result['delta']:.3g}, RDP); the adaptive rows put z_Δ on the update and σ_b "
        "on the count (below). z = 0: no noise, no DP, the count exact.",
        "",
        "## Does the clip norm track its target quantile?",
        "",
        f"Rounds {start}–{s['rounds'] - 1}. The ratio is C_t over the cohort's update-norm "
        "quantile at the target (computed for evaluation only: not released, not private); "
        "b̃ is the released noised unclipped fraction.",
        "",
        "| z | γ | z_Δ | σ_b | C_t / quantile: median (10–90 %) | mean b̃ | C at the end |",
        "|---|---|---|---|---|---|---|",
    ]
    for st in result["adaptive_settings"]:
        row = next(r for r in rows if r["kind"] == "adaptive"
                   and r["noise_multiplier"] == st["noise_multiplier"]
                   and r["target_unclipped_quantile"] == st["target_unclipped_quantile"])
        t = tracking(row, start)
        frac = np.mean([x["noised_unclipped_fraction"] for x in row["trace"][start:]])
        lines.append(f"| {st['noise_multiplier']:g} | {st['target_unclipped_quantile']:g} | "
                     f"{st['update_noise_multiplier']:.4f} | {st['clipped_count_stddev']:g} | "
                     f"{t['median_ratio']:.3f} ({t['q10_ratio']:.3f}–{t['q90_ratio']:.3f}) | "
                     f"{frac:.3f} | {row['trace'][-1]['clip_norm']:.3g} |")
    lines += ["", "## Accuracy at the same z", ""]
    for z in s["noise_multipliers"]:
        group = [r for r in rows if r["noise_multiplier"] == z]
        eps = group[0]["epsilon"]
        lines += [f"### z = {z:g} ({'no DP' if eps is None else f'ε = {eps:.3g}'})", "",
                  "| aggregation | final accuracy | mean of the last 5 evaluations | share of "
                  "updates unclipped, 2nd half (adaptive: the noised b̃) | seconds |",
                  "|---|---|---|---|---|"]
        for row in group:
            key = ("noised_unclipped_fraction" if row["kind"] == "adaptive"
                   else "unclipped_fraction")
            share = np.mean([t[key] for t in row["trace"][start:]])
            lines.append(f"| {row['config']} | {row['final_accuracy']:.4f} | "
                         f"{row['mean_accuracy_last_5_evals']:.4f} | {share:.3f} | "
                         f"{row['seconds']:.1f} |")
        fixed = [r for r in group if r["kind"] == "fixed"]
        best = max(fixed, key=lambda r: r["mean_accuracy_last_5_evals"])
        edge = best["clip_norm"] in (min(FIXED_CLIPS), max(FIXED_CLIPS))
        lines += ["", f"Best fixed clip: {best['config']} "
                  f"({best['mean_accuracy_last_5_evals']:.4f}"
                  f"{', at the edge of the grid' if edge else ''}); "
                  + "; ".join(f"{r['config']}: {r['mean_accuracy_last_5_evals']:.4f} "
                              f"({r['mean_accuracy_last_5_evals'] - best['mean_accuracy_last_5_evals']:+.4f})"
                              for r in group if r["kind"] == "adaptive")
                  + ". One seed.", ""]
    return "\n".join(lines)


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    zs = result["setting"]["noise_multipliers"]
    fig, axes = plt.subplots(2, len(zs), figsize=(5 * len(zs), 8), squeeze=False)
    for col, z in enumerate(zs):
        group = [r for r in rows if r["noise_multiplier"] == z]
        top, bottom = axes[0][col], axes[1][col]
        for row in (r for r in group if r["kind"] == "adaptive"):
            tr = row["trace"]
            line, = top.plot([t["round"] for t in tr], [t["clip_norm"] for t in tr],
                             label=f"C_t, {row['config']}")
            top.plot([t["round"] for t in tr], [t["quantile_update_norm"] for t in tr],
                     color=line.get_color(), alpha=0.4, ls="--",
                     label="cohort's γ-quantile norm (not released)")
        top.set_yscale("log")
        top.set_xlabel("round")
        top.set_title(f"z = {z:g}: clip norm against its target")
        top.legend(fontsize=7)
        for row in group:
            bottom.plot([e["round"] for e in row["accuracy"]],
                        [e["accuracy"] for e in row["accuracy"]], label=row["config"],
                        lw=2.5 if row["kind"] == "adaptive" else 1.0)
        eps = group[0]["epsilon"]
        bottom.set_title(f"z = {z:g}, " + ("no DP" if eps is None else f"ε = {eps:.3g}"))
        bottom.set_xlabel("round")
        bottom.set_ylabel("test accuracy")
        bottom.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="60 rounds instead of 300")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--dataset", default="fashion_mnist")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--clients", type=int, default=1200)
    ap.add_argument("--cohort", type=int, default=100)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--client-lr", type=float, default=0.1)
    ap.add_argument("--server-lr", type=float, default=1.0)
    ap.add_argument("--server-momentum", type=float, default=0.9)
    ap.add_argument("--noise-multipliers", type=float, nargs="+", default=[0.0, 0.3, 1.0],
                    help="z values; every configuration runs at each")
    ap.add_argument("--quantiles", type=float, nargs="+", default=[0.5, 0.1],
                    help="target unclipped quantiles γ of the adaptive rows (paper: 0.5)")
    ap.add_argument("--eval-every", type=int, default=10)
    args = ap.parse_args(argv)
    if args.rounds is None:
        args.rounds = 60 if args.quick else 300
    for name in ("rounds", "clients", "cohort", "hidden", "batch", "eval_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if any(not 0 <= g <= 1 for g in args.quantiles):
        ap.error(f"--quantiles must lie in [0, 1], got {args.quantiles}")
    if any(not z >= 0 for z in args.noise_multipliers):
        ap.error(f"--noise-multipliers must be >= 0, got {args.noise_multipliers}")
    if args.cohort > args.clients:
        ap.error(f"--cohort {args.cohort} is larger than --clients {args.clients}")
    result = run(args)
    out = pathlib.Path(args.out)
    name = NAME + ("_quick" if args.quick else "")
    write_json_and_markdown(out, name, result, markdown(result))
    plot(result, out / f"{name}.png")
    return result


if __name__ == "__main__":
    main()
