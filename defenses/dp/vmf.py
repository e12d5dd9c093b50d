"""The von Mises–Fisher mechanism: exact sampler and DP-SGD with VMF noise.

Sampler: Wood (1994), "Simulation of the von Mises Fisher distribution",
Commun. Statist. 23(1). For VMF(μ, κ) on S^{p−1} (density ∝ exp(κ μᵀx)):

    b  = (p−1) / (2κ + √(4κ² + (p−1)²)),  x₀ = (1−b)/(1+b)
    repeat: Z ~ Beta((p−1)/2, (p−1)/2), U ~ U(0, 1),
            W = (1 − (1+b)Z) / (1 − (1−b)Z)
    until   κ(W − x₀) + (p−1)·log((1 − x₀W)/(1 − x₀²)) ≥ log U
    X = W μ + √(1−W²) v,  v uniform on the unit sphere of μ's orthogonal complement.

This is exact (a rejection sampler for the marginal of W = μᵀX, whose density
is ∝ e^{κw}(1−w²)^{(p−3)/2}). Stability for p = 13,700 and κ up to 1e4: b and
x₀ are computed in float64 on the host (κ, p are static), and the acceptance
test is written as κ(W − x₀) + (p−1)·log1p(x₀(x₀−W)/(1−x₀²)) instead of
Wood's κW + (p−1)log(1−x₀W) − c, which subtracts numbers of size ~κ and loses
float32 precision. The loop is vectorised: each round draws ``candidates``
proposals per sample in one call and keeps the first accepted one; a
``lax.while_loop`` redraws for samples with none accepted (rare), up to
``max_rounds`` after which the sample is NaN (detected by the engine).

Defense: Algorithm 2 (lines 6–11) of Biswas et al. (001): clip each example's
gradient to C, average, scale to unit norm, and replace the gradient by one
VMF(g̃/‖g̃‖, κ) sample (unit norm). Guarantee: one step is ε_d-metric private
w.r.t. the angular distance (metric privacy: 001 §III, Def 2; the VMF
mechanism: Def 4, Eq 4), with RDP
(001 §III-A, Prop 1) given by ``defenses.accounting.vmf_rdp``; (ε, δ) by ``vmf_epsilon``. The dimension p is
the total number of model parameters (the flattened gradient).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from fedsim import random_draws
from fedsim.hooks import Defense, register_defense
from fedsim.keys import require_key
from defenses.dp._params import DPParameters
from defenses.dp.clipping import check_clipping, check_positive
from defenses.dp.gaussian import clipped_sum


def wood_constants(kappa: float, dim: int) -> tuple[float, float]:
    """(b, x₀) of Wood's algorithm, in float64 (stable form of b)."""
    m1 = dim - 1.0
    b = m1 / (2.0 * kappa + math.sqrt(4.0 * kappa * kappa + m1 * m1))
    return b, (1.0 - b) / (1.0 + b)


def sample_vmf_cosine(key: jax.Array, kappa: float, dim: int, num: int, *,
                      candidates: int = 8, max_rounds: int = 200) -> jax.Array:
    """``num`` exact samples of W = μᵀX for X ~ VMF(μ, κ) on S^{dim−1}.

    Args:
      key: PRNG key.
      kappa: concentration κ > 0 (static).
      dim: p ≥ 2 (static).
      num: number of samples.
      candidates: proposals drawn per sample per round (vectorisation width).
      max_rounds: redraw rounds before giving up (NaN).

    Returns:
      float32 [num] in [−1, 1].
    """
    kappa = check_positive("kappa", kappa)
    if int(dim) < 2:
        raise ValueError(f"dim must be >= 2 for a sphere S^(dim-1), got {dim}")
    return _cosine_sampler(kappa, int(dim), int(num), int(candidates), int(max_rounds))(key)


@functools.lru_cache(maxsize=128)
def _cosine_sampler(kappa: float, dim: int, num: int, candidates: int, max_rounds: int):
    """A jitted ``key -> W`` sampler, cached so eager calls compile once."""
    b, x0 = wood_constants(kappa, dim)
    m1 = float(dim - 1)
    half = m1 / 2.0
    one_minus_x0sq = 1.0 - x0 * x0
    f32 = jnp.float32

    def propose(k):
        kz, ku = jax.random.split(k)
        # Not through fedsim.random_draws: beta draws gamma variates, which JAX
        # already draws flat (one key per element, then a reshape).
        z = jax.random.beta(kz, half, half, (num, candidates), dtype=f32)
        u = random_draws.uniform(ku, (num, candidates), f32, minval=1e-38, maxval=1.0)
        w = (1.0 - (1.0 + b) * z) / (1.0 - (1.0 - b) * z)
        log_ratio = kappa * (w - x0) + m1 * jnp.log1p(x0 * (x0 - w) / one_minus_x0sq)
        ok = log_ratio >= jnp.log(u)
        first = jnp.argmax(ok, axis=1)
        w_first = jnp.take_along_axis(w, first[:, None], axis=1)[:, 0]
        return w_first, jnp.any(ok, axis=1)

    def cond(carry):
        i, _, accepted = carry
        return (i < max_rounds) & ~jnp.all(accepted)

    @jax.jit
    def sample(key):
        def body(carry):
            i, w, accepted = carry
            w_new, ok = propose(jax.random.fold_in(key, i))
            take = ~accepted & ok
            return i + 1, jnp.where(take, w_new, w), accepted | ok

        init = (jnp.int32(0), jnp.full((num,), jnp.nan, f32), jnp.zeros((num,), bool))
        _, w, _ = jax.lax.while_loop(cond, body, init)
        return jnp.clip(w, -1.0, 1.0)

    return sample


def sample_vmf(key: jax.Array, mu: jax.Array, kappa: float, num: int | None = None,
               **kwargs) -> jax.Array:
    """Exact samples of VMF(μ, κ) on S^{p−1} (Wood 1994).

    Args:
      key: PRNG key.
      mu: float [p], the mean direction (normalised here; must be non-zero;
        a NaN μ gives NaN samples).
      kappa: concentration κ > 0.
      num: number of samples (None: one sample, shape [p]).
      **kwargs: passed to :func:`sample_vmf_cosine`.

    Returns:
      float32 [p] or [num, p], unit-norm rows.
    """
    mu = jnp.asarray(mu, jnp.float32)
    if mu.ndim != 1:
        raise ValueError(f"mu must be a vector [p], got shape {mu.shape}")
    if not isinstance(mu, jax.core.Tracer) and not bool(jnp.any(mu != 0)):
        # Traced (inside dp_vmf's jitted step) a zero μ cannot be refused here;
        # dp_vmf never passes one.
        raise ValueError("mu must be non-zero: a zero vector has no direction to centre "
                         "the VMF on")
    dim = mu.shape[0]
    n = 1 if num is None else int(num)
    k_w, k_v = jax.random.split(key)
    mu = mu / jnp.linalg.norm(mu)
    w = sample_vmf_cosine(k_w, kappa, dim, n, **kwargs)
    # Uniform direction in μ's orthogonal complement: project a Gaussian.
    xi = random_draws.normal(k_v, (n, dim), jnp.float32)
    xi = xi - (xi @ mu)[:, None] * mu[None, :]
    v = xi / jnp.linalg.norm(xi, axis=1, keepdims=True)
    x = w[:, None] * mu[None, :] + jnp.sqrt(jnp.maximum(1.0 - w * w, 0.0))[:, None] * v
    return x[0] if num is None else x


@register_defense("dp_vmf")
def dp_vmf(kappa: float, clip_norm: float = 1.0, clipping: str = "flat") -> Defense:
    """Example-stage DP-SGD with VMF noise (001 Alg 2, lines 6–11).

    Args:
      kappa: κ > 0, the VMF concentration (larger = less noise).
      clip_norm: C > 0, the per-example L2 bound (line 7).
      clipping: "flat" or "per_layer".

    Returns:
      A stateless :class:`Defense` whose output gradient is one unit-norm VMF
      sample centred on the direction of the clipped average (the output
      replaces the gradient, as in Alg 2). A zero average gradient has no
      direction; μ is then drawn uniformly (the VMF of any μ is equally valid
      and this keeps the output on the sphere). A NaN or inf gradient gives a
      NaN output, not a sample.
    """
    kappa = check_positive("kappa", kappa)
    clip_norm = check_positive("clip_norm", clip_norm)
    check_clipping(clipping)
    params = DPParameters("vmf", kappa=kappa, clip_norm=clip_norm)

    def apply(per_example, state, *, key, context=None):
        mask = None if context is None else context.mask
        total, _, unflatten, count = clipped_sum(per_example, mask, clip_norm, clipping)
        mean = total / count
        require_key(key, name)
        k_dir, k_sample = jax.random.split(key)
        norm = jnp.linalg.norm(mean)
        fallback = jax.random.normal(k_dir, mean.shape, mean.dtype)
        # Only an exactly zero mean takes the random direction. A NaN mean (a
        # NaN or inf gradient: clipping an inf norm gives inf·0) stays NaN, so the
        # engine's training.on_nonfinite sees it; `norm > 0` sent it to the
        # fallback, and a non-finite gradient came out a finite random one.
        mu = jnp.where(norm == 0, fallback, mean)
        return unflatten(sample_vmf(k_sample, mu, kappa)), state

    name = f"dp_vmf(kappa={kappa:g},C={clip_norm:g},{clipping})"
    # The sampler's while loops (Wood's rejection, the Beta draw's gamma) compiled
    # again in every unrolled local step: on LeNet-5 an 11× longer first round
    # for rounds 1.5× faster, paid back after 1,245 rounds
    # (benchmarks/results/unroll_steps_vmf_lenet5_cpu.md), so the steps run in a
    # scan whatever training.unroll_steps.
    return Defense(init=lambda p: (), apply=apply, stage="example", name=name,
                   guarantees=(params,), scan_local_steps=True)
