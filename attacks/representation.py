"""Class-wise representation inference from FC-layer updates (paper 003 App. A).

Sun et al. 2021 (Soteria) §3, App. A (paper 004), Alg 3–4. Threat model: an
honest-but-curious server holding one client's upload Δ (FedAvg or FedSGD).

* Alg 3 (last layer): with softmax cross-entropy, ∂l/∂b has a single negative
  "peak" at the example's class c, so the update of the last layer's weights
  for class c is dominated by the representations of the client's class-c
  examples: r̂_c = ΔW[:, c] (flax kernels are [L_in, L_out], so the paper's
  row i of ∇W is our column i) up to a scale γ. The client's classes are the
  peaks of {‖ΔW[:, i]‖₂} (here: the classes before the largest relative drop
  of the sorted norms).
* Alg 4 (previous FC layers): given r̂ inferred in the layer after (the
  activation output b̄ of this layer), pick the M entries of b̄ with the
  largest magnitude and sum this layer's update columns at those indices:
  r̂ = Σ_{k∈M} ΔW[:, k].
* ``cor``: the Pearson correlation coefficient between the true mean
  representation of the client's class-c training data (computed at the
  round's global parameters) and r̂_c — the metric of Table 1.

Guarantee: none (a heuristic inference attack). Deviation: the paper does
not say how "significantly larger" peaks are picked nor which M it uses; the
largest-relative-gap rule and M are ours, stated as parameters.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _kernel(update, path: Sequence[str]) -> np.ndarray:
    node = update
    for part in path:
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"representation inference: no layer {'/'.join(path)!r} in the update")
        node = node[part]
    if "kernel" not in node or np.ndim(node["kernel"]) != 2:
        raise ValueError(f"representation inference: layer {'/'.join(path)!r} is not a Dense layer")
    return np.asarray(node["kernel"], np.float64)


def infer_classes(last_kernel_update) -> np.ndarray:
    """Alg 3 lines 1–2: the client's classes, the peaks of ‖ΔW[:, i]‖₂.

    Peaks are the classes ranked before the largest ratio between consecutive
    sorted column norms.

    Returns:
      int array of class indices (sorted).
    """
    norms = np.linalg.norm(np.asarray(last_kernel_update, np.float64), axis=0)
    order = np.argsort(-norms)
    sorted_norms = norms[order]
    ratios = sorted_norms[:-1] / np.maximum(sorted_norms[1:], 1e-30)
    cut = int(np.argmax(ratios)) + 1
    return np.sort(order[:cut])


def infer_last_layer(last_kernel_update) -> np.ndarray:
    """Alg 3 line 3: r̂_c = ΔW[:, c] for every class c: [K, L]."""
    return np.asarray(last_kernel_update, np.float64).T


def infer_previous_layer(kernel_update, next_representation, num_units: int) -> np.ndarray:
    """Alg 4: r̂ = Σ_{k ∈ top-M |b̄|} ΔW[:, k] for this layer ([L_in]).

    Args:
      kernel_update: [L_in, L_out] this layer's weight update.
      next_representation: [L_out] the r̂ inferred for the layer after (b̄).
      num_units: M, how many of b̄'s largest-magnitude entries to use.
    """
    kernel_update = np.asarray(kernel_update, np.float64)
    b = np.asarray(next_representation, np.float64)
    if b.shape != (kernel_update.shape[1],):
        raise ValueError(f"infer_previous_layer: next representation shape {b.shape} does not "
                         f"match the layer's {kernel_update.shape[1]} outputs")
    if not 1 <= num_units <= b.size:
        raise ValueError(f"infer_previous_layer: M={num_units} must be in [1, {b.size}]")
    top = np.argsort(-np.abs(b))[:num_units]
    return kernel_update[:, top].sum(axis=1)


def infer_representations(update, layers: Sequence[Sequence[str]], classes,
                          num_units: int = 5) -> dict[int, list[np.ndarray]]:
    """Alg 3 + Alg 4 backwards through consecutive Dense layers.

    Args:
      update: the client's uploaded update (pytree of flax params).
      layers: param paths of consecutive Dense layers, first to last
        (e.g. ``[("Dense_0",), ("Dense_1",), ("Dense_2",)]`` for LeNet-5).
      classes: the classes to infer (e.g. :func:`infer_classes`' output).
      num_units: M of Alg 4.

    Returns:
      {class: [r̂ at layers[0], ..., r̂ at layers[-1]]} (each the input
      representation of that layer, up to scale).
    """
    kernels = [_kernel(update, tuple(p)) for p in layers]
    last = infer_last_layer(kernels[-1])
    out = {}
    for c in np.asarray(classes).tolist():
        reps = [last[c]]
        for k in reversed(kernels[:-1]):
            reps.insert(0, infer_previous_layer(k, reps[0], min(num_units, k.shape[1])))
        out[int(c)] = reps
    return out


def correlation(a, b) -> float:
    """Pearson correlation coefficient of two vectors (Table 1's ``cor``).

    Returns NaN if either vector is constant (correlation undefined).
    """
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"correlation: shapes {a.shape} and {b.shape} differ")
    a, b = a - a.mean(), b - b.mean()
    denom = np.sqrt(np.sum(a * a) * np.sum(b * b))
    return float(np.sum(a * b) / denom) if denom > 0 else float("nan")
