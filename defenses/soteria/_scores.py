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
(its removal changes nothing); the code score never prunes it at all (the
authors' code gives it inf/nan), and in batch scope never prunes a feature
that is 0 in any example of the batch. Both zero ``round(p_fc · L)``
features (the code's ``np.percentile`` threshold zeroes approximately that
many), or all the prunable ones where fewer can be pruned (code score only).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from defenses.pruning.masks import check_rate as check_pruning_rate

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

    A priority of −inf (or NaN) means "never pruned": per row, min(num_pruned,
    number of other entries) entries are zeroed. Ties are broken by position
    (``lax.top_k``).
    """
    L = priority.shape[-1]
    if num_pruned <= 0:
        return jnp.ones(priority.shape, jnp.float32)
    # top_k cannot rank -inf/nan reliably against each other; map them to the bottom.
    safe = jnp.where(jnp.isnan(priority), -jnp.inf, priority)
    vals, idx = jax.lax.top_k(safe, min(num_pruned, L))
    # Once num_pruned exceeds the prunable entries, top_k also returns -inf ones: skip them.
    hit = jax.nn.one_hot(idx, L, dtype=jnp.float32) * (vals > -jnp.inf)[..., None]
    pruned = jnp.sum(hit, axis=-2)
    return 1.0 - jnp.minimum(pruned, 1.0)


def check_rate(p_fc) -> float:
    """``p_fc`` as a float in [0, 1], or a ValueError naming it.

    ε = round(p_fc · L) is a static count (``lax.top_k``'s k), so a traced
    p_fc cannot work under jit; close over it instead (as :func:`soteria` does).
    """
    if isinstance(p_fc, jax.core.Tracer):
        raise ValueError("soteria p_fc must be a concrete number in [0, 1], not a traced value "
                         "(ε = round(p_fc · L) is a static count): close over it instead of "
                         "passing it as a jit/vmap argument")
    return check_pruning_rate(p_fc, "soteria p_fc")


def num_pruned_features(p_fc: float, num_features: int) -> int:
    """ε of Alg 1 as a count: ``round(p_fc · L)`` (``p_fc`` checked to be in [0, 1])."""
    return int(round(check_rate(p_fc) * num_features))


def perturb_representation(r: jax.Array, grad_norm: jax.Array, p_fc: float, *,
                           score: str = "exact", scope: str = "example",
                           example_mask: jax.Array | None = None):
    """Alg 1 (PERTURB REP): r′ = r with the top-ε scored features set to 0.

    Args:
      r: [B, L] clean representations.
      grad_norm: [B, L] ‖∇_X rᵢ‖₂.
      p_fc: pruning rate in [0, 1] (a concrete number); ε = round(p_fc · L)
        features, fewer where fewer can be pruned (``score="code"``: a
        feature with rᵢ = 0 — in batch scope, in any real example — never is).
      score: "exact" or "code" (see module docstring).
      scope: "example" (Alg 2: a mask per example X ∈ B) or "batch" (one
        mask from scores summed over the batch, as in the authors' code).
      example_mask: [B] 1 for real examples (batch pooling ignores padding).

    Returns:
      ``(r_prime, keep)`` with keep the {0,1} mask broadcastable to r.

    Raises:
      ValueError: for a p_fc outside [0, 1] (or not a concrete number), or an
        unknown score/scope.
    """
    k = num_pruned_features(p_fc, r.shape[-1])  # checks p_fc first
    if scope not in SCOPES:
        raise ValueError(f"soteria scope {scope!r}; allowed: {', '.join(SCOPES)}")
    priority = prune_priority(r, grad_norm, score)
    if scope == "batch":
        if example_mask is None:
            example_mask = jnp.ones(r.shape[:1], r.dtype)
        keep = keep_mask(pool_batch(priority, example_mask, score), k)[None, :]
    else:
        keep = keep_mask(priority, k)
    return r * keep, keep
