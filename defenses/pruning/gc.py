"""GC: magnitude pruning of the whole upload (gradient compression baseline).

Sun et al. 2021 (Soteria, paper 003), §6.1 "Defense baselines": "GC prunes
gradients that are below a threshold magnitude, such that only a part of local
updates will be communicated between devices and the server", with p_model the pruning rate of the local model's gradients
(Table 2: 1–80 % against DLG, 1–90 % against GS); originally Lin et al. 2018
(Deep Gradient Compression) and Zhu et al. 2019 (DLG, §5 "gradient pruning").

This is the ONE shared implementation (Soteria's baseline and pruned-FL use
it). The threshold is the p-quantile of |Δ| over the whole model: exactly
``round(p·d)`` coordinates (the smallest |Δ|, ties by position) are set to 0.

Guarantee: none formal; a pruned coordinate is exactly 0 in the upload.
Deviation: DGC accumulates the pruned residual locally; GC as a privacy
baseline (Soteria, DLG) drops it, and so do we.
"""

from __future__ import annotations

from fedsim.hooks import Defense, register_defense
from fedsim.typing import Updates
from defenses.pruning.masks import apply_mask, check_rate, magnitude_mask


def magnitude_prune(update: Updates, p: float) -> Updates:
    """Zero the ``round(p·d)`` smallest-|value| coordinates of ``update`` (whole model).

    Args:
      update: any pytree of arrays (a gradient or a model update Δ).
      p: pruning rate in [0, 1].

    Returns:
      The pruned pytree (same structure, shapes and dtypes).
    """
    return apply_mask(update, magnitude_mask(update, check_rate(p, "gc p")))


@register_defense("gc")
def gc(p: float) -> Defense:
    """GC defense (stage "upload"): prune the ``p`` smallest-magnitude entries of Δ.

    Args:
      p: pruning rate in [0, 1] (Soteria's p_model).

    Raises:
      ValueError: if ``p`` is not in [0, 1].
    """
    p = check_rate(p, "gc p")

    def apply(update, state, *, key=None, context=None):
        del key, context
        return magnitude_prune(update, p), state

    return Defense(init=lambda params: (), apply=apply, stage="upload", name=f"gc(p={p:g})")
