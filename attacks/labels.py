"""Label inference from the last layer's gradient (usable by every attack).

Two rules, chosen by batch size:

* **iDLG** (Zhao et al. 2020, "iDLG: Improved Deep Leakage from Gradients",
  §3): for one example with softmax cross-entropy, the last layer's gradient is
  dL/dW[:, c] = h·(p_c − 1[c = y]) and dL/db_c = p_c − 1[c = y]. The bias
  gradient's only negative entry is the true class whatever h is; the kernel's
  column sums need non-negative features h (sigmoid or ReLU before the last
  layer). Rule used: ``argmin`` of the bias gradient if the last layer has a
  bias, else ``argmin`` of the kernel's column sums (bias-free layers such as
  paper 001's MLP, sigmoid features; ``lenet5_1998``'s tanh features reach a
  last layer with a bias).
* **Count-based batch inference** (in the spirit of LLG+, Wainakh et al. 2022,
  "User-Level Label Leakage from Gradients in FL", §4): for a batch of B, the
  per-class signal s_c (bias gradient, or kernel column sum) is the mean over
  examples of ‖hᵢ‖₁(p_ic − 1[yᵢ = c]). The server estimates, from the model
  alone on ``num_dummy`` uniform-noise inputs, the mean impact of one example
  of class c (a_c) and of one example of another class (b_c); then
  n_c ≈ B·(s_c − b_c)/(a_c − b_c), clipped at 0 and rounded to integers summing
  to B by largest remainder. Every class with a negative signal gets at least
  one example; where more than B classes have one (noise, or a FedAvg update's
  drift), the batch is read as one example each of the B of them with the
  largest n_c. Exact for B = 1; an estimate for larger B (its accuracy is
  reported, not assumed).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedsim import random_draws
from fedsim.client import cross_entropy
from fedsim.config import ConfigError
from fedsim.typing import Observation, Params


def observed_gradient(obs: Observation) -> Params:
    """The client's mean gradient implied by its update.

    For FedSGD, Δ = −lr·∇L exactly, so ∇L = −Δ/lr. For FedAvg with S local SGD
    steps, −Δ/(lr·S) is the average step's gradient (an approximation, exact in
    direction for S = 1); S is ``local_steps`` if granted, else 1. The cosine
    loss is scale-free, count-based label inference is not (its offset b_c is
    absolute): an attack that knows S otherwise sets ``local_steps`` first, as
    :mod:`attacks.fedavg_inversion` does with its configured S.
    """
    lr = checked_lr(obs.lr, "the observation's client learning rate lr")
    steps = obs.local_steps or 1
    scale = -1.0 / (lr * (steps if obs.algorithm != "fedsgd" else 1))
    return jax.tree_util.tree_map(lambda d: d * scale, obs.update)


def checked_lr(lr, what: str = "lr") -> float:
    """``lr`` as a float, when it is a finite number > 0 (the attacks divide by it).

    Raises:
      ValueError: for anything else (0, a negative, NaN, inf, a bool, a string),
        naming ``what``.
    """
    try:
        value = math.nan if isinstance(lr, (bool, str)) else float(lr)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{what} must be a finite number > 0 (the gradient is −update/lr), "
                         f"got {lr!r}")
    return value


def last_layer(tree: Params, num_classes: int, name: str | None = None) -> dict[str, Any]:
    """The last layer's ``{"kernel": ..., "bias": ... or None}`` in ``tree``.

    The last layer is ``tree[name]`` if given, else the last top-level module
    (in definition order) with a 2-D kernel whose last dimension is
    ``num_classes``.

    Raises:
      ValueError: if no such layer exists (name the layer with ``last_layer``).
    """
    if name is not None:
        if name not in tree:
            # A ConfigError (a ValueError) naming the setting: `fedsim attack` reports it
            # in one line, where a bare ValueError was a traceback.
            raise ConfigError(f"attack.config.last_layer: {name!r} is not a module of the "
                              f"model (last_layer {name!r} not in params); modules: {list(tree)}")
        layer = tree[name]
    else:
        layer = None
        for mod in tree.values():
            if isinstance(mod, dict) and "kernel" in mod and mod["kernel"].ndim == 2 \
                    and mod["kernel"].shape[-1] == num_classes:
                layer = mod
        if layer is None:
            raise ValueError("could not find a last layer: no top-level Dense kernel with "
                             f"{num_classes} outputs; pass the module name as 'last_layer'")
    return {"kernel": layer["kernel"], "bias": layer.get("bias")}


def class_signal(grad: Params, num_classes: int, name: str | None = None) -> jax.Array:
    """Per-class signal s_c: bias gradient, or the kernel gradient's column sums."""
    layer = last_layer(grad, num_classes, name)
    if layer["bias"] is not None:
        return jnp.asarray(layer["bias"])
    return jnp.sum(jnp.asarray(layer["kernel"]), axis=0)


def idlg_label(grad: Params, num_classes: int, name: str | None = None) -> jax.Array:
    """iDLG: the label of a single example = argmin of the class signal."""
    return jnp.argmin(class_signal(grad, num_classes, name)).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(0, 2, 3, 5, 6))
def _impacts(apply_fn, params, input_shape, num_classes, key, num_dummy, name):
    """Mean signal of one example of class c (a_c) / of another class (b_c)."""
    # Flat: the same bits, compiles faster; float32 whatever jax_enable_x64.
    x = random_draws.uniform(key, (num_dummy, *input_shape), jnp.float32)

    def per_example(xi, yi):
        g = jax.grad(lambda p: cross_entropy(apply_fn(p, xi[None]), yi[None])[0])(params)
        return class_signal(g, num_classes, name)

    # Label 0 for every dummy: s_i = ‖hᵢ‖₁(pᵢ − e₀), so the impact of class c as
    # label is s_ic − ‖hᵢ‖₁ and as non-label s_ic (c ≠ 0); ‖hᵢ‖₁ = Σ_c |s_ic| / Σ_c |p_ic − e₀c|.
    s = jax.vmap(per_example)(x, jnp.zeros((num_dummy,), jnp.int32))
    p = jax.nn.softmax(apply_fn(params, x), axis=-1)
    pe = p - jax.nn.one_hot(0, num_classes, dtype=p.dtype)
    hnorm = jnp.sum(jnp.abs(s), -1) / jnp.maximum(jnp.sum(jnp.abs(pe), -1), 1e-12)
    non_label = hnorm[:, None] * p          # ‖h‖ p_c
    a = jnp.mean(non_label - hnorm[:, None], 0)
    b = jnp.mean(non_label, 0)
    return a, b


def largest_remainder(est: np.ndarray, total: int) -> np.ndarray:
    """Round non-negative reals to integers summing to ``total``."""
    est = np.maximum(np.asarray(est, np.float64), 0.0)
    if est.sum() <= 0:
        est = np.ones_like(est)
    est = est * (total / est.sum())
    counts = np.floor(est).astype(np.int64)
    rest = total - counts.sum()
    order = np.argsort(-(est - counts), kind="stable")
    counts[order[:rest]] += 1
    return counts


def infer_label_counts(grad: Params, apply_fn, params: Params, batch_size: int,
                       input_shape, num_classes: int, key, *, num_dummy: int = 64,
                       name: str | None = None) -> np.ndarray:
    """Count-based label inference for a batch (see module docstring).

    Returns:
      int64 [num_classes] estimated number of examples of each class (sums to
      ``batch_size``).

    Raises:
      ValueError: when the last layer's gradient is not finite.
    """
    s = np.asarray(class_signal(grad, num_classes, name), np.float64)
    if not np.all(np.isfinite(s)):
        # argmin of a NaN signal is class 0, and NaN counts round to negative
        # integers: either way a label that means nothing.
        raise ValueError(f"label inference: the observed update's last layer is NaN/inf "
                         f"(class signal {np.array2string(s, precision=3)}); no label can be "
                         f"read from a non-finite upload")
    if batch_size == 1:
        counts = np.zeros(num_classes, np.int64)
        counts[int(np.argmin(s))] = 1
        return counts
    a, b = (np.asarray(v, np.float64) for v in
            _impacts(apply_fn, params, tuple(input_shape), num_classes, key, num_dummy, name))
    est = batch_size * (s - b) / np.minimum(a - b, -1e-12)
    present = s < 0
    if present.sum() > batch_size:
        # Flooring every present class at 1 would make them all tie, and the
        # rounding would then keep the lowest class ids, not the likeliest.
        keep = np.argsort(-np.where(present, est, -np.inf), kind="stable")[:batch_size]
        counts = np.zeros(num_classes, np.int64)
        counts[keep] = 1
        return counts
    est = np.where(present, np.maximum(est, 1.0), np.maximum(est, 0.0))
    counts = largest_remainder(est, batch_size)
    # Largest remainder can drop a certainly-present class when B is small.
    for c in np.flatnonzero(present & (counts == 0)):
        donor = int(np.argmax(counts))
        if counts[donor] > 1:
            counts[donor] -= 1
            counts[c] += 1
    return counts


def infer_labels(obs: Observation, batch_size: int, key, *, num_dummy: int = 64,
                 name: str | None = None) -> jax.Array:
    """Labels for a victim's batch from its upload: iDLG for B = 1, else counts.

    Returns:
      int32 [batch_size] labels in ascending class order (a batch's labels are
      recoverable only as a multiset).
    """
    grad = observed_gradient(obs)
    counts = infer_label_counts(grad, obs.apply_fn, obs.params, batch_size, obs.input_shape,
                                obs.num_classes, key, num_dummy=num_dummy, name=name)
    return jnp.asarray(np.repeat(np.arange(obs.num_classes), counts), jnp.int32)
