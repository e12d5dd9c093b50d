"""Defense pruning of the upload: Largest, Random, Mix, and Pseudo-Pruning.

Chu et al. 2023 (PriPrune), §5 "Defense Pruning": on top of the base pruning
scheme the client withholds part of its update before uploading it:

* **Largest**: withhold the ``p`` fraction of coordinates with the largest
  |Δ| (they carry the most information about the data, §5 Obs. 1);
* **Random**: withhold a uniformly random ``p`` fraction;
* **Mix**: withhold the ``p_largest`` largest, then a random ``p_random``
  fraction (of d) of the rest.

Rates are fractions of the whole model d; exactly ``round(p·d)`` coordinates
are withheld (:mod:`defenses.pruning.masks`).

**Pseudo-Pruning** (§5, Fig 4): the withheld coordinates are not dropped: the
client keeps its local values of them and, next round, starts local training
from ``w_global ⊙ (1 − m̂) + w_local_prev ⊙ m̂`` (m̂ = 1 where withheld), so
the local model does not lose what it learnt; the server still never sees
the withheld coordinates. This uses :attr:`Defense.begin_round` and the
per-client state ``{"local": w_local_prev, "withheld": m̂}``.

Guarantee: a withheld coordinate is exactly 0 in the upload (tested on the
observer's view). Privacy is empirical (NMI/PSNR under SGI), bounded by
Thm 1 through the shared fraction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedsim.hooks import Defense, register_defense
from defenses.pruning.masks import apply_mask, check_rate, magnitude_mask, mask_from_scores, \
    num_params, pseudo_pruning_begin, unflatten


def defense_mask(update, key, p_largest: float, p_random: float):
    """The share mask (1 = uploaded) withholding the largest then random coordinates."""
    keep = magnitude_mask(update, p_largest, "highest")
    if p_random > 0:
        scores = unflatten(jax.random.uniform(key, (num_params(update),)), update)
        # Random withholding among the coordinates the Largest step kept.
        extra = mask_from_scores(scores, p_random, "lowest", eligible=keep)
        keep = jax.tree_util.tree_map(jnp.multiply, keep, extra)
    return keep


def make_defense_pruning(p_largest: float, p_random: float, pseudo: bool, name: str) -> Defense:
    """Build an upload defense withholding ``p_largest`` + ``p_random`` of Δ.

    Args:
      p_largest: rate of largest-|Δ| coordinates withheld.
      p_random: rate (of d) of random coordinates withheld among the rest.
      pseudo: keep withheld local weights and compose them back next round.
      name: the defense's display name.

    Raises:
      ValueError: for rates outside [0, 1] or summing above 1.
    """
    p_largest = check_rate(p_largest, "p_largest")
    p_random = check_rate(p_random, "p_random")
    if p_largest + p_random > 1.0 + 1e-12:
        raise ValueError(f"p_largest + p_random must be <= 1, got {p_largest} + {p_random}")

    def init(params):
        if not pseudo:
            return ()
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return {"local": zeros, "withheld": jax.tree_util.tree_map(
            lambda l: jnp.zeros(jnp.shape(l), jnp.float32), params)}

    def apply(update, state, *, key, context=None):
        keep = defense_mask(update, key, p_largest, p_random)
        out = apply_mask(update, keep)
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
def prune_largest(p: float, pseudo: bool = False) -> Defense:
    """Largest defense (§5): withhold the ``p`` largest-|Δ| coordinates."""
    return make_defense_pruning(p, 0.0, pseudo, f"largest{'_pseudo' if pseudo else ''}(p={p:g})")


@register_defense("prune_random")
def prune_random(p: float, pseudo: bool = False) -> Defense:
    """Random defense (§5): withhold a random ``p`` fraction of Δ."""
    return make_defense_pruning(0.0, p, pseudo, f"random{'_pseudo' if pseudo else ''}(p={p:g})")


@register_defense("prune_mix")
def prune_mix(p_largest: float, p_random: float, pseudo: bool = False) -> Defense:
    """Mix defense (§5): withhold ``p_largest`` largest plus ``p_random`` random."""
    return make_defense_pruning(p_largest, p_random, pseudo,
                                f"mix{'_pseudo' if pseudo else ''}({p_largest:g}+{p_random:g})")
