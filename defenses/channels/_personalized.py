"""Personalized channel (Tan et al. 000, §5.2): Σ_ξ = σ diag(β), U(σ) = κ (Thm 3)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from defenses.bounds import personalized_channel_sigma
from defenses.channels._noise import additive_data_channel, check_kappa
from defenses.channels._guarantee import ChannelGuarantee
from defenses.channels._statistics import DataStatistics, resolve_statistics
from fedsim import random_draws
from fedsim.hooks import Defense, register_defense

__all__ = ["personalized_channel", "paper_prior_beta", "personalized_noise_scale",
           "personalized_exact_capacity"]


def paper_prior_beta(shape: tuple[int, ...]) -> np.ndarray:
    """The prior of 000 App. C (Fig. 17): 50 on rows 12–19 × cols 8–23, 1 elsewhere.

    Same for every image channel ("position-based prior"). Rows/columns are
    0-based and inclusive (8 rows × 16 columns around the eyes of a 32×32
    CelebA face).

    Args:
      shape: one example's shape (32, 32, C).

    Raises:
      ValueError: for any other image size (the paper's mask is 32×32; pass
        an explicit ``beta`` for other sizes).
    """
    if len(shape) != 3 or tuple(shape[:2]) != (32, 32):
        raise ValueError(f"the paper's default prior beta is for 32x32xC images, got example "
                         f"shape {tuple(shape)}; pass beta= explicitly")
    beta = np.ones(shape, np.float64)
    beta[12:20, 8:24, :] = 50.0
    return beta


def _jitter_for(stats: DataStatistics) -> float:
    # Thm 3's terms need a Cholesky factor; a singular Σ_D (constant pixels)
    # gets a tiny ridge. Adding variance can only raise the bound U, so the σ
    # solved with the ridge still satisfies I(D; D̃) ≤ κ.
    if stats.eigenvalues[-1] > 1e-9 * stats.eigenvalues[0]:
        return 0.0
    return 1e-6 * float(np.mean(np.diag(stats.covariance)))


def personalized_noise_scale(statistics: DataStatistics, kappa: float, beta, *,
                             tol: float = 1e-9) -> float:
    """σ solving U(σ) = κ, U the Thm 3 upper bound of the capacity of D + N(0, σ diag β).

    Delegates to :func:`defenses.bounds.personalized_channel_sigma` (log-space
    evaluation and bracketing, robust to κ in the thousands) with the ridge of
    ``_jitter_for`` for a singular Σ_D.
    """
    kappa = check_kappa(kappa, "personalized_channel")
    return personalized_channel_sigma(statistics.covariance, np.asarray(beta).ravel(), kappa,
                                      tol=tol, jitter=_jitter_for(statistics))


def personalized_exact_capacity(statistics: DataStatistics, sigma: float, beta) -> float:
    """f(σ) = ½ [ln det(Σ_D + σ diag β) − Σ ln(σ β_i)], computed directly (for checks)."""
    b = np.asarray(beta, np.float64).ravel()
    _, logdet = np.linalg.slogdet(statistics.covariance + np.diag(sigma * b))
    return float(0.5 * (logdet - np.sum(np.log(sigma * b))))


@register_defense("personalized_channel")
def personalized_channel(kappa: float, *, beta=None, statistics: DataStatistics | None = None,
                         data=None, dataset: str | None = None, image_size: int | None = None,
                         max_examples: int | None = None, normalize: bool = False,
                         source: str = "auto", data_dir: str | None = None,
                         dataset_seed: int | None = None) -> Defense:
    """Personalized channel: more noise where the prior β says the data is sensitive.

    Implements Tan et al. (000) §5.2 "Personalized Channel", steps 1–4: the
    Thm 3 terms u_i, k_i from Σ_D, σ from U(σ) = κ by bisection, Σ_ξ =
    σ diag(β), D̃ = D + ξ (see :func:`personalized_noise_scale`).

    Guarantee: I(D; D̃) ≤ f(σ) ≤ U(σ) = κ per channel use; n·κ over n steps.

    Deviation: U(σ) is the *difference* ½[min(...) − Σ ln σβ_i] (from the
    proof of Thm 2), not the ratio printed in Eq. 20 (see
    :mod:`defenses.bounds._personalized`); a singular Σ_D gets a 1e-6·mean-
    variance ridge (conservative).

    Args:
      kappa: channel capacity threshold κ > 0, in nats.
      beta: noise weights β_i > 0 of the example's shape (or flat, d entries);
        default: :func:`paper_prior_beta` (32×32 images only).
      statistics / data / dataset / image_size / max_examples / normalize /
        source / data_dir / dataset_seed:
        the source of Σ_D, as for :func:`natural_channel`.

    Returns:
      A stage-"data" :class:`~fedsim.hooks.Defense` named "personalized_channel(kappa=κ)"
        (κ in the name, so a checkpoint can tell channels apart).

    Raises:
      ValueError: kappa ≤ 0, bad beta (size, sign), missing/ambiguous data.
    """
    kappa = check_kappa(kappa, "personalized_channel")
    stats = resolve_statistics(statistics=statistics, data=data, dataset=dataset,
                               image_size=image_size, max_examples=max_examples,
                               normalize=normalize, source=source,
                               data_dir=data_dir, dataset_seed=dataset_seed, who="personalized_channel")
    beta = paper_prior_beta(stats.shape) if beta is None else np.asarray(beta, np.float64)
    if beta.size != stats.dim:
        raise ValueError(f"personalized_channel: beta has {beta.size} entries, the data "
                         f"{stats.shape} has d = {stats.dim}")
    if beta.ndim > 1 and beta.shape != tuple(stats.shape):
        # Right size, other layout (e.g. channels-first): flattened, its weights
        # would land on other pixels than meant.
        raise ValueError(f"personalized_channel: beta has shape {beta.shape}; give it the "
                         f"example's shape {tuple(stats.shape)} or flat ({stats.dim},)")
    if not (np.all(np.isfinite(beta)) and np.all(beta > 0)):
        raise ValueError("personalized_channel: beta must be finite and > 0 everywhere")
    sigma = personalized_noise_scale(stats, kappa, beta)
    std = jnp.asarray(np.sqrt(sigma * beta.ravel()), jnp.float32)
    d = stats.dim

    def sample(key, b):
        return random_draws.normal(key, (b, d), jnp.float32) * std

    return additive_data_channel(f"personalized_channel(kappa={kappa:g})", stats.shape, sample,
                                 guarantee=ChannelGuarantee(kappa, stats))
