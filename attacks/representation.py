"""Class-wise representation inference from FC-layer updates (paper 003 App. A).

Implements Sun et al. (Soteria, CVPR 2021) §3.2 and Appendix A:

* **Alg. 3** (last layer): the per-class row norms ‖∇W_i‖₂ of the last FC
  layer's update peak at the classes the client trained on; the class-i
  representation entering that layer is, up to a scale γ, the row ∇W_i.
  "Peaks" is not made precise in the paper; our rules: classes whose row norm
  is ≥ ``peak_ratio`` × the largest row norm (default 0.3), or, with
  ``rule="gap"``, the classes before the largest ratio between consecutive
  sorted row norms when that ratio is ≥ ``min_gap`` (default 2) and ALL
  classes when no gap stands out (a client holding every class, e.g. IID);
  or the ``num_classes_present`` largest if the caller knows how many.
* **Alg. 4** (previous FC layers): given the class representation b′ inferred
  at the *next* layer's input, take the M entries of b′ with the largest
  magnitude and sum those rows of this layer's update: r̂ = Σ_{k∈M} ∇W_k.

Layout note: flax kernels are [in, out], so the paper's row ``∇W_i`` (PyTorch
[out, in]) is our column ``kernel[:, i]``. Works equally on a gradient or on
an update Δ (a scale change).

Metric (paper 003 §3.2 "cor"): the correlation coefficient between the true
class representation (the mean of the class's inputs to the layer) and the
inferred one. We use |Pearson correlation|: the scale γ is unknown and its
sign is negative for a gradient's label row (positive for an update
Δ = −lr·∇), and the rows Alg. 4 sums carry the signs of ∂l/∂b_k, so the sign
carries no information about the attack's success (stated choice; the paper
reports positive values). ``absolute=False`` gives the signed coefficient.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np


def row_norms(kernel_update) -> np.ndarray:
    """‖∇W_i‖₂ per output unit i of a flax kernel update [in, out].

    Raises:
      ValueError: for a kernel that is not 2-D, or not finite (a NaN row norm
        would drop out of every comparison: no class, or a wrong one).
    """
    k = np.asarray(kernel_update, np.float64)
    if k.ndim != 2:
        raise ValueError(f"expected a 2-D FC kernel [in, out], got shape {k.shape}")
    if not np.all(np.isfinite(k)):
        raise ValueError(f"the FC kernel update [in, out] = {list(k.shape)} is NaN/inf at "
                         f"{int(np.size(k) - np.isfinite(k).sum())} entries; representation "
                         f"inference needs a finite update")
    return np.linalg.norm(k, axis=0)


def infer_classes(last_kernel_update, peak_ratio: float = 0.3,
                  num_classes_present: int | None = None, rule: str = "ratio",
                  min_gap: float = 2.0) -> np.ndarray:
    """Alg. 3 steps 1–2: the classes whose row norms peak (ascending order).

    Args:
      last_kernel_update: the last FC layer's kernel update [in, out].
      peak_ratio: ``rule="ratio"``: keep classes with norm ≥ peak_ratio × max.
      num_classes_present: keep exactly this many largest (overrides ``rule``).
      rule: "ratio" (above) or "gap": sort the row norms in decreasing order;
        if the largest ratio between consecutive ones is ≥ ``min_gap``, keep
        the classes ranked before it; otherwise no gap stands out and every
        class is a peak: all C classes are returned (a client that holds
        every class, e.g. an IID one, has no small rows).
      min_gap: ``rule="gap"``: the smallest ratio that counts as a gap
        (≥ 1; default 2: the next row norm is at most half the previous one;
        1 always cuts, i.e. never returns all C classes).
    """
    norms = row_norms(last_kernel_update)
    if num_classes_present is not None:
        return np.sort(np.argsort(-norms)[:num_classes_present])
    if rule == "gap":
        return np.sort(_gap_cut(norms, min_gap)[0])
    if rule != "ratio":
        raise ValueError(f"rule must be 'ratio' or 'gap', got {rule!r}")
    if not 0.0 < peak_ratio <= 1.0:
        raise ValueError(f"peak_ratio must be in (0, 1], got {peak_ratio}")
    return np.flatnonzero(norms >= peak_ratio * norms.max())


def _gap_cut(norms: np.ndarray, min_gap: float) -> tuple[np.ndarray, float]:
    """The gap rule of :func:`infer_classes`: (classes kept, largest consecutive ratio)."""
    if not min_gap >= 1.0:
        raise ValueError(f"min_gap must be >= 1, got {min_gap}")
    order = np.argsort(-norms)
    if norms.size < 2:
        return order, float("inf")
    ranked = norms[order]
    ratios = ranked[:-1] / np.maximum(ranked[1:], 1e-30)
    i = int(np.argmax(ratios))
    if ratios[i] < min_gap:  # no gap stands out: every class is a peak
        return order, float(ratios[i])
    return order[:i + 1], float(ratios[i])


def largest_gap_ratio(last_kernel_update) -> float:
    """The largest ratio between consecutive sorted row norms (the gap rule's statistic)."""
    return _gap_cut(row_norms(last_kernel_update), 1.0)[1]


def previous_layer_representation(kernel_update, next_representation, num_top: int) -> np.ndarray:
    """Alg. 4: r̂ = Σ over the ``num_top`` largest-|b′| entries k of row ∇W_k."""
    k = np.asarray(kernel_update, np.float64)
    b = np.asarray(next_representation, np.float64).ravel()
    if k.ndim != 2 or k.shape[1] != b.size:
        raise ValueError(f"kernel update {k.shape} does not feed a representation of size {b.size}")
    idx = np.argsort(-np.abs(b))[:max(1, int(num_top))]
    return k[:, idx].sum(axis=1)


def infer_representations(fc_kernel_updates: Sequence, *, num_top: int = 10,
                          peak_ratio: float = 0.3, num_classes_present: int | None = None,
                          classes: Sequence[int] | None = None) -> dict[int, list[np.ndarray]]:
    """Infer every class's representation at the input of every FC layer.

    Args:
      fc_kernel_updates: the FC layers' kernel updates (or gradients), first to
        last; consecutive layers must chain (out of layer l = in of layer l+1).
      num_top: M of Alg. 4.
      peak_ratio, num_classes_present: the class-peak rule of Alg. 3.
      classes: the classes to infer for (skips Alg. 3's detection).

    Returns:
      ``{class: [r̂ at the input of layer 0, ..., r̂ at the input of the last layer]}``.
    """
    if not fc_kernel_updates:
        raise ValueError("fc_kernel_updates is empty")
    layers = [np.asarray(k, np.float64) for k in fc_kernel_updates]
    for a, b in zip(layers, layers[1:]):
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise ValueError(f"FC kernels do not chain: {a.shape} then {b.shape}")
    last = layers[-1]
    cls = np.asarray(classes) if classes is not None else infer_classes(
        last, peak_ratio, num_classes_present)
    out = {}
    for c in cls.tolist():
        reps = [last[:, c]]
        for k in reversed(layers[:-1]):
            reps.insert(0, previous_layer_representation(k, reps[0], num_top))
        out[int(c)] = reps
    return out


def representation_correlation(true_representation, inferred_representation,
                               absolute: bool = True) -> float:
    """paper 003's ``cor``: |Pearson correlation| of two representation vectors.

    ``absolute=False`` gives the signed Pearson coefficient (NaN-free: 0 for a
    constant vector).

    Raises:
      ValueError: for vectors of different sizes, or a NaN/inf entry.
    """
    a = np.asarray(true_representation, np.float64).ravel()
    b = np.asarray(inferred_representation, np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"representation shapes differ: {a.shape} vs {b.shape}")
    for what, v in (("true", a), ("inferred", b)):
        if not np.all(np.isfinite(v)):
            raise ValueError(f"the {what} representation is NaN/inf at "
                             f"{int(v.size - np.isfinite(v).sum())} of {v.size} entries")
    a, b = a - a.mean(), b - b.mean()
    den = np.linalg.norm(a) * np.linalg.norm(b)
    if den <= 0:
        return 0.0
    r = float(a @ b / den)
    return abs(r) if absolute else r


def fc_kernels(tree, names: Sequence[str]) -> list:
    """Pick ``tree[name]["kernel"]`` for each FC module name (params or an update)."""
    missing = [n for n in names if n not in tree or "kernel" not in tree[n]]
    if missing:
        raise ValueError(f"FC modules {missing} not found; modules: {list(tree)}")
    return [jnp.asarray(tree[n]["kernel"]) for n in names]
