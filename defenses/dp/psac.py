"""DP-PSAC: DP-SGD with per-sample adaptive clipping (Xia et al., AAAI 2023).

Paper: T. Xia, S. Shen, S. Yao, X. Fu, K. Xu, X. Xu, X. Fu, W. Wang,
"Differentially private learning with per-sample adaptive clipping",
arXiv:2212.00328 (000 ref [56], the DP-PSAC baseline of 000 §6.3).

Their Algorithm 1 replaces the clip ḡ = g / max(1, ‖g‖/C) by a per-sample
normalisation with a NON-MONOTONIC weight function:

    ḡᵢ = C · gᵢ · w(‖gᵢ‖),   w(s) = 1 / (s + r / (s + r)),   r > 0

and then, as DP-SGD, g̃ = (Σᵢ ḡᵢ + N(0, σ² C² I)) / L.

Weight function used here: exactly w(s) = 1/(s + r/(s + r)) with the
user-given r (default r = 0.1). Since r/(s+r) > 0, ‖ḡᵢ‖ = C·s/(s + r/(s+r))
< C, so the L2 sensitivity is C and the privacy guarantee (and accounting)
are those of DP-SGD with noise multiplier σ. Small-norm gradients are scaled
up far less than by plain normalisation g/‖g‖ (the motivation of the paper:
w(s)·s → 0 as s → 0). Deviation: the formula is implemented from the
published algorithm as summarised above; the paper's text is not in this
repository, so the docstring states the exact function used.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedsim.hooks import Defense, register_defense
from fedsim.keys import require_key
from defenses.dp._flat import batched_rows, check_mask, real_count
from defenses.dp._params import DPParameters
from defenses.dp.clipping import check_noise_multiplier, check_positive


def psac_weights(norms: jax.Array, r: float) -> jax.Array:
    """w(s) = 1 / (s + r/(s + r)) for per-example norms s.

    Raises:
      ValueError: unless r is a finite number > 0 (r = 0 gives 0/0 at a zero norm).
    """
    r = check_positive("r", r)
    return 1.0 / (norms + r / (norms + r))


@register_defense("dp_psac")
def dp_psac(noise_multiplier: float, clip_norm: float = 1.0, r: float = 0.1) -> Defense:
    """Example-stage DP-PSAC defense.

    Args:
      noise_multiplier: σ ≥ 0.
      clip_norm: C > 0 (sensitivity of one example).
      r: r > 0, the stability constant of the weight function.
    """
    sigma = check_noise_multiplier(noise_multiplier)
    clip_norm = check_positive("clip_norm", clip_norm)
    r = check_positive("r", r)

    def apply(per_example, state, *, key, context=None):
        mask = None if context is None else context.mask
        blocks, unflatten = batched_rows(per_example)
        check_mask(mask, blocks[0].shape[0])
        if mask is not None:
            blocks = [b * mask.astype(b.dtype)[:, None] for b in blocks]
        # Leaf by leaf, as clipping.clip_examples (benchmarks/dp_clip_cpu.py).
        norms = jnp.sqrt(sum(jnp.sum(b * b, axis=1) for b in blocks))
        weights = clip_norm * psac_weights(norms, r)
        total = jnp.concatenate([jnp.sum(b * weights[:, None], axis=0) for b in blocks])
        if sigma > 0:
            require_key(key, "dp_psac")
            total = total + sigma * clip_norm * jax.random.normal(key, total.shape, total.dtype)
        return unflatten(total / real_count(mask, blocks[0].shape[0])), state

    params = DPParameters("gauss" if sigma > 0 else "clip", noise_multiplier=sigma,
                          clip_norm=clip_norm)
    return Defense(init=lambda p: (), apply=apply, stage="example",
                   name=f"dp_psac(sigma={sigma:g},C={clip_norm:g},r={r:g})", guarantees=(params,))
