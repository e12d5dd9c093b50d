"""Reconstruction-error lower bound from mutual information (000, Thm 1)."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from defenses.accounting._validation import check_nonnegative, check_positive_int
from defenses.bounds._channel_capacity import check_eigenvalue_vector

__all__ = ["mse_lower_bound", "gaussian_entropy"]


def mse_lower_bound(entropy: float, mutual_information: float, dim: int) -> float:
    """Lower bound on per-coordinate reconstruction MSE.

    E[||D - D_hat(W)||^2 / d] >= exp(2 h(D)/d) / (2 pi e) * exp(-2 I(D;W)/d).

    Args:
      entropy: differential entropy h(D) in nats (may be negative).
      mutual_information: I(D; W) >= 0 in nats (e.g. n * kappa).
      dim: dimension d >= 1 of D.

    Returns:
      The bound (> 0).

    Raises:
      ValueError: if mutual_information < 0 or dim < 1.

    References:
      Tan et al. (000) §3, Theorem 1, Eq. (5); proof in App. B.1.
    """
    d = check_positive_int("dim", dim)
    mi = check_nonnegative("mutual_information", mutual_information)
    h = float(entropy)
    if not math.isfinite(h):
        raise ValueError(f"entropy must be a finite number, got {entropy!r}")
    return math.exp(2.0 * (h - mi) / d - math.log(2.0 * math.pi * math.e))


def gaussian_entropy(eigenvalues: ArrayLike) -> float:
    """h of a Gaussian with covariance eigenvalues lambda: 1/2 sum ln(2 pi e lambda_i).

    The Gaussian maximises entropy for a given covariance, so this is an upper
    bound on h(D) for any D with that covariance (Thm 1 then gives an upper
    estimate of the MSE floor; use a better h(D) estimate where available).

    Args:
      eigenvalues: covariance eigenvalues, each > 0.

    Returns:
      h in nats.

    Raises:
      ValueError: if an eigenvalue is <= 0, or a matrix is given.

    References:
      Cover & Thomas, Thm 8.4.1; used in 000 App. B.1 step (1).
    """
    check_eigenvalue_vector(eigenvalues)
    lam = np.asarray(eigenvalues, dtype=np.float64).ravel()
    if lam.size == 0 or not np.all(lam > 0):
        raise ValueError("eigenvalues must be non-empty and > 0")
    return float(0.5 * np.sum(np.log(2.0 * np.pi * np.e * lam)))
