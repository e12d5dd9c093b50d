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
An example with a single exclusive unit is not found this way. Slots of the
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
("infer": :func:`attacks.labels.infer_labels`; "given": the granted labels).
Loss: the relative residual ‖ΔW − X̂ᵀA‖_F / ‖ΔW‖_F of the kernel update
after the best A (least squares): 0 when the returned inputs span every
column, as they do for a fully recovered noiseless batch.
Guarantee: none proven. In a noiseless FedSGD or FedAvg-SGD update a group of
exclusive units gives its example to within float rounding; that the slots
marked ``exact`` are such groups is measured, not proven (two mixtures could
agree to within the tolerance), and under noise or pruning the marks mean
nothing (the benchmark counts them).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

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
            "match_tolerance": 1e-4, "label_mode": "infer"}


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
    for name, upper in (("min_bias_update", 1.0), ("match_tolerance", math.inf)):
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


def group_ratios(ratios: np.ndarray, tolerance: float) -> list[np.ndarray]:
    """Group units whose ratios agree: ‖r_i − r_j‖ < tolerance · max(‖r_i‖, ‖r_j‖).

    Single linkage (connected components of the agreement graph).

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
    agree = dist < tolerance * np.maximum(norms[:, None], norms[None, :])
    _, labels = connected_components(agree, directed=False)
    groups = [np.flatnonzero(labels == g) for g in np.unique(labels)]
    return sorted(groups, key=lambda g: (-len(g), g[0]))


def _rank_one(kernel: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """argmin_x ‖W − x bᵀ‖_F: the least-squares input of units (columns of W) sharing it."""
    return kernel @ bias / np.dot(bias, bias)


def recover_inputs(kernel_update, bias_update, batch_size: int, *,
                   min_bias_update: float = DEFAULTS["min_bias_update"],
                   match_tolerance: float = DEFAULTS["match_tolerance"]) -> dict[str, Any]:
    """The batch's inputs from a biased input layer's update (the module docstring's rule).

    Args:
      kernel_update: [D, H] kernel update Δ (or gradient) of the input layer.
      bias_update: [H] its bias update.
      batch_size: B, the number of inputs to return.
      min_bias_update: units with |Δb_i| ≤ this × max |Δb| are left out.
      match_tolerance: the relative distance under which two ratios agree.

    Returns:
      ``{"x": [B, D] float64, "exact": [B] bool (a group of ≥ 2 agreeing units),
      "group_sizes": [B] int (0 for a filled slot), "group_spreads": [B] the
      largest relative distance of a group's ratios from its estimate (NaN for
      a filled slot), "units": the number of units used, "residual": the
      relative residual of the kernel update}``.

    Raises:
      ValueError: for a batch size below 1, a non-finite update, or one
        whose bias update is all zero (no unit to read).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    w = np.asarray(kernel_update, np.float64)
    b = np.asarray(bias_update, np.float64)
    units, ratios = unit_ratios(w, b, min_bias_update)
    if len(units) == 0:
        raise ValueError("the input layer's bias update is zero at every unit: no unit's ratio "
                         "can be read (a pruned or dead layer?)")
    groups = [g for g in group_ratios(ratios, match_tolerance) if len(g) >= 2][:batch_size]
    xs, sizes, spreads = [], [], []
    for g in groups:
        cols = units[g]
        xs.append(_rank_one(w[:, cols], b[cols]))
        sizes.append(len(g))
        spreads.append(float(np.max(np.linalg.norm(ratios[g] - xs[-1], axis=1))
                             / max(np.linalg.norm(xs[-1]), np.finfo(np.float64).tiny)))
    used = np.zeros(len(units), bool)
    for g in groups:
        used[g] = True
    rest = units[~used] if np.any(~used) else units
    filler = _rank_one(w[:, rest], b[rest])
    while len(xs) < batch_size:
        xs.append(filler)
        sizes.append(0)
        spreads.append(float("nan"))
    x = np.stack(xs)
    coef, *_ = np.linalg.lstsq(x.T, w, rcond=None)
    norm = np.linalg.norm(w)
    residual = float(np.linalg.norm(w - x.T @ coef) / norm) if norm > 0 else 0.0
    return {"x": x, "exact": np.asarray(sizes) > 0, "group_sizes": np.asarray(sizes),
            "group_spreads": np.asarray(spreads), "units": int(len(units)),
            "residual": residual}


@register_attack("analytic")
def run(observation: Observation, config: Mapping[str, Any], key) -> Reconstruction:
    """Closed-form recovery of the inputs to a biased fully connected input layer."""
    cfg = check_config(config)
    batch = victim_batch_size(observation, cfg)
    check_observation_fits_model(observation, batch)
    shape = tuple(observation.input_shape)
    name = input_layer(observation.update, int(np.prod(shape)), cfg["input_layer"])
    layer = observation.update[name]
    out = recover_inputs(layer["kernel"], layer["bias"], batch,
                         min_bias_update=float(cfg["min_bias_update"]),
                         match_tolerance=float(cfg["match_tolerance"]))
    if cfg["label_mode"] == "given":
        if observation.labels is None:
            raise AttackConfigError(_LABELS_NOT_GRANTED)
        labels = jnp.asarray(observation.labels, jnp.int32)
    else:
        labels = infer_labels(observation, batch, key)
    x = jnp.asarray(out["x"].reshape(batch, *shape), jnp.float32)
    extras = {"exact": out["exact"], "group_sizes": out["group_sizes"],
              "group_spreads": out["group_spreads"], "units": out["units"], "input_layer": name}
    return Reconstruction(x, labels, jnp.float32(out["residual"]), extras)


run.check_config = check_config
run.config_keys = dict(DEFAULTS)
