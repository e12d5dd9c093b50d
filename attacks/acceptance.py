"""Shared setup of the acceptance experiments (IG / DLG, batch 1, real Fashion-MNIST).

Used by ``benchmarks/attack_acceptance.py`` and the slow tests: an untrained
model (init key ``jax.random.key(init_seed)``, 0 by default), FedSGD uploads
Δ = −lr·∇L of single real training images, labels NOT granted (inferred by
iDLG), and the reconstructions scored with :mod:`attacks.metrics`.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from attacks import dlg, inverting_gradients
from attacks.api import observation_from_gradient
from attacks.metrics import score_batch
from fedsim.client import masked_mean_loss
from fedsim.keys import experiment_key
from fedsim.models import build_model, init_params, make_apply_fn

ATTACKS = {"inverting_gradients": inverting_gradients.run_many, "dlg": dlg.run_many}

#: Name of the attack's key stream (:func:`fedsim.keys.experiment_key`).
ATTACK_STREAM = "acceptance/attack"


def attack_key(seed: int):
    """The key the attacks of seed ``seed`` draw their initialisations from.

    A named stream, not ``jax.random.key(seed)``: that is the key the model is
    initialised from at the default ``init_seed == seed == 0``, and the attack's
    dummies must not reuse the draws that made the weights (until Nov 28 2026
    they did).
    """
    return experiment_key(seed, ATTACK_STREAM)


def fedsgd_observations(dataset, model_name: str, victims: int, *, init_seed: int,
                        batch_size: int = 1, lr: float = 0.1, first_index: int = 0):
    """Observations (labels not granted) of ``victims`` clients on real data.

    Victim v holds training images [first + v·B, first + (v+1)·B). The model is
    initialised from ``jax.random.key(init_seed)``, which the caller names (it
    had a silent default of 0, so a benchmark's ``--seed`` left the model as it
    was while its results said "seed S").
    """
    model = build_model(model_name, dataset.num_classes)
    apply_fn = make_apply_fn(model)
    params = init_params(model, dataset.input_shape, jax.random.key(init_seed))
    grad_fn = jax.jit(jax.grad(masked_mean_loss, argnums=1), static_argnums=0)
    obs, xs, ys = [], [], []
    for v in range(victims):
        lo = first_index + v * batch_size
        x = jnp.asarray(dataset.x_train[lo:lo + batch_size])
        y = jnp.asarray(dataset.y_train[lo:lo + batch_size], jnp.int32)
        g = grad_fn(apply_fn, params, x, y, jnp.ones(batch_size))
        obs.append(observation_from_gradient(g, params, apply_fn, input_shape=dataset.input_shape,
                                             num_classes=dataset.num_classes, lr=lr,
                                             batch_size=batch_size))
        xs.append(np.asarray(x))
        ys.append(np.asarray(y))
    return obs, xs, ys


def attack_and_score(attack: str, observations, xs, ys, config: dict, seed: int) -> dict:
    """Run ``attack`` on all victims at once; per-victim and mean scores."""
    t0 = time.perf_counter()
    recs = ATTACKS[attack](observations, config, attack_key(seed))
    seconds = time.perf_counter() - t0
    victims = []
    for r, x, y in zip(recs, xs, ys):
        s = score_batch(np.asarray(r.x), x, np.asarray(r.labels), y).as_dict()
        s["loss"] = float(r.loss)
        victims.append(s)
    mean = {k: float(np.mean([v[k] for v in victims])) for k in ("mse", "psnr", "ssim", "label_acc")}
    return {"victims": victims, "mean": mean, "min_psnr": float(min(v["psnr"] for v in victims)),
            "seconds": seconds}
