"""Why does undefended GS fail on the untrained ConvNet? (issue 8, GS side)

Our GS (Inverting Gradients) reaches only ~13.5 dB against NO defense on the
untrained ConvNet of the Soteria reproduction, at 120, 600 and 24,000
iterations (``soteria_gs_architecture``, ``soteria_gs_quick_24k``), so no
defense can look 10× better than another there. The authors' GS setup
(jeremy313/Soteria ``GS_attack/reconstruct_image.py`` with inversefed, read,
not copied) differs from ours in ways that could matter:

* **model initialisation**: PyTorch's default, kernel AND bias drawn from
  U(±1/√fan_in), where our ``convnet`` uses flax's LeCun normal kernels and
  zero biases (and He normal is what made our VGG trainable,
  ``benchmarks/diagnose_vgg_init.py``);
* **input scaling**: inversefed feeds the model standardised images
  ((x − mean)/std per channel) and attacks in that space with the box
  constraint mapped back to pixels; ours feeds [0, 1] pixels;
* **attack prior and start**: TV weight 1e-4 and a Gaussian start, where ours
  uses TV 1e-6 and a uniform start;
* batch norm in eval mode at its initial running statistics, an identity up
  to ε, so it is left out here.

This script crosses the three factors (model init × input scaling × attack
settings) on one ConvNet, no defense, the same victims, the same attack key
per victim (so the same dummy start wherever the start rule is the same), and
reports MSE / PSNR in pixel space, the final attack loss, and two properties
of the attacked gradient per init: the share of its squared norm in the FC
layer (what Soteria changes) and the std of the FC layer's input features
(the representation; it vanishes when the signal dies through the ReLU
stack). Standardisation is a fixed first step inside the model
(``apply(params, (x − m)/s)``), so the attack, its box [0, 1] and the metric
stay in pixel space. inversefed's step size 0.1 in standardised units is
0.1·s pixels: the attack's step is a fourth factor (lr 0.1 or 0.1·s), crossed
with the others so that a better cell can be told apart from a smaller step.

Attacked upload: one test image's FedSGD gradient (unit lr, batch 1), label
inferred from the upload, as in ``reproduce_sun2021.attack_grid``.

Usage:
  python -m benchmarks.diagnose_gs_convnet [--width 8 --image-size 16
      --iterations 2000 --victims 4]

Writes benchmarks/results/gs_convnet_diagnosis.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attacks import inverting_gradients  # noqa: E402
from attacks.api import observation_from_gradient  # noqa: E402
from attacks.metrics import mse as mse_metric, psnr as psnr_metric  # noqa: E402
from benchmarks.provenance import git_commit  # noqa: E402
from defenses.soteria import representation  # noqa: E402
from fedsim.client import masked_mean_loss  # noqa: E402
from fedsim.keys import experiment_key, numpy_generator  # noqa: E402
from fedsim.models import ConvNet  # noqa: E402

INITS = ("lecun", "he", "torch")
SCALINGS = ("pixel", "standardised")
ATTACKS = {"ours": {"tv": 1e-6, "init": "uniform"},
           "authors": {"tv": 1e-4, "init": "gaussian"}}
# The attack's Adam step: 0.1 pixel units (ours) or 0.1 standardised units,
# i.e. 0.1 × the pixel std (inversefed's lr 0.1 on standardised images).
STEPS = ("pixel", "standardised")


def reinit(params, scheme: str, key):
    """Redraw every kernel (and bias) of ``params`` by ``scheme``.

    ``lecun`` keeps flax's init (LeCun normal kernels, zero biases); ``he``
    draws kernels N(0, 2/fan_in), biases zero; ``torch`` draws kernel and bias
    from U(±1/√fan_in), PyTorch's default for Conv2d/Linear (kaiming_uniform
    with a = √5 gives exactly that bound). fan_in = the kernel's size without
    its output axis.
    """
    if scheme == "lecun":
        return params
    if scheme not in INITS:
        raise ValueError(f"init scheme {scheme!r}; allowed: {', '.join(INITS)}")
    out = {}
    for i, (name, layer) in enumerate(sorted(params.items())):
        kernel = layer["kernel"]
        fan_in = int(np.prod(kernel.shape[:-1]))
        kk, kb = jax.random.split(jax.random.fold_in(key, i))
        if scheme == "he":
            new = {"kernel": jnp.sqrt(2.0 / fan_in) * jax.random.normal(kk, kernel.shape),
                   "bias": jnp.zeros_like(layer["bias"])}
        else:
            bound = 1.0 / np.sqrt(fan_in)
            new = {"kernel": jax.random.uniform(kk, kernel.shape, minval=-bound, maxval=bound),
                   "bias": jax.random.uniform(kb, layer["bias"].shape, minval=-bound,
                                              maxval=bound)}
        out[name] = new
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=16)
    ap.add_argument("--victims", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--inits", default=",".join(INITS))
    ap.add_argument("--scalings", default=",".join(SCALINGS))
    ap.add_argument("--attacks", default=",".join(ATTACKS))
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args(argv)
    if a.seed < 0:
        ap.error(f"--seed must be >= 0, got {a.seed}")
    for name in ("width", "image_size", "victims", "iterations"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    choices = {"inits": INITS, "scalings": SCALINGS, "attacks": tuple(ATTACKS), "steps": STEPS}
    picked = {}
    for opt, allowed in choices.items():
        vals = [v.strip() for v in getattr(a, opt).split(",") if v.strip()]
        if not vals or any(v not in allowed for v in vals):
            ap.error(f"--{opt}: a comma-separated subset of {', '.join(allowed)} expected, "
                     f"got {getattr(a, opt)!r}")
        picked[opt] = vals

    commit = git_commit()  # at start: the code this process loaded
    t0 = time.perf_counter()
    from fedsim.data import load_dataset
    ds = load_dataset("fashion_mnist", image_size=a.image_size)
    mean, std = float(np.mean(ds.x_train)), float(np.std(ds.x_train))
    victims = numpy_generator(a.seed, "gs_convnet_diagnosis/victims").choice(
        len(ds.x_test), a.victims, replace=False).tolist()
    xs = [jnp.asarray(ds.x_test[v:v + 1]) for v in victims]
    ys = [jnp.asarray(ds.y_test[v:v + 1]) for v in victims]
    module = ConvNet(num_classes=ds.num_classes, width=a.width)
    base = module.init(experiment_key(a.seed, "gs_convnet_diagnosis/model"),
                       xs[0])["params"]
    attack_key = experiment_key(a.seed, "gs_convnet_diagnosis/attack")

    rows, model_stats = [], {}
    for init in picked["inits"]:
        params = reinit(base, init, experiment_key(a.seed, f"gs_convnet_diagnosis/init/{init}"))
        for scaling in picked["scalings"]:
            pre = ((lambda x: (x - mean) / std) if scaling == "standardised"
                   else (lambda x: x))
            apply_fn = (lambda p, x, _pre=pre: module.apply({"params": p}, _pre(x)))
            grads = [jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, jnp.ones(1))
                     for x, y in zip(xs, ys)]
            sq = lambda t: float(sum(jnp.sum(leaf * leaf)
                                     for leaf in jax.tree_util.tree_leaves(t)))
            model_stats[f"{init}/{scaling}"] = {
                "fc_energy_share": [sq(g["Dense_0"]) / sq(g) for g in grads],
                "grad_norm": [sq(g) ** 0.5 for g in grads],
                "fc_input_std": float(jnp.std(representation(
                    apply_fn, params, jnp.concatenate(xs), "Dense_0"))),
            }
            obs = [observation_from_gradient(g, params, apply_fn, input_shape=ds.input_shape,
                                             num_classes=ds.num_classes, lr=1.0, batch_size=1)
                   for g in grads]
            for attack, step in [(at, st) for at in picked["attacks"] for st in picked["steps"]]:
                lr = 0.1 * (std if step == "standardised" else 1.0)
                cfg = {"iterations": a.iterations, "lr": lr, **ATTACKS[attack]}
                t1 = time.perf_counter()
                recs = inverting_gradients.run_many(obs, cfg, attack_key)
                mses, psnrs = [], []
                for rec, x in zip(recs, xs):
                    xr = np.clip(np.nan_to_num(np.asarray(rec.x), nan=0.5), 0.0, 1.0)
                    mses.append(float(np.mean(mse_metric(xr, np.asarray(x)))))
                    psnrs.append(float(np.mean(psnr_metric(xr, np.asarray(x)))))
                rows.append({"init": init, "scaling": scaling, "attack": attack, "step": step,
                             "tv": cfg["tv"], "start": cfg["init"], "lr": lr,
                             "mse": float(np.mean(mses)), "psnr": float(np.mean(psnrs)),
                             "mse_per_victim": mses, "psnr_per_victim": psnrs,
                             "final_loss": [float(r.loss) for r in recs],
                             "seconds": time.perf_counter() - t1})
                print(f"[{time.perf_counter() - t0:6.0f}s] {init:5s} {scaling:12s} {attack:7s} "
                      f"lr {lr:.3g} "
                      f"MSE {rows[-1]['mse']:.4f} PSNR {rows[-1]['psnr']:.2f}", flush=True)

    command = " ".join(["python -m benchmarks.diagnose_gs_convnet"] +
                       (argv if argv is not None else sys.argv[1:]))
    res = {"command": command, "git_commit": commit, "seed": a.seed,
           "device": f"{jax.default_backend()} ({platform.machine()}, {os.cpu_count()} cpus)",
           "jax": jax.__version__, "width": a.width, "image_size": a.image_size,
           "iterations": a.iterations, "victims": victims, "pixel_mean": mean,
           "pixel_std": std, "rows": rows, "model_stats": model_stats,
           "seconds": time.perf_counter() - t0}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gs_convnet_diagnosis.json").write_text(json.dumps(res, indent=1))
    write_markdown(res, out / "gs_convnet_diagnosis.md")
    print(f"wrote {out / 'gs_convnet_diagnosis'}.json/.md")


def write_markdown(res, path):
    lines = [
        f"# Undefended GS on the untrained ConvNet (width {res['width']}, "
        f"{res['image_size']}×{res['image_size']}): model init × input scaling × attack settings",
        "",
        f"Produced by `{res['command']}` at commit {res['git_commit']} in "
        f"{res['seconds']:.0f} s, seed {res['seed']}, device {res['device']}, jax {res['jax']}. "
        f"Fashion-MNIST, {len(res['victims'])} test images {res['victims']}, one FedSGD "
        f"gradient each (batch 1, label inferred), no defense; GS = Inverting Gradients, "
        f"cosine over all layers, signed Adam with step decay, box [0, 1], "
        f"{res['iterations']} iterations, the same attack key per victim in every cell. "
        f"Standardised input: the model computes on (x − {res['pixel_mean']:.3f}) / "
        f"{res['pixel_std']:.3f}. Attack lr 0.1 (pixel units) or 0.1 × that std = "
        f"{0.1 * res['pixel_std']:.3g} (inversefed's 0.1 in standardised units). "
        "Metrics in pixel space.",
        "",
        "| model init | input | attack (TV, start) | lr | MSE | PSNR (dB) | per-victim PSNR "
        "| final loss (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['init']} | {r['scaling']} | {r['attack']} ({r['tv']:g}, {r['start']}) "
            f"| {r['lr']:.3g} | {r['mse']:.4f} | {r['psnr']:.2f} | "
            + ", ".join(f"{p:.1f}" for p in r["psnr_per_victim"])
            + f" | {np.median(r['final_loss']):.2e} |")
    lines += ["", "Gradient properties per (init, input) (mean over victims):", "",
              "| model init / input | FC share of ‖g‖² | ‖g‖ | std of FC input r |",
              "|---|---|---|---|"]
    for k, s in res["model_stats"].items():
        lines.append(f"| {k} | {np.mean(s['fc_energy_share']):.3f} | "
                     f"{np.mean(s['grad_norm']):.3g} | {s['fc_input_std']:.3g} |")
    lines += ["", "lecun = flax default (LeCun normal kernels, zero biases; our `convnet`); "
              "he = He normal kernels, zero biases; torch = kernel and bias U(±1/√fan_in) "
              "(PyTorch's default, what the authors' inversefed ConvNet starts from)."]
    Path(path).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
