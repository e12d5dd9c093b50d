"""DP-SGD with the Gaussian mechanism (per-example clip, sum, noise, average).

Implements Algorithm 1 (lines 6–10) of Biswas et al. (001), which is DP-SGD of
Abadi et al. (2016), the "DP-SGD" baseline of Tan et al. (000 §6.3):

    ḡ(xᵢ) = g(xᵢ) / max(1, ‖g(xᵢ)‖₂ / C)                 (line 7, clip)
    g̃     = (Σᵢ ḡ(xᵢ) + N(0, σ² C² I)) / L                 (lines 9–10)

with L the number of REAL examples in the batch (padding rows are masked out).

Guarantee: one step is the Gaussian mechanism with L2 sensitivity C (flat
clipping, add/remove-one adjacency) and noise multiplier σ; with Poisson /
uniform subsampling at rate q over T steps its (ε, δ) follows from RDP
accounting (:mod:`defenses.accounting`, ``gaussian_epsilon``).

Per-layer clipping (``clipping="per_layer"``) clips each of the R layer tensors
to C, the Opacus per-layer mode 001 Table II calls "clip"; the total
sensitivity is then C·√R and the noise std is σ·C·√R (as Opacus does, using
the L2 norm of the per-layer bounds).

Deviation / why not optax: ``optax.contrib.differentially_private_aggregate``
draws noise per leaf from an internal seed in its state and divides by the
padded batch size; the engine needs an explicit key, masking of padding rows
and one noise draw over the flattened parameters (compile time), so the
reduction is written here, leaf by leaf (``clipping.clip_examples`` /
``clip_layers``), concatenating only the [P] sums.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedsim.hooks import Defense, register_defense
from fedsim.keys import require_key
from defenses.dp._flat import batched_rows, check_mask, real_count
from defenses.dp._params import DPParameters
from defenses.dp.clipping import (check_clipping, check_noise_multiplier, check_positive,
                                   clip_examples, clip_layers)


def clipped_sum(per_example, mask, clip_norm: float, clipping: str):
    """Clip every example's gradient and sum them.

    Returns:
      (sum [P], sensitivity (total L2 bound of one example), unflatten, count).
    """
    blocks, unflatten = batched_rows(per_example)
    batch = blocks[0].shape[0]
    check_mask(mask, batch)
    if mask is not None:
        blocks = [b * mask.astype(b.dtype)[:, None] for b in blocks]
    if clipping == "flat":
        clipped, _ = clip_examples(blocks, clip_norm)
        sensitivity = clip_norm
    else:
        clipped, _ = clip_layers(blocks, clip_norm)
        sensitivity = clip_norm * len(blocks) ** 0.5
    # Summed leaf by leaf; only the [P] sums are concatenated (one noise draw).
    total = jnp.concatenate([jnp.sum(c, axis=0) for c in clipped])
    return total, sensitivity, unflatten, real_count(mask, batch)


@register_defense("dp_gaussian")
def dp_gaussian(noise_multiplier: float, clip_norm: float = 1.0,
                clipping: str = "flat") -> Defense:
    """Example-stage DP-SGD Gaussian defense (001 Alg 1).

    Args:
      noise_multiplier: σ ≥ 0 (noise std is σ × sensitivity); 0 means clip only.
      clip_norm: C > 0, the per-example (or per-layer) L2 bound.
      clipping: "flat" (whole model) or "per_layer" (Opacus per-layer).

    Returns:
      A stateless :class:`Defense` at stage "example".
    """
    sigma = check_noise_multiplier(noise_multiplier)
    clip_norm = check_positive("clip_norm", clip_norm)
    check_clipping(clipping)

    def apply(per_example, state, *, key, context=None):
        mask = None if context is None else context.mask
        total, sensitivity, unflatten, count = clipped_sum(per_example, mask, clip_norm, clipping)
        if sigma > 0:
            require_key(key, name)
            # One draw over all P coordinates (not one per leaf).
            total = total + sigma * sensitivity * jax.random.normal(key, total.shape, total.dtype)
        return unflatten(total / count), state

    mech = "gauss" if sigma > 0 else "clip"
    name = f"dp_gaussian(sigma={sigma:g},C={clip_norm:g},{clipping})"
    return Defense(init=lambda params: (), apply=apply, stage="example", name=name,
                   guarantees=(DPParameters(mech, noise_multiplier=sigma, clip_norm=clip_norm),))


@register_defense("dp_clip")
def dp_clip(clip_norm: float = 1.0, clipping: str = "per_layer") -> Defense:
    """Per-example clipping and averaging without noise (001 Table II "clip").

    No formal DP guarantee (σ = 0); bounds each example's influence by C.
    """
    return dp_gaussian(0.0, clip_norm=clip_norm, clipping=clipping)
