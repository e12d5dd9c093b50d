"""DP-FedAvg with adaptive clipping to a private quantile (Andrew et al., NeurIPS 2021).

Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning with
Adaptive Clipping" (arXiv 1905.03871): instead of a fixed clip norm C, the
server clips each client's update to the current estimate C_t of a target
quantile γ of the update norms, and updates the estimate every round from a
privately noised count of the clients whose update was not clipped:

* each sampled client i sends its update clipped to C_t,
  Δ'_i = Δ_i · min(1, C_t / ‖Δ_i‖), and its bit b_i = 1[‖Δ_i‖ ≤ C_t];
* the server releases Δ̃ = (Σ Δ'_i + N(0, (z_Δ C_t)² I)) / m (the
  fixed-denominator estimate of DP-FedAvg, m the expected cohort size) and
  b̃ = (Σ (b_i − ½) + N(0, σ_b²)) / m + ½, the noised unclipped fraction;
* C_{t+1} = C_t · exp(−η_C (b̃ − γ)) (the geometric update, §2.2, the
  paper's recommendation), or C_t − η_C (b̃ − γ) (the linear one).

Guarantee (§3): the bit is shifted to b − ½ ∈ {−½, ½}, so the count query has
sensitivity ½, and releasing both sums in a round is the Gaussian mechanism
with noise multiplier z = (z_Δ⁻² + (2σ_b)⁻²)^(−½) on a client's contribution.
This module takes z, the multiplier to account, and derives the update's
z_Δ = (z⁻² − (2σ_b)⁻²)^(−½), which needs 2σ_b > z; account the run with
:func:`defenses.accounting.dp_fedavg_epsilon` at z (user level, add/remove
adjacency, a client's rounds Poisson-sampled at q). The paper's defaults,
used here: C_0 = 0.1, γ = 0.5 (the median), η_C = 0.2, σ_b = m/20.
The paper is not among the team's papers (``../shared/papers``): the section
numbers are those of arXiv 1905.03871, and the defaults are the ones
TensorFlow Privacy's and Flower's documentation quote from it.

What is built: pure functions, usable in one's own JAX code and under
``jax.jit``, in two halves that match secure aggregation (the server needs
only the two sums):

* :func:`clip_to_quantile_estimate`: one client's half (clip, bit);
* :func:`quantile_dp_fedavg`'s ``aggregate``: the server's half (noise both
  sums, the mean update, the next C);
* its ``apply``: both halves on a stack of client updates, the round of
  Alg 1 of the paper with an optional ``present`` mask (Poisson sampling
  with fixed shapes).

Deviations and limits:

* b̃ is clamped to [0, 1] before the update of C, as TensorFlow Privacy's
  ``QuantileEstimatorQuery`` does; the paper does not clamp. Post-processing
  of a released value, so the guarantee is the same. The linear update is
  floored at 0 (a clip norm below 0 means nothing).
* A client whose update is NaN/Inf is left out of both sums (as if it had not
  been sampled) and counted in ``info["nonfinite"]``; the denominator stays m.
* Adaptive clipping here is not DP-PSAC (:mod:`defenses.dp.psac`), which
  adapts per-example clipping inside a client's DP-SGD.

In a ``fedsim.Simulation`` (a config's ``defenses:``):
:func:`adaptive_client_level_dp` is the same round as an upload defense with
a server step (``Defense.end_round``). Every client's defense state holds
C_t; a client clips to it and, as ``client_level_dp`` does with the update,
adds its share of each noise: N(0, (z_Δ C_t)²/m · I) on the update and
N(0, σ_b²/m) on its shifted bit, which it keeps in its state. The server's
step sums the cohort's m noisy bits (whose noise adds up to N(0, σ_b²)), sets
C_{t+1} and gives it to every client. The guarantee is the library's (user
level at z, for the aggregate, with ``training.weighting: uniform`` and m =
``training.clients_per_round``); a curious server that sees single uploads
sees each at z/√m (reported as local ε). A client skipped for a NaN/Inf
update keeps its state from before the round (its bit 0, as in ``apply``),
and its noise shares are missing from that round's sums, as with
``client_level_dp``.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from defenses.accounting._validation import check_nonnegative, check_positive
from defenses.dp._flat import flatten_batched
from defenses.dp.clipping import check_noise_multiplier
from defenses.dp._params import DPParameters
from defenses.dp.update_noise import check_client_level_dp
from fedsim.hooks import Defense, register_defense, register_simulation_plugin
from fedsim.keys import require_key
from fedsim.typing import PRNGKey, PyTree, Updates

__all__ = ["QuantileClipState", "QuantileDPFedAvg", "adaptive_client_level_dp",
           "clip_to_quantile_estimate", "quantile_dp_fedavg", "update_noise_multiplier"]

#: Andrew et al.'s recommended σ_b as a share of the expected cohort m (m/20).
DEFAULT_COUNT_STDDEV_PER_CLIENT = 0.05


class QuantileClipState(NamedTuple):
    """The server's state between rounds.

    Attributes:
      clip_norm: float32 scalar, C_t, the clip norm of the next round.
    """

    clip_norm: jax.Array


class QuantileDPFedAvg(NamedTuple):
    """Adaptive-clipping DP-FedAvg closed over its hyper-parameters.

    Attributes:
      init: ``init() -> QuantileClipState`` (C_0).
      apply: ``apply(updates, state, *, key, present=None) -> (mean_update,
        state', info)`` for a stack of client updates (leaves [C, ...]);
        ``present`` [C] is 1 for a sampled client and 0 otherwise (a weight
        other than 0/1 would scale that client's sensitivity).
      aggregate: ``aggregate(clipped_sum, shifted_bit_sum, state, *, key) ->
        (mean_update, state', info)``, the server's half alone, given the sums
        over the cohort of what :func:`clip_to_quantile_estimate` returns: the
        clipped updates (a pytree like one update) and the shifted bits
        Σ(b_i − ½). The shift makes the number of clients unnecessary: under
        Poisson sampling it is itself private.
      noise_multiplier: z, the multiplier of the joint release, to account.
      update_noise_multiplier: z_Δ, the update's noise std over C_t.
      clipped_count_stddev: σ_b, the count's noise std.
      expected_clients_per_round: m, the denominator of both means.
    """

    init: Callable
    apply: Callable
    aggregate: Callable
    noise_multiplier: float
    update_noise_multiplier: float
    clipped_count_stddev: float
    expected_clients_per_round: float


def update_noise_multiplier(noise_multiplier: float, clipped_count_stddev: float) -> float:
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(−½): the update's share of a joint multiplier z (§3).

    Args:
      noise_multiplier: z ≥ 0, the multiplier to account (0: no noise, no DP).
      clipped_count_stddev: σ_b ≥ 0, the count's noise std.

    Returns:
      z_Δ ≥ z (0 when z is 0).

    Raises:
      ValueError: a negative or non-finite value, or z > 0 with 2σ_b ≤ z (the
        count alone would already spend the whole budget).
    """
    z = check_noise_multiplier(noise_multiplier)
    sigma_b = check_nonnegative("clipped_count_stddev", clipped_count_stddev)
    if z == 0.0:
        return 0.0
    if not 2.0 * sigma_b > z:
        raise ValueError(
            f"clipped_count_stddev={sigma_b:g} is too small for noise_multiplier={z:g}: "
            f"the count's noise alone is a Gaussian mechanism with multiplier 2σ_b = "
            f"{2 * sigma_b:g} <= z, leaving nothing for the update; raise "
            "clipped_count_stddev (Andrew et al. suggest m/20) or lower noise_multiplier")
    return (z ** -2 - (2.0 * sigma_b) ** -2) ** -0.5


def clip_to_quantile_estimate(update: Updates, clip_norm) -> tuple[Updates, jax.Array]:
    """One client's half: (Δ · min(1, C/‖Δ‖), b − ½) for the whole flat update.

    Args:
      update: one client's update (a pytree).
      clip_norm: C_t, a scalar (e.g. ``state.clip_norm``).

    Returns:
      (the clipped update, same structure and dtypes; the shifted bit
      b − ½ as a float32 scalar, +½ when ‖Δ‖ ≤ C and −½ otherwise). The
      server needs only the sums of both over the cohort (``aggregate``).
    """
    batched = jax.tree_util.tree_map(lambda u: jnp.asarray(u)[None], update)
    clipped, bits, _ = _clip_rows(batched, clip_norm)
    return jax.tree_util.tree_map(lambda c: c[0], clipped), bits[0] - 0.5


def _clip_rows(updates: PyTree, clip_norm):
    """Clip a stack [C, ...] of updates; (clipped stack, bits [C], norms [C])."""
    matrix, _ = flatten_batched(updates)
    norms = jnp.sqrt(jnp.sum(matrix * matrix, axis=1))
    clip = jnp.asarray(clip_norm, jnp.float32)
    bits = (norms <= clip).astype(jnp.float32)
    # min(1, C/‖Δ‖), also where the linear update took C to 0 (a 0/0 would be NaN).
    scale = jnp.where(norms > clip, clip / jnp.where(norms > clip, norms, 1.0), 1.0)
    clipped = jax.tree_util.tree_map(
        lambda u: (u * scale.reshape((-1,) + (1,) * (u.ndim - 1)).astype(u.dtype)), updates)
    return clipped, bits, norms


def quantile_dp_fedavg(noise_multiplier: float, expected_clients_per_round: float, *,
                       initial_clip_norm: float = 0.1, target_unclipped_quantile: float = 0.5,
                       clip_learning_rate: float = 0.2,
                       clipped_count_stddev: float | None = None,
                       geometric_update: bool = True) -> QuantileDPFedAvg:
    """DP-FedAvg whose clip norm tracks a private quantile of the update norms.

    Andrew et al. 2021, Alg 1 (DP-FedAvg with adaptive clipping) with the
    geometric quantile update of §2.2 and the joint analysis of §3; see the
    module docstring for the equations and the deviations.

    Args:
      noise_multiplier: z ≥ 0, the joint multiplier that a round's release
        carries (account the run at z); 0 turns all noise off (no DP).
      expected_clients_per_round: m > 0, the expected cohort (q·N under
        Poisson sampling), the denominator of the mean update and of b̃.
      initial_clip_norm: C_0 > 0 (paper: 0.1).
      target_unclipped_quantile: γ ∈ [0, 1], the share of updates to leave
        unclipped (paper: 0.5).
      clip_learning_rate: η_C ≥ 0 (paper: 0.2 for the geometric update; 0
        keeps C fixed).
      clipped_count_stddev: σ_b ≥ 0; default m/20 when z > 0, 0 when z = 0.
      geometric_update: the geometric update (True, the paper's choice) or
        the linear one.

    Returns:
      A :class:`QuantileDPFedAvg`.

    Raises:
      ValueError: a parameter out of its range (named), or 2σ_b ≤ z.
    """
    z = check_noise_multiplier(noise_multiplier)
    m = check_positive("expected_clients_per_round", expected_clients_per_round)
    c0 = check_positive("initial_clip_norm", initial_clip_norm)
    gamma = check_nonnegative("target_unclipped_quantile", target_unclipped_quantile)
    if gamma > 1.0:
        raise ValueError(f"target_unclipped_quantile must be in [0, 1], got "
                         f"{target_unclipped_quantile!r}")
    eta = check_nonnegative("clip_learning_rate", clip_learning_rate)
    if not isinstance(geometric_update, bool):
        raise ValueError(f"geometric_update must be True or False, got {geometric_update!r}")
    if clipped_count_stddev is None:
        sigma_b = DEFAULT_COUNT_STDDEV_PER_CLIENT * m if z > 0 else 0.0
    else:
        sigma_b = check_nonnegative("clipped_count_stddev", clipped_count_stddev)
    z_delta = update_noise_multiplier(z, sigma_b)

    def init() -> QuantileClipState:
        return QuantileClipState(jnp.asarray(c0, jnp.float32))

    def aggregate(clipped_sum: Updates, shifted_bit_sum, state: QuantileClipState, *,
                  key: PRNGKey, nonfinite=0):
        require_key(key, "quantile_dp_fedavg")
        clip = state.clip_norm
        value_key, count_key = jax.random.split(key)
        flat, unflatten = flatten_batched(
            jax.tree_util.tree_map(lambda s: jnp.asarray(s)[None], clipped_sum))
        noise = jax.random.normal(value_key, flat.shape[1:], jnp.float32)
        mean = unflatten((flat[0] + z_delta * clip * noise) / m)
        count_noise = sigma_b * jax.random.normal(count_key, (), jnp.float32)
        fraction = jnp.clip((jnp.asarray(shifted_bit_sum, jnp.float32) + count_noise) / m + 0.5,
                            0.0, 1.0)
        step = eta * (fraction - gamma)
        new_clip = clip * jnp.exp(-step) if geometric_update else jnp.maximum(clip - step, 0.0)
        info = {"clip_norm": clip, "noised_unclipped_fraction": fraction,
                "nonfinite": jnp.asarray(nonfinite, jnp.int32)}
        return mean, QuantileClipState(new_clip.astype(jnp.float32)), info

    def server_aggregate(clipped_sum: Updates, shifted_bit_sum, state: QuantileClipState, *,
                         key: PRNGKey):
        return aggregate(clipped_sum, shifted_bit_sum, state, key=key)

    def apply(updates: Updates, state: QuantileClipState, *, key: PRNGKey, present=None):
        matrix, _ = flatten_batched(updates)
        count = matrix.shape[0]
        taking = (jnp.ones((count,), jnp.float32) if present is None
                  else _check_present(present, count))
        finite = jnp.all(jnp.isfinite(matrix), axis=1)
        safe = jax.tree_util.tree_map(
            lambda u: jnp.where(finite.reshape((-1,) + (1,) * (u.ndim - 1)), u, 0), updates)
        clipped, bits, _ = _clip_rows(safe, state.clip_norm)
        counted = taking * finite
        total = jax.tree_util.tree_map(lambda c: jnp.tensordot(counted.astype(c.dtype), c, 1),
                                       clipped)
        shifted = jnp.sum(counted * (bits - 0.5))
        nonfinite = jnp.sum(taking * (1.0 - finite)).astype(jnp.int32)
        return aggregate(total, shifted, state, key=key, nonfinite=nonfinite)

    return QuantileDPFedAvg(init, apply, server_aggregate, z, z_delta, sigma_b, m)


def _check_present(present, count: int) -> jax.Array:
    shape = tuple(jnp.shape(present))
    if shape != (count,):
        raise ValueError(f"present must have shape ({count},), one entry per client update; "
                         f"got shape {shape}")
    if not isinstance(present, jax.core.Tracer):  # under jit the values are not known here
        values = np.asarray(present, np.float64)
        if not np.all((values == 0) | (values == 1)):
            raise ValueError("present must hold 0 (not sampled) or 1 (sampled) per client; a "
                             "weight, NaN or other value would scale that client's "
                             f"sensitivity; got {sorted(set(values.tolist()))[:5]}")
    return jnp.asarray(present).astype(jnp.float32)


@register_defense("adaptive_client_level_dp")
def adaptive_client_level_dp(noise_multiplier: float, clients_per_round: int, *,
                             initial_clip_norm: float = 0.1,
                             target_unclipped_quantile: float = 0.5,
                             clip_learning_rate: float = 0.2,
                             clipped_count_stddev: float | None = None,
                             geometric_update: bool = True) -> Defense:
    """DP-FedAvg with adaptive clipping (Andrew et al. 2021) as an engine upload defense.

    The round of :func:`quantile_dp_fedavg` in distributed form (module
    docstring): each client clips its update to the C_t in its state and
    adds its shares of the update's and the count's noise; the defense's
    ``end_round`` turns the cohort's bits into C_{t+1} for every client.
    The per-client state is ``{"clip_norm": C_t, "shifted_bit": b − ½ plus
    its noise share}`` (0 outside the round's cohort).

    Args:
      noise_multiplier: z > 0, the joint multiplier (accounted as DP-FedAvg's σ).
      clients_per_round: m, the run's ``training.clients_per_round`` (a
        Simulation refuses another value, and weighting other than uniform).
      initial_clip_norm, target_unclipped_quantile, clip_learning_rate,
        clipped_count_stddev, geometric_update: as :func:`quantile_dp_fedavg`.

    Raises:
      ValueError: as :func:`quantile_dp_fedavg`, z = 0 (use no defense), or an m
        that is not a positive integer.
    """
    m = clients_per_round
    if isinstance(m, bool) or not isinstance(m, numbers.Integral) or int(m) < 1:
        raise ValueError(f"clients_per_round must be a positive integer (the round's cohort "
                         f"size), got {m!r}")
    m = int(m)
    agg = quantile_dp_fedavg(noise_multiplier, m, initial_clip_norm=initial_clip_norm,
                             target_unclipped_quantile=target_unclipped_quantile,
                             clip_learning_rate=clip_learning_rate,
                             clipped_count_stddev=clipped_count_stddev,
                             geometric_update=geometric_update)
    z = agg.noise_multiplier
    if z == 0.0:
        raise ValueError("noise_multiplier must be > 0 for adaptive_client_level_dp (z = 0 "
                         "gives no guarantee; quantile_dp_fedavg runs without noise in your "
                         "own loop)")
    update_share = agg.update_noise_multiplier / math.sqrt(m)
    count_share = agg.clipped_count_stddev / math.sqrt(m)
    gamma, eta = float(target_unclipped_quantile), float(clip_learning_rate)
    c0 = float(initial_clip_norm)

    def init(params):
        return {"clip_norm": jnp.asarray(c0, jnp.float32),
                "shifted_bit": jnp.zeros((), jnp.float32)}

    def apply(update, state, *, key, context=None):
        value_key, count_key = jax.random.split(key)
        clip = state["clip_norm"]
        batched = jax.tree_util.tree_map(lambda u: u[None], update)
        matrix, unflatten = flatten_batched(batched)
        v = matrix[0]
        norm = jnp.sqrt(jnp.sum(v * v))
        bit = (norm <= clip).astype(jnp.float32) - 0.5
        v = v * jnp.where(norm > clip, clip / jnp.where(norm > clip, norm, 1.0), 1.0)
        v = v + update_share * clip * jax.random.normal(value_key, v.shape, v.dtype)
        bit = bit + count_share * jax.random.normal(count_key, (), jnp.float32)
        return unflatten(v), {"clip_norm": clip, "shifted_bit": bit}

    def end_round(states, ids, cohort_states):
        # Every client holds the same C_t (set here for all of them each round).
        clip = states["clip_norm"][0]
        fraction = jnp.clip(jnp.sum(cohort_states["shifted_bit"]) / m + 0.5, 0.0, 1.0)
        step = eta * (fraction - gamma)
        new_clip = clip * jnp.exp(-step) if geometric_update else jnp.maximum(clip - step, 0.0)
        return {"clip_norm": jnp.full_like(states["clip_norm"], new_clip),
                "shifted_bit": jnp.zeros_like(states["shifted_bit"])}

    return Defense(
        init, apply, "upload",
        f"adaptive_client_level_dp(z={z:g},m={m},gamma={gamma:g})",
        config_checks=(functools.partial(check_client_level_dp, m,
                                         name="adaptive_client_level_dp"),),
        guarantees=(
            DPParameters("gauss", noise_multiplier=z, clip_norm=c0, level="client"),
            # One upload (update and bit) carries its shares: jointly z/√m.
            DPParameters("gauss", noise_multiplier=z / math.sqrt(m), clip_norm=c0,
                         level="local")),
        end_round=end_round)


def _clip_states(tree):
    """The ``adaptive_client_level_dp`` states inside an upload stage's state
    (itself, or a part of a chain's tuple)."""
    if isinstance(tree, dict) and set(tree) == {"clip_norm", "shifted_bit"}:
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _clip_states(value)
    elif isinstance(tree, (tuple, list)):
        for value in tree:
            yield from _clip_states(value)


class ClipNormReport:
    """Round callback: ``adaptive_clip_norm``, the C_{t+1} that round t's server
    step released (every client's state holds it; the next round clips to it)."""

    def __call__(self, round_idx: int, row: dict, *, state) -> dict:
        found = list(_clip_states(state.client_states.get("upload")))
        if len(found) != 1:  # two of them in one chain: which is meant is unclear
            return {}
        return {"adaptive_clip_norm": float(found[0]["clip_norm"][0])}


def attach_clip_norm_report(sim) -> bool:
    """Add ``adaptive_clip_norm`` to every metrics row of a run whose upload
    stage runs ``adaptive_client_level_dp`` (a simulation plugin)."""
    upload = sim.defenses.get("upload")
    if upload is None or "adaptive_client_level_dp" not in upload.name:
        return False
    if not any(isinstance(cb, ClipNormReport) for cb in sim.round_callbacks):
        sim.round_callbacks.append(ClipNormReport())
    return True


register_simulation_plugin(attach_clip_norm_report)
