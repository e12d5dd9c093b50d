"""Gaussian channel capacity and the Natural / White channels (paper 000).

Tan et al. (000) bound the information a noisy release leaks about the data
by the capacity of a Gaussian channel, f(sigma) = 1/2 sum ln((lambda_i +
sigma)/sigma) (Thm 2, Eq. 15/18), where lambda_i are the eigenvalues of the
data (or update) covariance and sigma is the noise *variance* (the noise is
sqrt(sigma) xi, xi ~ N(0, I)). Capacities are in nats.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from defenses.accounting._validation import check_positive, check_positive_int
from defenses.bounds._bisect import bisect_log_sigma

#: Eigenvalues of a covariance below this fraction of its largest are round-off
#: of a singular covariance (constant border pixels, fewer examples than
#: dimensions) and are taken as exactly 0.
EIGENVALUE_RTOL = 1e-10

__all__ = [
    "channel_capacity",
    "natural_channel_sigma",
    "white_channel_sigmas",
    "white_channel_covariance",
    "large_batch_channel_capacity",
    "total_leakage_bound",
]


def check_eigenvalue_vector(eigenvalues: ArrayLike) -> None:
    """Refuse a matrix where a vector of eigenvalues is due.

    A covariance matrix flattened would pass as d² "eigenvalues" (for
    [[2, 1], [1, 2]]: a channel capacity of 5.44 instead of 2.92).

    Raises:
      ValueError: when more than one axis is longer than 1.
    """
    shape = np.shape(eigenvalues)
    if sum(n > 1 for n in shape) > 1:
        raise ValueError(f"eigenvalues must be a vector; got an array of shape {shape} (a "
                         f"covariance matrix? pass np.linalg.eigvalsh(cov))")


def _eigenvalues(eigenvalues: ArrayLike) -> np.ndarray:
    check_eigenvalue_vector(eigenvalues)
    lam = np.asarray(eigenvalues, dtype=np.float64).ravel()
    if lam.size == 0 or not np.all(np.isfinite(lam)):
        raise ValueError("eigenvalues must be a non-empty array of finite numbers")
    # Tiny negative values come from eigendecompositions of PSD matrices.
    scale = max(float(np.max(np.abs(lam))), 1e-300)
    if np.any(lam < -1e-10 * scale):
        raise ValueError("eigenvalues must be >= 0 (a covariance is positive semi-definite)")
    return np.clip(lam, 0.0, None)


def _log_expm1(x: float) -> float:
    return x + math.log1p(-math.exp(-x)) if x > 1.0 else math.log(math.expm1(x))


def channel_capacity(eigenvalues: ArrayLike, sigma: ArrayLike) -> float:
    """f(sigma) = 1/2 sum_i ln((lambda_i + sigma_i) / sigma_i), in nats.

    Args:
      eigenvalues: eigenvalues lambda_i >= 0 of the covariance.
      sigma: noise variance, a scalar (Natural channel, sigma I) or one per
        eigen-direction (White channel, Q diag(sigma) Q^T); each > 0.

    Returns:
      The capacity bound f(sigma) >= 0.

    Raises:
      ValueError: on negative eigenvalues or non-positive sigma.

    References:
      Tan et al. (000) §5.1, Theorem 2, Eq. (15); §5.2 Eq. (18)-(19).
    """
    lam = _eigenvalues(eigenvalues)
    s = np.broadcast_to(np.asarray(sigma, dtype=np.float64), lam.shape)
    if not np.all(s > 0):
        raise ValueError(f"sigma must be in (0, inf), got {sigma!r}")
    return float(0.5 * np.sum(np.log1p(lam / s)))


def natural_channel_sigma(eigenvalues: ArrayLike, kappa: float, *, tol: float = 1e-9) -> float:
    """Noise variance sigma of the Natural channel: solves f(sigma) = kappa.

    f is strictly decreasing from +inf (sigma -> 0) to 0 (sigma -> inf), so
    bisection on log(sigma) finds the unique root; it stops when
    |f(sigma) - kappa| <= tol (absolute, nats) or the bracket is exhausted.

    Args:
      eigenvalues: covariance eigenvalues >= 0, at least one > 0.
      kappa: capacity threshold kappa > 0 (nats per round).
      tol: absolute tolerance on f(sigma) - kappa.

    Returns:
      sigma > 0 with f(sigma) = kappa (noise xi ~ N(0, sigma I)).

    Raises:
      ValueError: kappa <= 0, negative eigenvalues, or all eigenvalues 0.

    References:
      Tan et al. (000) §5.2 "Natural Channel", Eq. (18), binary search.
    """
    kappa = check_positive("kappa", kappa)
    lam = _eigenvalues(eigenvalues)
    lam = lam[lam > 0]
    if lam.size == 0:
        raise ValueError("eigenvalues must contain at least one positive value")

    log_lam = np.log(lam)

    def f(log_s: float) -> float:
        # ln(1 + λ/σ) = logaddexp(0, ln λ − ln σ): no overflow of λ/σ for large κ
        # (σ ~ λ_max e^{−2κ} at the lower bracket; exp(2κ) overflows past κ ≈ 355).
        return 0.5 * float(np.sum(np.logaddexp(0.0, log_lam - log_s)))

    # f(s) <= d/2 ln(1 + max/s) and >= 1/2 ln(1 + max/s): bracket from these.
    lmax, d = float(lam.max()), lam.size
    lo = math.log(lmax) - _log_expm1(2.0 * kappa)
    hi = math.log(lmax) - _log_expm1(2.0 * kappa / d)
    lo, hi = lo - 1.0, hi + 1.0
    return _positive_sigma(bisect_log_sigma(f, kappa, lo, hi, tol=tol), kappa, "natural_channel_sigma")


def _positive_sigma(sigma: float, kappa: float, who: str) -> float:
    """Raises if the solved σ underflowed float64 (κ far beyond any data's capacity)."""
    if not sigma > 0.0:
        raise ValueError(f"{who}: the noise variance for kappa={kappa} underflows float64 "
                         "(kappa is too large for this covariance)")
    return sigma


def white_channel_sigmas(eigenvalues: ArrayLike, kappa: float) -> np.ndarray:
    """Per-eigendirection noise variances of the White channel.

    sigma_i = lambda_i / (exp(2 kappa / d) - 1), so each direction carries
    kappa / d and f(sigma) = kappa exactly.

    Deviation: d counts the *positive* eigenvalues; a zero-variance direction
    carries no information, gets sigma_i = 0 and is left out of f. (The paper
    assumes a full-rank covariance; image data such as MNIST's constant
    border pixels is not.)

    Args:
      eigenvalues: covariance eigenvalues >= 0, at least one > 0.
      kappa: capacity threshold > 0 (nats).

    Returns:
      float64 array of sigma_i, same length as ``eigenvalues``.

    Raises:
      ValueError: kappa <= 0, negative eigenvalues, or all zero.

    References:
      Tan et al. (000) §5.2 "White Channel", Eq. (19).
    """
    kappa = check_positive("kappa", kappa)
    lam = _eigenvalues(eigenvalues)
    d = int(np.count_nonzero(lam > 0))
    if d == 0:
        raise ValueError("eigenvalues must contain at least one positive value")
    # In logs: expm1(2κ/d) overflows past 2κ/d ≈ 709.8 (an OverflowError, or
    # inf and then σ = 0: no noise at all).
    log_scale = _log_expm1(2.0 * kappa / d)
    with np.errstate(divide="ignore"):
        sigma = np.where(lam > 0, np.exp(np.log(lam) - log_scale), 0.0)
    _positive_sigma(float(np.min(sigma[lam > 0])), kappa, "white_channel_sigmas")
    return sigma


def white_channel_covariance(covariance: ArrayLike, kappa: float) -> np.ndarray:
    """Noise covariance Sigma_xi = Q Psi Q^T of the White channel.

    Args:
      covariance: data covariance Sigma_D (d x d, symmetric PSD).
      kappa: capacity threshold > 0 (nats).

    Returns:
      The d x d noise covariance.

    Raises:
      ValueError: if covariance is not square or kappa <= 0.

    References:
      Tan et al. (000) §5.2 "White Channel", steps 1-3.
    """
    cov = np.asarray(covariance, dtype=np.float64)
    if cov.ndim != 2 or cov.shape[0] != cov.shape[1]:
        raise ValueError(f"covariance must be a square matrix, got shape {cov.shape}")
    lam, q = np.linalg.eigh(0.5 * (cov + cov.T))
    # Round-off of a singular covariance is zero variance, as in
    # defenses.channels.data_statistics: counted in d, it would dilute κ/d.
    lam = np.where(lam > EIGENVALUE_RTOL * max(float(lam.max()), 1e-300), lam, 0.0)
    psi = white_channel_sigmas(lam, kappa)
    return (q * psi) @ q.T


def large_batch_channel_capacity(eigenvalues: ArrayLike, sigma: float, batch_size: int) -> float:
    """Capacity with a mini-batch of B i.i.d. examples: f_B (Eq. 22).

    f_B(sigma) = 1/2 sum_i ln((lambda_i / B + sigma) / sigma).

    Args:
      eigenvalues: per-example covariance eigenvalues >= 0.
      sigma: noise variance > 0.
      batch_size: B >= 1.

    Returns:
      f_B(sigma) in nats.

    Raises:
      ValueError: on out-of-range arguments.

    References:
      Tan et al. (000) §5.3 "Large Batch Size", Eq. (22).
    """
    b = check_positive_int("batch_size", batch_size)
    return channel_capacity(_eigenvalues(eigenvalues) / b, check_positive("sigma", sigma))


def total_leakage_bound(kappa: float, rounds: int) -> float:
    """Total leaked information over n rounds with per-round capacity kappa: n kappa.

    Args:
      kappa: per-round capacity bound > 0 (nats).
      rounds: number of optimisation rounds n >= 1.

    Returns:
      n * kappa.

    Raises:
      ValueError: on out-of-range arguments.

    References:
      Tan et al. (000) §1 and §4 (information accumulates at most kappa per round).
    """
    return check_positive_int("rounds", rounds) * check_positive("kappa", kappa)
