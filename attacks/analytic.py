"""Closed-form recovery of the inputs to a biased fully connected input layer.

For a fully connected layer z = Wᵀx + b (flax kernel W of shape [D, H]) on
the flattened input, each example n contributes ∂L/∂W[:, i] = x_n·δ_ni and
∂L/∂b_i = δ_ni, with δ_ni = ∂L/∂z_ni. For one example the ratio of a unit's
kernel column to its bias entry is therefore the input itself:
x = (∂L/∂W[:, i]) / (∂L/∂b_i) for every unit i with ∂L/∂b_i ≠ 0 — the leak
Phong et al. point out to the honest-but-curious server (IEEE TIFS 2018,
"Privacy-Preserving Deep Learning via Additively Homomorphic Encryption",
§3), and Geiping et al. (NeurIPS 2020, §3) state for any fully connected
layer with a bias. Neither paper is in ``../shared/papers``; the section
numbers are the published versions'.

For a batch of B, the ratio of unit i is Σ_n δ_ni x_n / Σ_n δ_ni: exactly the
input of example n where only n reaches the unit (a ReLU unit active on that
example alone: an "exclusively activated neuron", Pan et al., USENIX
Security 2022, arXiv 2010.13356), otherwise a mixture. The server does not see which
units those are. **Our identification rule** (not Pan et al.'s algorithm,
which solves layer by layer from the exclusive units): two units exclusive
to the same example give the same ratio, and two mixtures generically do
not, so the ratios are grouped where they agree to within
``match_tolerance`` (relative Euclidean distance, single linkage); each group
of at least two units is read as one recovered input, the largest groups
first, estimated by least squares over the group's units,
x̂ = Σ_{i∈g} b_i W[:, i] / Σ_{i∈g} b_i² (b, W: the bias and kernel updates).
**Peeling (ours too)** — a recovered input's own contribution to the layer
can then be computed and taken off. The server holds the model, so for a
recovered x̂ it computes δ(x̂, y) = ∂ℓ(x̂, y)/∂b for every class y (ℓ:
softmax cross-entropy, the engine's loss), fits the one scale s and the class
y for which s·δ(x̂, y) gives the bias update of the group's units (they are
exclusive to that example, so there the update is its δ alone), and, where
that fit's relative residual is at most ``peel_tolerance``, subtracts
s·δ(x̂, y) from the bias update and x̂·s·δ(x̂, y)ᵀ from the kernel update. A
unit that example shared with one other example is then exclusive to the
other, so the grouping is run again on the remainder (the units of peeled
examples left out) until a pass peels nothing; each pass reads, largest first,
at most as many groups as examples are left to find (each group read is a
chance for a wrong group to pass the fit). Where the rule applies, a
group is marked exact only where its fit passes: one whose bias update no
single example's δ explains (in the benchmark's tolerance part most such
groups matched no example: ``benchmarks/results/analytic_attack_fmnist.md``,
"groups (false)" against "marked exact" and "false exact") is not peeled,
keeps its units for later passes (once its other examples are peeled they
may be one example's; a group read again from units that this pass's peeling
changed waits for the next pass), and holds no slot while peeling goes on:
it is returned, not marked, only where fewer than B examples were peeled, in
the order found. The fitted s absorbs the lr/B of FedSGD and a per-example
clipping factor; s and y are in ``extras``. It is
applied to uploads of one gradient step at the global model (``algorithm``
"fedsgd", or a granted ``local_steps`` of 1): local training of several steps
(FedAvg) moves the model between the steps, so one example's contribution
cannot be computed from the global model, and where the number of steps is
not granted the server cannot tell. This is not Pan et al.'s algorithm
either: it needs at least two exclusive units per example at the pass that
finds it, and an example with a single exclusive unit in every pass is still
not found. Slots of the
batch left without a group get the least-squares rank-one estimate over
every unit not in a returned group (a weighted mixture of the examples not
recovered; over all units where every unit is in a returned group, and for
B = 1 without a group, which is what a noised update gives);
``extras["exact"]`` says which slots are groups.

The ratio is scale-free, so it holds for the update Δ as for the gradient,
and for FedAvg as for FedSGD: local SGD (with or without momentum) adds
per-example terms x_n·δ_ni to the kernel and δ_ni to the bias with the same
coefficients, so a unit that only one example reached over the whole local
training still gives that input exactly. It does not hold where an update
coordinate is rescaled on its own (Adam, weight decay, pruning, noise):
the attack then returns what the ratios give, and the scores say what that is.

Config keys: ``input_layer`` (the top-level module whose kernel takes the
flattened input; default: the one module with a 2-D kernel of
prod(input_shape) rows and a bias), ``batch_size`` (else granted),
``min_bias_update`` (units whose |bias update| is below this fraction of the
largest are left out: their ratio divides by almost 0; default 1e-6),
``match_tolerance`` (1e-4; a trade of found inputs against wrong marks,
measured in ``benchmarks/results/analytic_attack_fmnist.md``, "The grouping
tolerance": on an exact float32 gradient the groups found at 1e-6 spread by
at most 1e-7, but an upload Δ = w_local − w_global subtracted in float32, as
the engine forms it, moves them by up to about 1e-4, while ratios of two
mixtures dominated by one example can agree to a few 1e-6; 1e-5 marks fewer
wrong slots on exact gradients and finds far fewer inputs in the engine's
uploads), ``label_mode``
("infer": a peeled slot's fitted class, the other slots from what is left of
:func:`attacks.labels.infer_labels`'s multiset once the fitted classes are
taken out of it; "given": the granted labels),
``peel`` (true: apply the peeling rule to one-step uploads; false: one pass),
``peel_tolerance`` (1e-3: the largest relative residual of the scale-and-class
fit for which a recovered example is peeled off; at 1e-2 and 1e-1 the
benchmark's victims give no more examples, and 1e-1 marks some wrongly,
``benchmarks/results/analytic_attack_peeling.md``, which also shows that
after training the float32 rounding of the upload, not this tolerance, is
what stops the peeling short),
``rounding_aware`` (true: two ratios agree within ``match_tolerance`` plus
their own rounding errors, :func:`ratio_rounding`, at the machine epsilon of
the update's dtype. Ours, for that float32 rounding: an update summed in
float32 carries about eps·Σ|terms| in each entry, and peeling takes an
example's terms off but not their rounding, so a later example whose own
terms are far smaller sees its ratios moved far more than eps. It covers the
rounding of the sum, not the ~1e-4 of an upload Δ = w_local − w_global,
which ``match_tolerance`` covers. A group's estimate and peeling fit then read
its units whose own error is within ``match_tolerance``, where it has two or
more; false: ``match_tolerance`` alone).
Loss: the relative residual ‖ΔW − X̂ᵀA‖_F / ‖ΔW‖_F of the kernel update
after the best A (least squares): 0 when the returned inputs span every
column, as they do for a fully recovered noiseless batch.
Guarantee: none proven. In a noiseless FedSGD or FedAvg-SGD update a group of
exclusive units gives its example to within float rounding; that the slots
marked ``exact`` are such groups is measured, not proven (two mixtures could
agree to within the tolerance, and pass the peeling fit), and under noise or
pruning the marks mean little (the benchmark counts them).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from scipy.sparse.csgraph import connected_components

from attacks.api import Reconstruction, register_attack
from attacks.gradient_inversion import (
    _LABELS_NOT_GRANTED, _UNKNOWN_BATCH_SIZE, AttackConfigError, check_observation_fits_model,
    refuse_unknown_keys, victim_batch_size)
from attacks.labels import infer_labels
from fedsim.typing import Observation

DEFAULTS = {"input_layer": None, "batch_size": None, "min_bias_update": 1e-6,
            "match_tolerance": 1e-4, "label_mode": "infer", "peel": True,
            "peel_tolerance": 1e-3, "rounding_aware": True}


def check_config(config: Mapping[str, Any], grants: Mapping[str, bool] | None = None
                 ) -> dict[str, Any]:
    """``config`` merged over :data:`DEFAULTS`, checked before any victim is observed.

    Args:
      config: the ``attack.config`` mapping.
      grants: the threat model's grants, where known: the batch size must be
        granted (``batch_size`` or ``num_examples``) or configured, and the
        labels granted for ``label_mode: given``.

    Raises:
      AttackConfigError: naming the offending ``attack.config.<key>`` or grant.
    """
    refuse_unknown_keys(config, DEFAULTS)
    cfg = {**DEFAULTS, **config}
    if cfg["input_layer"] is not None and not isinstance(cfg["input_layer"], str):
        raise AttackConfigError("attack.config.input_layer: must be a module name (a string), "
                                f"got {cfg['input_layer']!r}")
    b = cfg["batch_size"]
    if b is not None and (isinstance(b, (bool, np.bool_)) or not isinstance(b, (int, np.integer))
                          or b < 1):
        raise AttackConfigError(f"attack.config.batch_size: must be a positive integer (or "
                                f"absent), got {b!r}")
    for name in ("peel", "rounding_aware"):
        if not isinstance(cfg[name], (bool, np.bool_)):
            raise AttackConfigError(f"attack.config.{name}: must be true or false, "
                                    f"got {cfg[name]!r}")
    for name, upper in (("min_bias_update", 1.0), ("match_tolerance", math.inf),
                        ("peel_tolerance", 1.0)):
        v = cfg[name]
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.floating)) \
                or not 0 <= v < upper:
            raise AttackConfigError(f"attack.config.{name}: must be a number in [0, {upper}), "
                                    f"got {v!r}")
    if cfg["label_mode"] not in ("infer", "given"):
        raise AttackConfigError(f"attack.config.label_mode: {cfg['label_mode']!r} is not "
                                "allowed; allowed: infer, given")
    if grants is not None:
        if cfg["label_mode"] == "given" and not grants.get("labels"):
            raise AttackConfigError(_LABELS_NOT_GRANTED)
        if b is None and not (grants.get("batch_size") or grants.get("num_examples")):
            raise AttackConfigError(_UNKNOWN_BATCH_SIZE)
    return cfg


def input_layer(tree: Mapping[str, Any], input_dim: int, name: str | None = None) -> str:
    """The name of the top-level module whose kernel takes the flattened input.

    Args:
      tree: a parameter (or update) tree of top-level modules.
      input_dim: prod(input_shape), the flattened input's length.
      name: the module, if the caller names it.

    Raises:
      AttackConfigError: when the named module is missing or is not a biased
        [input_dim, H] layer, or when no module (or more than one) is.
    """
    def fits(mod) -> bool:
        return (isinstance(mod, Mapping) and "kernel" in mod and "bias" in mod
                and np.ndim(mod["kernel"]) == 2 and np.shape(mod["kernel"])[0] == input_dim
                and np.shape(mod["bias"]) == (np.shape(mod["kernel"])[1],))

    if name is not None:
        if name not in tree:
            raise AttackConfigError(f"attack.config.input_layer: {name!r} is not a module of "
                                    f"the model; modules: {list(tree)}")
        if not fits(tree[name]):
            raise AttackConfigError(
                f"attack.config.input_layer: {name!r} is not a fully connected layer with a "
                f"bias on the flattened input (a kernel of {input_dim} rows and a bias)")
        return name
    found = [k for k, mod in tree.items() if fits(mod)]
    if len(found) != 1:
        raise AttackConfigError(
            "the analytic attack needs one fully connected layer with a bias on the flattened "
            f"input (a 2-D kernel of prod(input_shape) = {input_dim} rows and a bias); the model "
            + ("has none: its first layer is not one, or has no bias (use a gradient-matching "
               "attack: dlg, inverting_gradients)" if not found else
               f"has several ({found}): name one with attack.config.input_layer"))
    return found[0]


def unit_ratios(kernel_update, bias_update, min_bias_update: float = DEFAULTS["min_bias_update"]
                ) -> tuple[np.ndarray, np.ndarray]:
    """Each usable unit's ratio ΔW[:, i] / Δb_i, in float64.

    Args:
      kernel_update: [D, H] kernel update (or gradient).
      bias_update: [H] bias update (or gradient).
      min_bias_update: leave out units with |Δb_i| ≤ this × max |Δb|.

    Returns:
      ``(units, ratios)``: the indices of the units kept, and their ratios [U, D].

    Raises:
      ValueError: for a non-finite update.
    """
    w = np.asarray(kernel_update, np.float64)
    b = np.asarray(bias_update, np.float64)
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(b))):
        raise ValueError("the input layer's update is NaN/inf; the analytic attack needs a "
                         "finite update")
    scale = np.max(np.abs(b)) if b.size else 0.0
    units = np.flatnonzero(np.abs(b) > min_bias_update * scale) if scale > 0 else \
        np.zeros(0, np.int64)
    return units, (w[:, units] / b[units]).T


def group_ratios(ratios: np.ndarray, tolerance: float,
                 rounding: np.ndarray | None = None) -> list[np.ndarray]:
    """Group units whose ratios agree: ‖r_i − r_j‖ < (tolerance + e_i + e_j) · max(‖r_i‖, ‖r_j‖).

    Single linkage (connected components of the agreement graph).

    Args:
      ratios: [U, D] the units' ratios.
      tolerance: the relative distance under which two ratios agree.
      rounding: [U] e_i, each ratio's own relative rounding error where known
        (:func:`ratio_rounding`); ``None``: 0.

    Returns:
      The groups (positions into ``ratios``), largest first, then in order of
      their first unit.
    """
    if len(ratios) == 0:
        return []
    norms = np.linalg.norm(ratios, axis=1)
    sq = np.sum(ratios**2, axis=1)
    dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * ratios @ ratios.T, 0.0))
    # Strict: two all-zero ratios (units whose kernel update was pruned away) do not agree.
    tol = tolerance if rounding is None else tolerance + rounding[:, None] + rounding[None, :]
    agree = dist < tol * np.maximum(norms[:, None], norms[None, :])
    _, labels = connected_components(agree, directed=False)
    groups = [np.flatnonzero(labels == g) for g in np.unique(labels)]
    return sorted(groups, key=lambda g: (-len(g), g[0]))


def ratio_rounding(eps: float, kernel_rest: np.ndarray, bias_rest: np.ndarray,
                   kernel_terms: np.ndarray, bias_terms: np.ndarray) -> np.ndarray:
    """Each unit's ratio's relative rounding error, to first order.

    An update summed in a precision of machine epsilon ``eps`` carries an error
    of about eps·Σ|terms| in each entry. Peeling takes examples' terms off but
    not their rounding, so what is left of a unit (a remainder much smaller
    than the terms taken off it) can carry a relative error far above eps. To
    first order the ratio ΔW[:, i] / Δb_i of the remainder is off by
    eps·(‖T_W[:, i]‖ / ‖R_W[:, i]‖ + T_b,i / |R_b,i|) relative to it.

    The entry error is the recursive-summation bound of Higham (Accuracy and
    Stability of Numerical Algorithms, 2nd ed. 2002, §4.2: |E| ≤ (n−1)·u·Σ|x_k|
    + O(u²), u = eps/2) for the two or three terms of one product-and-sum; our
    deviation: a sum of n ≫ 3 terms (a large batch) can exceed it by about
    n/2, and the estimate is not widened for that.

    Args:
      eps: the machine epsilon of the update's precision.
      kernel_rest, bias_rest: [D, U], [U] the remainder R at the units.
      kernel_terms, bias_terms: [D, U], [U] T: |update| plus the magnitudes of
        the contributions peeled off (what the update was summed from, as far
        as the server knows it).
    """
    rest = np.linalg.norm(kernel_rest, axis=0)
    kernel = np.linalg.norm(kernel_terms, axis=0) / np.where(rest > 0, rest, np.inf)
    return eps * (kernel + bias_terms / np.abs(bias_rest))


def _rank_one(kernel: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """argmin_x ‖W − x bᵀ‖_F: the least-squares input of units (columns of W) sharing it."""
    return kernel @ bias / np.dot(bias, bias)


def _fit_class_and_scale(observed: np.ndarray, candidates: np.ndarray
                         ) -> tuple[int, float, float]:
    """The class y and scale s minimising ‖observed − s·candidates[y]‖, and its relative residual.

    Args:
      observed: [U] the bias update at a group's units.
      candidates: [C, U] each class's ∂ℓ/∂b at those units.
    """
    sq = np.sum(candidates**2, axis=1)
    scales = np.where(sq > 0, candidates @ observed / np.where(sq > 0, sq, 1.0), 0.0)
    res = np.linalg.norm(observed[None, :] - scales[:, None] * candidates, axis=1)
    y = int(np.argmin(res))
    norm = np.linalg.norm(observed)
    return y, float(scales[y]), float(res[y] / norm) if norm > 0 else float("inf")


def recover_inputs(kernel_update, bias_update, batch_size: int, *,
                   min_bias_update: float = DEFAULTS["min_bias_update"],
                   match_tolerance: float = DEFAULTS["match_tolerance"],
                   class_bias_grads: Callable[[np.ndarray], np.ndarray] | None = None,
                   peel_tolerance: float = DEFAULTS["peel_tolerance"],
                   rounding_aware: bool = DEFAULTS["rounding_aware"]) -> dict[str, Any]:
    """The batch's inputs from a biased input layer's update (the module docstring's rule).

    Args:
      kernel_update: [D, H] kernel update Δ (or gradient) of the input layer.
      bias_update: [H] its bias update.
      batch_size: B, the number of inputs to return.
      min_bias_update: units with |Δb_i| ≤ this × max |Δb| are left out.
      match_tolerance: the relative distance under which two ratios agree.
      class_bias_grads: for peeling (the module docstring): maps an input
        [D] to each class's per-example ∂ℓ/∂b of the layer, [C, H]. ``None``:
        one pass, no peeling.
      peel_tolerance: the largest relative residual of the class-and-scale fit
        for which a recovered example is peeled off.
      rounding_aware: widen each pair's tolerance by the two ratios' rounding
        errors (:func:`ratio_rounding`, at the machine epsilon of
        ``kernel_update``'s floating dtype; 0 for any other dtype).

    Returns:
      ``{"x": [B, D] float64, "exact": [B] bool (a group of ≥ 2 agreeing units,
      and where ``class_bias_grads`` is given one whose fit passed: peeled),
      "group_sizes": [B] int (0 for a filled slot), "group_spreads": [B] the
      largest relative distance of a group's ratios from its estimate (NaN for
      a filled slot), "found_in_pass": [B] int (the pass that found the group,
      0 the first, its last reading for an unpeeled group read again; −1 for a
      filled slot), "peeled": [B] bool, "peel_labels":
      [B] int (the fitted class of a peeled slot, else −1), "peel_scales": [B]
      (its fitted s, else NaN), "peel_residuals": [B] (the fit's relative
      residual for every group slot, where peeling was tried, else NaN),
      "units": the number of units used in the first pass, "residual": the
      relative residual of the kernel update}``.

    Raises:
      ValueError: for a batch size below 1, a non-finite update, or one
        whose bias update is all zero (no unit to read).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dtype = np.asarray(kernel_update).dtype
    eps = float(np.finfo(dtype).eps) if rounding_aware and np.issubdtype(dtype, np.floating) \
        else 0.0
    w = np.asarray(kernel_update, np.float64)
    b = np.asarray(bias_update, np.float64)
    units, ratios = unit_ratios(w, b, min_bias_update)
    if len(units) == 0:
        raise ValueError("the input layer's bias update is zero at every unit: no unit's ratio "
                         "can be read (a pruned or dead layer?)")
    first_units = units
    usable = np.zeros(len(b), bool)
    usable[units] = True  # the units a pass may read: not yet peeled off
    scale = np.max(np.abs(b))
    w_rest, b_rest = w.copy(), b.copy()
    w_terms, b_terms = np.abs(w), np.abs(b)  # for the rounding error: see ratio_rounding
    slots: list[dict[str, Any]] = []  # in the order found; None: superseded

    def same_input(x, other) -> bool:
        return bool(np.linalg.norm(x - other) < match_tolerance
                    * max(np.linalg.norm(x), np.linalg.norm(other)))

    def peeled_count() -> int:
        return sum(1 for sl in slots if sl is not None and sl["peeled"])

    for pass_index in range(batch_size):
        if pass_index:
            units = units[usable[units]]
            # Later passes read the remainder's ratios; a unit emptied by peeling
            # (bias remainder ~ 0) is left out as in the first pass.
            units = units[np.abs(b_rest[units]) > min_bias_update * scale]
            ratios = (w_rest[:, units] / b_rest[units]).T
        rounding = ratio_rounding(eps, w_rest[:, units], b_rest[units], w_terms[:, units],
                                  b_terms[units]) if eps else None
        groups = [g for g in group_ratios(ratios, match_tolerance, rounding) if len(g) >= 2]
        # A pass reads at most as many groups as examples are left to find, largest
        # first (as one pass does): every group read is one more chance for two
        # mixtures to pass the fit by accident (pruned updates show it).
        reads_left = batch_size - peeled_count()
        peeled_any = False
        touched = np.zeros(len(b), bool)  # units this pass's peeling changed
        for g in groups:
            if reads_left == 0:
                break
            cols = units[g]
            if touched[cols].any():
                # grouped on ratios peeling has since changed (an example's units
                # are its alone, so this is no example's group): read them next pass
                continue
            # The estimate and the fit read the group's units whose own rounding error
            # is within match_tolerance, where it has two or more (one unit fits any
            # scale): a unit that joined only through its wider tolerance is noisier,
            # and may bridge to a mixture.
            fit_cols = cols if rounding is None or np.sum(rounding[g] <= match_tolerance) < 2 \
                else cols[rounding[g] <= match_tolerance]
            x = _rank_one(w_rest[:, fit_cols], b_rest[fit_cols])
            # A group whose peeling fit failed keeps its units in later passes (peeling
            # another example may leave them to one example); found again there, it
            # supersedes the earlier slot, unless it is the same units and input.
            earlier = [i for i, sl in enumerate(slots) if sl is not None and not sl["peeled"]
                       and np.intersect1d(sl["cols"], cols).size]
            if any(np.array_equal(slots[i]["cols"], cols) and same_input(x, slots[i]["x"])
                   for i in earlier):
                continue
            if any(sl is not None and i not in earlier and same_input(x, sl["x"])
                   for i, sl in enumerate(slots)):
                continue  # an input already returned, read again off a remainder
            reads_left -= 1
            spread = float(np.max(np.linalg.norm(ratios[g] - x, axis=1))
                           / max(np.linalg.norm(x), np.finfo(np.float64).tiny))
            slot = {"x": x, "cols": cols, "size": len(g), "spread": spread,
                    "pass": pass_index, "peeled": False, "label": -1,
                    "scale": float("nan"), "peel_residual": float("nan")}
            if class_bias_grads is not None:
                cand = np.asarray(class_bias_grads(x), np.float64)
                y, fit_scale, rel = _fit_class_and_scale(b_rest[fit_cols], cand[:, fit_cols])
                slot["peel_residual"] = rel
                if rel <= peel_tolerance:
                    contribution = fit_scale * cand[y]
                    b_rest -= contribution
                    w_rest -= np.outer(x, contribution)
                    b_terms += np.abs(contribution)
                    w_terms += np.abs(np.outer(x, contribution))
                    touched |= contribution != 0
                    usable[cols] = False
                    slot.update(peeled=True, label=y, scale=fit_scale)
                    peeled_any = True
            if earlier:
                slots[earlier[0]] = slot  # in the place of the first it supersedes
                for i in earlier[1:]:
                    slots[i] = None
            else:
                slots.append(slot)
        if not peeled_any or peeled_count() == batch_size:
            break
    # Every peeled slot, then the unpeeled groups in the order found, B in all.
    room = batch_size - peeled_count()
    kept = []
    for sl in slots:
        if sl is not None and (sl["peeled"] or room > 0):
            room -= not sl["peeled"]
            kept.append(sl)
    slots = kept
    in_group = np.zeros(len(b), bool)
    for sl in slots:
        in_group[sl["cols"]] = True
    filler_units = first_units[~in_group[first_units]]
    if len(filler_units) == 0 or not np.any(b_rest[filler_units] != 0):
        # every unit is in a returned group (or a noised B = 1 update): all of them
        filler = _rank_one(w[:, first_units], b[first_units])
    else:
        filler = _rank_one(w_rest[:, filler_units], b_rest[filler_units])
    while len(slots) < batch_size:
        slots.append({"x": filler, "size": 0, "spread": float("nan"), "pass": -1,
                      "peeled": False, "label": -1, "scale": float("nan"),
                      "peel_residual": float("nan")})
    x = np.stack([sl["x"] for sl in slots])
    coef, *_ = np.linalg.lstsq(x.T, w, rcond=None)
    norm = np.linalg.norm(w)
    residual = float(np.linalg.norm(w - x.T @ coef) / norm) if norm > 0 else 0.0
    sizes = np.asarray([sl["size"] for sl in slots])
    peeled = np.asarray([sl["peeled"] for sl in slots])
    exact = sizes > 0 if class_bias_grads is None else peeled
    return {"x": x, "exact": exact, "group_sizes": sizes,
            "group_spreads": np.asarray([sl["spread"] for sl in slots]),
            "found_in_pass": np.asarray([sl["pass"] for sl in slots]),
            "peeled": peeled,
            "peel_labels": np.asarray([sl["label"] for sl in slots]),
            "peel_scales": np.asarray([sl["scale"] for sl in slots]),
            "peel_residuals": np.asarray([sl["peel_residual"] for sl in slots]),
            "units": int(len(first_units)), "residual": residual}


@functools.lru_cache(maxsize=8)
def _class_bias_grads(apply_fn, layer: str, input_shape: tuple[int, ...]):
    """The jitted (params, x [D]) ↦ [C, H] of :func:`class_bias_grads_fn`, compiled once
    per model, layer and input shape (not once per victim)."""
    def logits(params, b, x):
        return apply_fn({**params, layer: {**params[layer], "bias": b}}, x[None])[0]

    @jax.jit
    def grads(params, x):
        x = x.reshape(input_shape)
        bias = params[layer]["bias"]
        jac = jax.jacrev(logits, argnums=1)(params, bias, x)  # [C, H]
        p = jax.nn.softmax(logits(params, bias, x))
        return (p @ jac)[None, :] - jac

    return grads


def class_bias_grads_fn(apply_fn, params, layer: str, input_shape: tuple[int, ...]
                        ) -> Callable[[np.ndarray], np.ndarray]:
    """x [D] ↦ each class's per-example ∂ℓ(x, y)/∂b of ``layer``, [C, H] (float32 model).

    ℓ is the softmax cross-entropy of ``apply_fn(params, x)`` (the engine's
    loss), so row y is Jᵀ(p − e_y) with J = ∂logits/∂b and p = softmax(logits).
    """
    grads = _class_bias_grads(apply_fn, layer, tuple(input_shape))
    dtype = params[layer]["bias"].dtype
    return lambda x: np.asarray(grads(params, jnp.asarray(x, dtype)))


def merge_labels(fitted: np.ndarray, inferred: np.ndarray) -> np.ndarray:
    """Slot labels: a peeled slot's fitted class, the others filled from ``inferred``.

    Args:
      fitted: [B] each slot's fitted class, −1 where the slot was not peeled.
      inferred: [B] a label multiset for the batch (count-based inference).

    Returns:
      [B] int: ``fitted`` where ≥ 0; the other slots take, in order, the
      labels of ``inferred`` left once each fitted class is taken out of it
      once (where it is there: the fit is checked against the update, the
      count is an estimate).
    """
    rest = [int(v) for v in inferred]
    for y in fitted:
        if y >= 0 and int(y) in rest:
            rest.remove(int(y))
    out = np.asarray(fitted, np.int64).copy()
    empty = np.flatnonzero(out < 0)
    out[empty] = rest[:len(empty)]  # len(rest) >= len(empty): at most one removal per fit
    return out


@register_attack("analytic")
def run(observation: Observation, config: Mapping[str, Any], key) -> Reconstruction:
    """Closed-form recovery of the inputs to a biased fully connected input layer."""
    cfg = check_config(config)
    batch = victim_batch_size(observation, cfg)
    check_observation_fits_model(observation, batch)
    shape = tuple(observation.input_shape)
    name = input_layer(observation.update, int(np.prod(shape)), cfg["input_layer"])
    layer = observation.update[name]
    # one gradient step at the global model: each example's share is computable
    peel = bool(cfg["peel"]) and (observation.algorithm == "fedsgd"
                                  or observation.local_steps == 1)
    grads = (class_bias_grads_fn(observation.apply_fn, observation.params, name, shape)
             if peel else None)
    out = recover_inputs(layer["kernel"], layer["bias"], batch,
                         min_bias_update=float(cfg["min_bias_update"]),
                         match_tolerance=float(cfg["match_tolerance"]),
                         class_bias_grads=grads, peel_tolerance=float(cfg["peel_tolerance"]),
                         rounding_aware=bool(cfg["rounding_aware"]))
    if cfg["label_mode"] == "given":
        if observation.labels is None:
            raise AttackConfigError(_LABELS_NOT_GRANTED)
        labels = jnp.asarray(observation.labels, jnp.int32)
    else:
        labels = jnp.asarray(merge_labels(out["peel_labels"],
                                          np.asarray(infer_labels(observation, batch, key))),
                             jnp.int32)
    x = jnp.asarray(out["x"].reshape(batch, *shape), jnp.float32)
    extras = {"exact": out["exact"], "group_sizes": out["group_sizes"],
              "group_spreads": out["group_spreads"], "units": out["units"], "input_layer": name,
              "found_in_pass": out["found_in_pass"], "peeled": out["peeled"],
              "peel_labels": out["peel_labels"], "peel_scales": out["peel_scales"],
              "peel_residuals": out["peel_residuals"]}
    return Reconstruction(x, labels, jnp.float32(out["residual"]), extras)


run.check_config = check_config
run.config_keys = dict(DEFAULTS)
