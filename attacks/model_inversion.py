"""Model inversion (Fredrikson et al. 2015) as run in paper 000 §6.1.

Paper 000 §6.1 "Data Reconstruction Attack": start from a dummy input equal to
the mean of auxiliary images (not in the training set), optimise it for each
target label with Adam, lr 1e-2, 600 iterations; metric: MSE between the
inverted image and the centre (mean image) of its class, median over classes
(:func:`class_centre_mse`).

Objective: Fredrikson et al.'s cost c(x) = 1 − f̃_y(x) (CCS 2015, Alg 1
"MI-Face", with no auxiliary term: one minus the softmax probability of the
target label), with the box constraint x ∈ [0, 1] by projection. Steps are
Adam's, as paper 000 runs it, not Alg 1's plain gradient descent with its
image post-processing step. All target classes are inverted at once (one ``lax.scan``
``vmap``-ped over classes). The model attacked is the victim's local model
w_global + Δ (``model: local``, default: what the upload reveals) or the
global model (``model: global``).

Config keys: ``aux_images`` (required: [A, H, W, C] array of auxiliary
images, or their mean [H, W, C]), ``classes`` (default all), ``iterations``
(600), ``lr`` (1e-2), ``model`` ("local"/"global").
Guarantee: none (a heuristic attack).
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from attacks.api import Reconstruction, register_attack
from attacks.gradient_inversion import AttackConfigError, refuse_unknown_keys
from fedsim import models
from fedsim.typing import Observation
from fedsim.x64 import x64_invariant

DEFAULTS = {"aux_images": None, "classes": None, "iterations": 600, "lr": 1e-2, "model": "local"}


# ``settings`` (:func:`fedsim.models.trace_settings`) is in the jit's key so that a
# call inside ``models.im2col_max_batch`` / ``conv_implementation`` traces again
# (as attacks.membership's jits do).
@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6))
def _invert(apply_fn, params, x0, classes, iterations, lr, settings):
    opt = x64_invariant(optax.adam(lr))  # the same numbers under jax_enable_x64

    def one(c):
        def cost(x):
            return 1.0 - jax.nn.softmax(apply_fn(params, x[None]))[0, c]

        def step(carry, _):
            x, s = carry
            v, g = jax.value_and_grad(cost)(x)
            u, s = opt.update(g, s, x)
            return (jnp.clip(optax.apply_updates(x, u), 0.0, 1.0), s), v

        (x, _), _ = jax.lax.scan(step, (x0, opt.init(x0)), None, length=iterations)
        return x, cost(x)

    return jax.vmap(one)(classes)


def check_config(config: Mapping[str, Any], grants: Mapping[str, bool] | None = None
                 ) -> dict[str, Any]:
    """``config`` merged over :data:`DEFAULTS`, checked before any victim is
    observed (``fedsim attack`` calls it first). The auxiliary images' shape is
    checked against the victim's input in :func:`run`; ``grants`` are unused
    (the attack reads only the model and the update).

    Raises:
      AttackConfigError: naming the offending ``attack.config.<key>``.
    """
    del grants
    refuse_unknown_keys(config, DEFAULTS)
    cfg = {**DEFAULTS, **config}
    if cfg["aux_images"] is None:
        raise AttackConfigError("model_inversion needs attack.config.aux_images (auxiliary "
                                "images or their mean)")
    if cfg["model"] not in ("local", "global"):
        raise AttackConfigError(f"attack.config.model: {cfg['model']!r} is not allowed; "
                                "allowed: local, global")
    it = cfg["iterations"]
    if not isinstance(it, (int, np.integer)) or isinstance(it, bool) or it < 1:
        raise AttackConfigError(f"attack.config.iterations: must be a positive integer, got {it!r}")
    lr = cfg["lr"]
    if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and 0 < lr < float("inf")):
        raise AttackConfigError(f"attack.config.lr: must be a finite positive number, got {lr!r}")
    classes = cfg["classes"]
    if classes is not None and not (
            isinstance(classes, (list, tuple, np.ndarray)) and len(classes) > 0 and all(
                isinstance(c, (int, np.integer)) and not isinstance(c, bool) and c >= 0
                for c in classes)):
        raise AttackConfigError("attack.config.classes: must be a non-empty list of class "
                                f"indices (or absent, for every class), got {classes!r}")
    return cfg


@register_attack("model_inversion")
def run(observation: Observation, config: Mapping[str, Any], key) -> Reconstruction:
    """Invert the model for each target class (deterministic; ``key`` unused)."""
    del key  # the start point is the auxiliary mean: no randomness
    cfg = check_config(config)
    aux = np.asarray(cfg["aux_images"], np.float32)
    shape = tuple(observation.input_shape)
    if aux.shape == shape:
        x0 = aux
    elif aux.ndim == len(shape) + 1 and aux.shape[1:] == shape:
        x0 = aux.mean(0)
    else:
        raise AttackConfigError(f"attack.config.aux_images has shape {aux.shape}; expected "
                                f"[A, *{shape}] or {shape}")
    if cfg["classes"] is not None and max(cfg["classes"]) >= observation.num_classes:
        raise AttackConfigError(f"attack.config.classes: {max(cfg['classes'])} is not a class of "
                                f"this {observation.num_classes}-class model")
    params = observation.params
    if cfg["model"] == "local":
        params = jax.tree_util.tree_map(lambda w, d: w + d, params, observation.update)
    classes = np.arange(observation.num_classes) if cfg["classes"] is None else np.asarray(cfg["classes"])
    x, cost = _invert(observation.apply_fn, params, jnp.asarray(x0), jnp.asarray(classes, jnp.int32),
                      int(cfg["iterations"]), float(cfg["lr"]), models.trace_settings())
    if not bool(jnp.all(jnp.isfinite(x))):
        raise FloatingPointError("model inversion produced non-finite inputs; lower attack.config.lr")
    return Reconstruction(x, jnp.asarray(classes, jnp.int32), jnp.mean(cost), {"cost_per_class": cost})


run.check_config = check_config
run.config_keys = dict(DEFAULTS)
# One image per class, not the client's batch: ``fedsim attack`` (which scores
# batch reconstructions against the client's images) refuses it by this flag.
run.reconstructs_batch = False


def class_centres(x, y, num_classes: int) -> np.ndarray:
    """Mean image of each class: [num_classes, ...] (NaN for absent classes).

    Raises:
      ValueError: unless ``y`` holds one integer label per image of ``x`` (one-hot
        labels failed in a boolean index that named neither).
    """
    x, y = np.asarray(x, np.float64), np.asarray(y)
    if y.ndim != 1 or y.shape[0] != x.shape[0] or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"class_centres: y must be one integer label per image, shape "
                         f"({x.shape[0]},); got {y.dtype} of shape {y.shape}")
    return np.stack([x[y == c].mean(0) if np.any(y == c) else np.full(x.shape[1:], np.nan)
                     for c in range(num_classes)])


def class_centre_mse(x_inv, classes, centres) -> float:
    """Paper 000 §6.1: median over classes of MSE(inverted image, class centre).

    Args:
      x_inv: the inverted images, one per entry of ``classes``.
      classes: the class of each.
      centres: :func:`class_centres` of the data the classes are scored against.

    Raises:
      ValueError: a class of ``classes`` has no centre (absent from the data
        the centres come from, e.g. a non-IID client's, or out of range),
        naming them. Its NaN used to make the median NaN without a word; a
        median over the other classes only would be another metric than the
        paper's, so the caller chooses: pass only the classes that have one.
    """
    x_inv = np.asarray(x_inv, np.float64)
    centres = np.asarray(centres, np.float64)
    classes = [int(c) for c in np.asarray(classes).ravel()]
    missing = sorted({c for c in classes
                      if not (0 <= c < len(centres) and np.all(np.isfinite(centres[c])))})
    if missing:
        raise ValueError(f"class_centre_mse: class(es) {missing} have no centre (absent from "
                         "the data the centres come from); score only the classes present, "
                         "e.g. those whose class_centres are finite")
    errs = [np.mean((x_inv[i] - centres[c]) ** 2) for i, c in enumerate(classes)]
    return float(np.median(errs))
