"""White channel (Tan et al. 000, §5.2): Σ_ξ = Q Ψ Q^T, σ_i = λ_i / (exp(2κ/d) − 1)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from defenses.bounds import white_channel_sigmas
from defenses.channels._noise import additive_data_channel, check_kappa
from defenses.channels._guarantee import ChannelGuarantee
from defenses.channels._statistics import DataStatistics, resolve_statistics
from fedsim import random_draws
from fedsim.hooks import Defense, register_defense

__all__ = ["white_channel", "white_noise_variances"]


def white_noise_variances(statistics: DataStatistics, kappa: float) -> np.ndarray:
    """Ψ = diag(σ_i), σ_i = λ_i / (exp(2κ/d) − 1) in the eigenbasis Q of Σ_D (Eq. 19).

    Every eigen-direction carries κ/d nats, so f(Ψ) = κ exactly. d counts the
    positive eigenvalues (a zero-variance direction carries nothing and gets
    no noise; see :func:`defenses.bounds.white_channel_sigmas`).
    """
    kappa = check_kappa(kappa, "white_channel")
    return white_channel_sigmas(statistics.eigenvalues, kappa)


@register_defense("white_channel")
def white_channel(kappa: float, *, statistics: DataStatistics | None = None, data=None,
                  dataset: str | None = None, image_size: int | None = None,
                  max_examples: int | None = None, normalize: bool = False,
                  source: str = "auto", data_dir: str | None = None,
                  dataset_seed: int | None = None) -> Defense:
    """White channel: noise shaped like the data, every eigen-direction equally protected.

    Implements Tan et al. (000) §5.2 "White Channel", steps 1–4: Σ_D = Q Λ Qᵀ,
    σ_i = λ_i / (exp(2κ/d) − 1) (Eq. 19), Σ_ξ = Q Ψ Qᵀ, D̃ = D + ξ. Noise is
    sampled as ξ = Q √Ψ z, z ~ N(0, I_d) (one [B, d] × [d, d] product per step).

    Guarantee: I(D; D̃) ≤ f(Ψ) = ½ Σ ln((λ_i + σ_i)/σ_i) = κ per channel use
    (Thm 2 in the eigenbasis), n·κ over n local steps (Eq. 16, DPI).

    Deviation: directions with λ_i = 0 (singular Σ_D) get σ_i = 0 and d is
    the number of positive eigenvalues (the paper assumes full rank).

    Args:
      kappa: channel capacity threshold κ > 0, in nats.
      statistics / data / dataset / image_size / max_examples / normalize /
        source / data_dir / dataset_seed:
        the source of Σ_D, as for :func:`natural_channel`.

    Returns:
      A stage-"data" :class:`~fedsim.hooks.Defense` named "white_channel(kappa=κ)"
        (κ in the name, so a checkpoint can tell channels apart).

    Raises:
      ValueError: on kappa ≤ 0 or a missing/ambiguous data source.
    """
    kappa = check_kappa(kappa, "white_channel")
    stats = resolve_statistics(statistics=statistics, data=data, dataset=dataset,
                               image_size=image_size, max_examples=max_examples,
                               normalize=normalize, source=source,
                               data_dir=data_dir, dataset_seed=dataset_seed, who="white_channel")
    psi = white_noise_variances(stats, kappa)
    # Q √Ψ, transposed so that a row vector z maps to ξ = z (Q √Ψ)ᵀ.
    factor_t = jnp.asarray((stats.eigenvectors * np.sqrt(psi)[None, :]).T, jnp.float32)
    d = stats.dim

    def sample(key, b):
        z = random_draws.normal(key, (b, d), jnp.float32)
        return z @ factor_t

    return additive_data_channel(f"white_channel(kappa={kappa:g})", stats.shape, sample,
                                 guarantee=ChannelGuarantee(kappa, stats))
