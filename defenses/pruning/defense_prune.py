"""Defense pruning of the upload: Largest, Random, Mix, and Pseudo-Pruning.

Chu et al. 2023 (PriPrune, paper 002), section "Pruning as a Privacy Defense
for FL" (the paper's sections are unnumbered; counted, it is §6): on top of the
base pruning scheme the client withholds part of its update before uploading it:

* **Largest**: withhold the ``p`` fraction of coordinates with the largest
  |Δ| (they carry the most information about the data: the paper's "Insight 1:
  Largest Weights Matter"). Deviation: the paper ranks by the gradient
  ("weights with large gradients"); Δ is the client's whole local update,
  −lr × the gradient after one local step, −lr × the sum of the steps'
  gradients after several (plain SGD): the same ranking for one step, and for
  several the one of what the server sees and the attacks invert;
* **Random**: withhold a uniformly random ``p`` fraction;
* **Mix**: withhold the ``p_largest`` largest, then a random ``p_random``
  fraction of the rest (both fractions of n, below).

Rates are fractions of what the client would otherwise share: the nonzero
coordinates n of its (base-pruned) update Δ. Exactly ``round(p·n)`` of them
are withheld, ranked over the whole model (:mod:`defenses.pruning.masks`); for
Mix, ``round(p_largest·n)`` largest then ``round(p_random·n)`` random ones
among the rest. Why a fraction of n, not of d (a change from the first
version): after base pruning (and ReLU-dead units) ~60 % of a Conv-2 update is
already 0, so 0.3·d would withhold ~3/4 of the shared coordinates and stall
training (accuracy at chance in 20 rounds) — outside the paper's intent of a
defense rate p̂ ∈ [0.1, 0.6] "on top of the base method".

**Pseudo-Pruning** (same section, Fig 3): the withheld coordinates are not dropped: the
client keeps its local values of them and, next round, starts local training
from ``w_global ⊙ (1 − m̂) + w_local_prev ⊙ m̂`` (m̂ = 1 where withheld), so
the local model does not lose what it learnt; the server still never sees
the withheld coordinates. This uses :attr:`Defense.begin_round` and the
per-client state ``{"local": w_local_prev, "withheld": m̂}``.

**Upload semantics** (``upload=``, :func:`defenses.pruning.masks.withhold`):
``"weights"`` is the paper's — the client uploads its masked weights
ŵ = w ⊙ m̂ and the server averages them with withheld weights counting as 0
(Alg 1 line 11), so "real" pruning (no Pseudo) shrinks the withheld weights
of the global model, which is the accuracy cost of Largest in Fig 4;
``"update"`` (the default, kept for compatibility) uploads Δ ⊙ m̂, so a
withheld coordinate just keeps its global value. The engine aggregates
updates: a weight upload travels as ŵ − w_g (exact for FedAvg with server
SGD lr 1).

Guarantee: a withheld coordinate is exactly 0 in the upload (tested on the
observer's view; for weight uploads in ŵ = w_g + upload). Privacy is empirical
(NMI/PSNR under SGI), bounded by Thm 1 through the shared fraction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedsim.hooks import Defense, register_defense
from fedsim.keys import require_key
from defenses.pruning.masks import check_rate, check_upload, magnitude_mask, \
    mask_pruning_count, num_params, pseudo_pruning_begin, rate_count, unflatten, withhold


def defense_mask(update, key, p_largest: float, p_random: float):
    """The share mask (1 = uploaded) withholding the largest then random nonzero coordinates."""
    shared = jax.tree_util.tree_map(lambda u: (u != 0).astype(jnp.float32), update)
    n = sum(jnp.sum(u != 0, dtype=jnp.int32) for u in jax.tree_util.tree_leaves(update))
    keep = magnitude_mask(update, p_largest, "highest", eligible=shared, rate_of_eligible=True)
    if p_random > 0:
        scores = unflatten(jax.random.uniform(key, (num_params(update),), jnp.float32), update)
        # Random withholding among the shared coordinates the Largest step kept.
        rest = jax.tree_util.tree_map(jnp.multiply, keep, shared)
        extra = mask_pruning_count(scores, rate_count(p_random, n), "lowest", rest)
        keep = jax.tree_util.tree_map(jnp.multiply, keep, extra)
    return keep


def make_defense_pruning(p_largest: float, p_random: float, pseudo: bool, name: str,
                         upload: str = "update") -> Defense:
    """Build an upload defense withholding ``p_largest`` + ``p_random`` of Δ.

    Args:
      p_largest: rate of largest-|Δ| coordinates withheld.
      p_random: rate (of the n shared coordinates) of random ones withheld among the rest.
      pseudo: keep withheld local weights and compose them back next round.
      name: the defense's display name.
      upload: ``"update"`` or ``"weights"`` (module docstring).

    Raises:
      ValueError: for rates outside [0, 1] or summing above 1, an unknown
        ``upload``, a ``pseudo`` that is not a bool, or (when applied) a weight upload without
        ``context.global_params``.
    """
    p_largest = check_rate(p_largest, "p_largest")
    p_random = check_rate(p_random, "p_random")
    upload = check_upload(upload)
    if not isinstance(pseudo, bool):  # a string "false" would otherwise mean True
        raise ValueError(f"pseudo must be true or false, got {pseudo!r}")
    if p_largest + p_random > 1.0 + 1e-12:
        raise ValueError(f"p_largest + p_random must be <= 1, got {p_largest} + {p_random}")

    def init(params):
        if not pseudo:
            return ()
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return {"local": zeros, "withheld": jax.tree_util.tree_map(
            lambda l: jnp.zeros(jnp.shape(l), jnp.float32), params)}

    def apply(update, state, *, key, context=None):
        if p_random > 0:
            require_key(key, name)
        keep = defense_mask(update, key, p_largest, p_random)
        out = withhold(update, keep, upload,
                       None if context is None else context.global_params)
        if pseudo:
            if context is None or context.params is None:
                raise ValueError(f"{name}: Pseudo-Pruning needs context.params (the local "
                                 "weights after training)")
            state = {"local": context.params,
                     "withheld": jax.tree_util.tree_map(lambda k: 1.0 - k, keep)}
        return out, state

    begin = pseudo_pruning_begin if pseudo else None

    return Defense(init=init, apply=apply, stage="upload", name=name, begin_round=begin)


@register_defense("prune_largest")
def prune_largest(p: float, pseudo: bool = False, upload: str = "update") -> Defense:
    """Largest defense (002, "Pruning as a Privacy Defense for FL"): withhold the ``p`` largest-|Δ| shared coordinates."""
    return make_defense_pruning(p, 0.0, pseudo, f"largest{'_pseudo' if pseudo else ''}(p={p:g})",
                                upload)


@register_defense("prune_random")
def prune_random(p: float, pseudo: bool = False, upload: str = "update") -> Defense:
    """Random defense (002, "Pruning as a Privacy Defense for FL"): withhold a random ``p`` fraction of the shared coordinates of Δ."""
    return make_defense_pruning(0.0, p, pseudo, f"random{'_pseudo' if pseudo else ''}(p={p:g})",
                                upload)


@register_defense("prune_mix")
def prune_mix(p_largest: float, p_random: float, pseudo: bool = False,
              upload: str = "update") -> Defense:
    """Mix defense (002, "Pruning as a Privacy Defense for FL"): withhold ``p_largest`` largest plus ``p_random`` random."""
    return make_defense_pruning(p_largest, p_random, pseudo,
                                f"mix{'_pseudo' if pseudo else ''}({p_largest:g}+{p_random:g})",
                                upload)
