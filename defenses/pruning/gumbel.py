"""Binary Gumbel-softmax sampling of the PriPrune defense mask (paper 002 Eq 7).

For each parameter j with α_j = P(not shared), π_j = [α_j, 1 − α_j] and
G ~ Gumbel(0, 1) i.i.d.,

    v_j = exp((log α_j + G_0)/τ) / Σ_{i∈{0,1}} exp((log π_j(i) + G_i)/τ)
        = σ((log α_j − log(1 − α_j) + G_0 − G_1) / τ),

the relaxed indicator of "not shared" (Jang et al. 2017; Maddison et al.
2017). As τ → 0, v_j → 1[argmax_i(log π_j(i) + G_i) = 0], which by the
Gumbel-max trick is Bernoulli(α_j); for τ > 0, v_j is differentiable in α_j.
α is parametrised by logits θ (α = σ(θ)) so it stays in (0, 1) under
gradient steps; log α = log σ(θ), log(1 − α) = log σ(−θ) in a stable form.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedsim import random_draws
from fedsim.typing import PRNGKey


def gumbel_not_shared(key: PRNGKey, theta: jax.Array, tau: float, hard: bool = False) -> jax.Array:
    """Relaxed (or straight-through hard) "not shared" indicator v for logits θ.

    Args:
      key: PRNG key (one Gumbel pair per coordinate).
      theta: logits of α, any shape.
      tau: temperature > 0.
      hard: return the hard sample in the forward pass with the soft sample's
        gradient (straight-through).
    """
    if not tau > 0 or tau == float("inf"):  # NaN fails the comparison
        raise ValueError(f"Gumbel-softmax temperature tau must be a finite number > 0, got {tau}")
    # Drawn flat (same bits): per-coordinate pairs of a kernel compile seconds
    # longer as a multi-dimensional draw on XLA:CPU (fedsim.random_draws).
    g = random_draws.gumbel(key, (2,) + jnp.shape(theta), jnp.float32)
    z = (jax.nn.log_sigmoid(theta) - jax.nn.log_sigmoid(-theta) + g[0] - g[1]) / tau
    v = jax.nn.sigmoid(z)
    if hard:
        v = v + jax.lax.stop_gradient((z > 0).astype(v.dtype) - v)
    return v


def gumbel_tree(key: PRNGKey, thetas, tau: float, hard: bool = False):
    """:func:`gumbel_not_shared` over a pytree of logits, one key per leaf."""
    leaves, treedef = jax.tree_util.tree_flatten(thetas)
    keys = jax.random.split(key, len(leaves))
    return jax.tree_util.tree_unflatten(
        treedef, [gumbel_not_shared(k, t, tau, hard) for k, t in zip(keys, leaves)])
