"""PriPrune's mutual-information bound for pruned FL (002, Thm 1 / Cor 1)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
from numpy.typing import ArrayLike

from defenses.accounting._validation import check_positive_int

__all__ = ["priprune_leakage_bound"]

_LOG2_2PIE = math.log2(2.0 * math.pi * math.e)


def priprune_leakage_bound(
    pruning_rate: float,
    batch_size: int,
    covariance: Optional[ArrayLike] = None,
    *,
    logdet: Optional[float] = None,
    dim: Optional[int] = None,
    rounds: int = 1,
) -> float:
    """Upper bound on the information (bits) a pruned client's updates leak.

    I <= T ( 1 - (p - 1) / (2 ln 2) + 2 log2(1/B) + 2 Delta + d* log2(2 pi e) ),
    Delta = log2 |det Sigma^{-1/2}| = -1/2 log2 det Sigma,
    where Sigma is the (non-singular) covariance of the d*-dimensional largest
    sub-vector of a per-example gradient. T = 1 is Thm 1, T > 1 Cor 1.

    Logs are base 2 (the 2 ln 2 denominator marks the bound as in bits).

    Args:
      pruning_rate: base pruning rate p in [0, 1].
      batch_size: B >= 1.
      covariance: Sigma (d* x d*, positive definite). Alternatively give
        ``logdet`` (natural log of det Sigma) and ``dim`` (d*).
      logdet: ln det Sigma, used when ``covariance`` is None.
      dim: d*, required with ``logdet``.
      rounds: T >= 1 global rounds.

    Returns:
      The bound in bits.

    Raises:
      ValueError: p outside [0, 1], B or T < 1, a covariance that is not
        square positive definite, or neither covariance nor (logdet, dim).

    References:
      Chu et al., PriPrune (002), Theorem 1 (Eq. 4) and Corollary 1 (Eq. 5).
    """
    p = float(pruning_rate)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"pruning_rate must be in [0, 1], got {pruning_rate!r}")
    b = check_positive_int("batch_size", batch_size)
    t = check_positive_int("rounds", rounds)
    if covariance is not None:
        cov = np.asarray(covariance, dtype=np.float64)
        if cov.ndim != 2 or cov.shape[0] != cov.shape[1]:
            raise ValueError(f"covariance must be a square matrix, got shape {cov.shape}")
        if not np.all(np.isfinite(cov)):
            raise ValueError("covariance contains NaN or Inf values")
        if not np.allclose(cov, cov.T, rtol=1e-8, atol=1e-12 * max(np.abs(cov).max(), 1e-300)):
            raise ValueError("covariance must be symmetric")
        # A positive determinant alone lets diag(-1, -1) through: check the spectrum.
        if np.linalg.eigvalsh(cov).min() <= 0:
            raise ValueError("covariance must be positive definite (non-singular)")
        sign, ln_det = np.linalg.slogdet(cov)
        d_star = cov.shape[0]
    elif logdet is not None and dim is not None:
        ln_det, d_star = float(logdet), check_positive_int("dim", dim)
        if not math.isfinite(ln_det):
            raise ValueError(f"logdet must be finite, got {logdet!r}")
    else:
        raise ValueError("give covariance, or both logdet and dim")
    delta_term = -0.5 * float(ln_det) / math.log(2.0)
    single = 1.0 - (p - 1.0) / (2.0 * math.log(2.0)) + 2.0 * math.log2(1.0 / b) + 2.0 * delta_term \
        + d_star * _LOG2_2PIE
    return t * single
