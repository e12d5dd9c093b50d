"""Soteria's per-feature scores and the perturbed representation r′ (Alg 1).

Paper 003 §4.2, Eq 8 with p = 2, q = 0: zero the ε features of r with the
largest ‖rᵢ (∇_X f(rᵢ))⁻¹‖₂. ∇_X fᵢ is the 1×N row of the Jacobian of the
representation; its (Moore–Penrose) inverse is ∇_X fᵢᵀ / ‖∇_X fᵢ‖², so the
paper's score is exactly

    s_exact(i) = |rᵢ| / ‖∇_X rᵢ‖₂          ("exact", prune the largest).

The authors' public code (jeremy313/Soteria, ``deviation_f1_x_norm``) instead
ranks features by the signed ratio ‖∇_X rᵢ‖₂ / rᵢ, summed over the examples of
the batch, and zeroes those below the p-th percentile:

    s_code(i) = ‖∇_X rᵢ‖₂ / rᵢ              ("code", prune the smallest).

For non-negative representations (sigmoid LeNet, ReLU ConvNet) the two
orderings coincide per example (s_code = 1 / s_exact); they differ when r has
negative entries (code prunes them first) and in how a batch is pooled (sum of
s_code vs sum of s_exact). A feature with rᵢ = 0 is never preferred by either
(its removal changes nothing). Both zero exactly ``round(p_fc · L)`` features
(the code's ``np.percentile`` threshold zeroes approximately that many).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

SCORES = ("exact", "code")
SCOPES = ("example", "batch")


def prune_priority(r: jax.Array, grad_norm: jax.Array, score: str) -> jax.Array:
    """Per-feature priority (higher = zeroed first), per example: [B, L].

    Args:
      r: [B, L] representations.
      grad_norm: [B, L] ‖∇_X rᵢ‖₂ per example and feature.
      score: "exact" (paper) or "code" (authors' public code).
    """
    abs_r = jnp.abs(r)
    if score == "exact":
        # ‖∇rᵢ‖ = 0 with rᵢ ≠ 0: first-order X′ is unbounded -> prune first.
        return jnp.where(grad_norm > 0, abs_r / jnp.where(grad_norm > 0, grad_norm, 1.0),
                         jnp.where(abs_r > 0, jnp.inf, 0.0))
    if score == "code":
        # Prune the SMALLEST ‖∇rᵢ‖/rᵢ: priority is its negation; rᵢ = 0 gives
        # ±inf/nan in the authors' code, never pruned -> lowest priority here.
        ratio = grad_norm / jnp.where(r != 0, r, 1.0)
        return jnp.where(r != 0, -ratio, -jnp.inf)
    raise ValueError(f"soteria score {score!r}; allowed: {', '.join(SCORES)}")


def pool_batch(priority: jax.Array, example_mask: jax.Array, score: str) -> jax.Array:
    """One [L] priority for the whole batch (the authors' code sums over examples).

    Padding rows (``example_mask`` = 0) do not count.
    """
    w = example_mask[:, None]
    if score == "code":
        # Sum the code's ratio ‖∇rᵢ‖/rᵢ (= −priority); rᵢ = 0 rows stay "never".
        finite = jnp.isfinite(priority)
        summed = jnp.sum(jnp.where(finite, priority, 0.0) * w, axis=0)
        never = jnp.any(~finite & (w > 0), axis=0)
        return jnp.where(never, -jnp.inf, summed)
    return jnp.sum(jnp.where(w > 0, priority, 0.0), axis=0)


def keep_mask(priority: jax.Array, num_pruned: int) -> jax.Array:
    """{0,1} float mask over the last axis: 0 at the ``num_pruned`` top priorities.

    Ties are broken by position (``lax.top_k``), so exactly ``num_pruned``
    entries are zeroed.
    """
    L = priority.shape[-1]
    if num_pruned <= 0:
        return jnp.ones(priority.shape, jnp.float32)
    # top_k cannot rank -inf/nan reliably against each other; map them to the bottom.
    safe = jnp.where(jnp.isnan(priority), -jnp.inf, priority)
    _, idx = jax.lax.top_k(safe, min(num_pruned, L))
    pruned = jnp.sum(jax.nn.one_hot(idx, L, dtype=jnp.float32), axis=-2)
    return 1.0 - jnp.minimum(pruned, 1.0)


def num_pruned_features(p_fc: float, num_features: int) -> int:
    """ε of Alg 1 as a count: ``round(p_fc · L)``."""
    return int(round(p_fc * num_features))


def perturb_representation(r: jax.Array, grad_norm: jax.Array, p_fc: float, *,
                           score: str = "exact", scope: str = "example",
                           example_mask: jax.Array | None = None):
    """Alg 1 (PERTURB REP): r′ = r with the top-ε scored features set to 0.

    Args:
      r: [B, L] clean representations.
      grad_norm: [B, L] ‖∇_X rᵢ‖₂.
      p_fc: pruning rate in [0, 1]; ε = round(p_fc · L).
      score: "exact" or "code" (see module docstring).
      scope: "example" (Alg 2: a mask per example X ∈ B) or "batch" (one
        mask from scores summed over the batch, as in the authors' code).
      example_mask: [B] 1 for real examples (batch pooling ignores padding).

    Returns:
      ``(r_prime, keep)`` with keep the {0,1} mask broadcastable to r.
    """
    if scope not in SCOPES:
        raise ValueError(f"soteria scope {scope!r}; allowed: {', '.join(SCOPES)}")
    priority = prune_priority(r, grad_norm, score)
    k = num_pruned_features(p_fc, r.shape[-1])
    if scope == "batch":
        if example_mask is None:
            example_mask = jnp.ones(r.shape[:1], r.dtype)
        keep = keep_mask(pool_batch(priority, example_mask, score), k)[None, :]
    else:
        keep = keep_mask(priority, k)
    return r * keep, keep
