"""Parameter-space channel (Tan et al. 000, §5.1 Thm 2): the slow baseline.

Noise is added to the *update* instead of the data, calibrated so that the
capacity f(σ) = ½ Σ ln((λ_i + σ)/σ) of the update channel equals κ, with λ_i
the eigenvalues of the update's covariance given the received model. The
paper argues (§5.2) that this is expensive: the covariance lives in the
P-dimensional parameter space and changes every step, so it must be
re-estimated and re-decomposed each time. This module does exactly that, to
measure the cost.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from defenses.channels._guarantee import ChannelGuarantee
from defenses.channels._noise import check_kappa
from fedsim.client import cross_entropy
from fedsim.hooks import Defense, register_defense
from fedsim.keys import require_key

__all__ = ["parameter_channel", "solve_natural_log_sigma", "solve_natural_sigma"]


def _log_expm1(x: jax.Array) -> jax.Array:
    """ln(eˣ − 1) for x > 0 without overflow: x + ln(1 − e⁻ˣ)."""
    return x + jnp.log(-jnp.expm1(-x))


def solve_natural_log_sigma(eigenvalues: jax.Array, kappa: float,
                            iters: int = 200) -> jax.Array:
    """ln σ with ½ Σ ln(1 + λ_i/σ) = κ, by bisection on ln σ inside jit.

    The jit-able twin of :func:`defenses.bounds.natural_channel_sigma` (tested
    against it). Bracket: f(σ) ≤ (r/2) ln(1 + λ_max/σ) and ≥ ½ ln(1 + λ_max/σ),
    r = number of positive eigenvalues; widened by e^±1. Everything stays in
    logs: for large κ, σ ~ λ_max e^(−2κ/r) underflows float32 (and e^(2κ/r)
    overflows it past 2κ/r ≈ 88.7) while ln σ and the noise's standard
    deviation e^(ln σ / 2) are still representable.
    """
    lam = jnp.maximum(eigenvalues.astype(jnp.float32), 0.0)
    log_lam = jnp.log(lam)                     # −inf where λ = 0: adds ln 1 = 0 below
    log_lmax = jnp.log(jnp.maximum(jnp.max(lam), 1e-30))
    r = jnp.maximum(jnp.sum(lam > 0), 1).astype(jnp.float32)
    kappa = jnp.asarray(kappa, jnp.float32)
    lo = log_lmax - _log_expm1(2.0 * kappa) - 1.0
    hi = log_lmax - _log_expm1(2.0 * kappa / r) + 1.0

    def f(log_s):
        # ln(1 + λ/σ) = logaddexp(0, ln λ − ln σ): λ/σ itself overflows float32.
        return 0.5 * jnp.sum(jnp.logaddexp(0.0, log_lam - log_s))

    def body(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        above = f(mid) > kappa
        return jnp.where(above, mid, lo), jnp.where(above, hi, mid)

    lo, hi = jax.lax.fori_loop(0, iters, body, (lo, hi))
    return 0.5 * (lo + hi)


def solve_natural_sigma(eigenvalues: jax.Array, kappa: float, iters: int = 200) -> jax.Array:
    """σ with ½ Σ ln(1 + λ_i/σ) = κ: e to the :func:`solve_natural_log_sigma`.

    σ underflows float32 to 0 once ln σ < −103 (κ ≳ 52 r nats for unit λ);
    the defense itself uses ln σ, so its noise stays positive there.
    """
    return jnp.exp(solve_natural_log_sigma(eigenvalues, kappa, iters))


@register_defense("parameter_channel")
def parameter_channel(kappa: float) -> Defense:
    """Thm 2 in parameter space: noise N(0, σ I) on each local step's gradient.

    At every local step: per-example gradients g_j of the batch (B of them),
    the covariance of the batch-mean gradient Σ/B (Eq. 22) from their sample
    covariance, its non-zero eigenvalues via the B × B Gram matrix (the P × P
    covariance has rank ≤ B − 1), σ from f(σ) = κ by bisection, and
    g̃ = g + √σ ξ. The step's update is −lr·g̃ (or the optimizer's map of it);
    f is scale-invariant, so calibrating on g is calibrating on the update.

    Guarantee: I(D; g̃ | W) ≤ f(σ) = κ per step when the mini-batch gradient
    is Gaussian with the estimated covariance (Thm 2; CLT for large B). The
    covariance is an estimate from B examples, so the guarantee is only as
    good as that estimate — one reason the paper prefers the data space.

    Deviation: the issue/paper place the noise on "the update"; the engine's
    upload stage does not see the client's data, so this acts at stage
    "layer" on every local step's batch gradient (each step is one use of
    the channel, matching n·κ with n = local steps).

    Args:
      kappa: capacity threshold κ > 0 (nats per step).

    Returns:
      A stage-"layer" :class:`~fedsim.hooks.Defense` named "parameter_channel(kappa=κ)"
        (κ in the name, so a checkpoint can tell channels apart).
      It needs ``context.params``, ``x``, ``y``, ``mask`` and ``apply_fn``.
    """
    kappa = check_kappa(kappa, "parameter_channel")

    def init(params):
        del params
        return ()

    def apply(grads, state, *, key, context=None):
        require_key(key, "parameter_channel")
        if context is None or context.x is None or context.apply_fn is None:
            raise ValueError("parameter_channel needs the step context (params, x, y, mask, "
                             "apply_fn); use it as a stage 'layer' defense in local training")
        params, x, y = context.params, context.x, context.y
        mask = jnp.ones(x.shape[0], jnp.float32) if context.mask is None else context.mask
        apply_fn = context.apply_fn

        def loss_one(p, xi, yi):
            return cross_entropy(apply_fn(p, xi[None]), yi[None])[0]

        per_ex = jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))(params, x, y)
        flat = jax.vmap(lambda g: ravel_pytree(g)[0])(per_ex)          # [B, P]
        n = jnp.maximum(jnp.sum(mask), 2.0)
        mean = jnp.sum(flat * mask[:, None], 0) / n
        centred = (flat - mean) * mask[:, None]
        gram = centred @ centred.T / (n - 1.0)                           # [B, B]
        lam = jnp.linalg.eigvalsh(gram) / n                              # of Cov(mean grad)
        log_sigma = solve_natural_log_sigma(lam, kappa)
        g_flat, unravel = ravel_pytree(grads)
        noise = jnp.exp(0.5 * log_sigma) * jax.random.normal(key, g_flat.shape, g_flat.dtype)
        return unravel(g_flat + noise), state

    return Defense(init=init, apply=apply, stage="layer",
                   name=f"parameter_channel(kappa={kappa:g})",
                   guarantees=(ChannelGuarantee(kappa),))
