"""Personalized channel of Tan et al. (000): noise sigma diag(beta), Thm 3.

The capacity of D + N(0, sigma diag(beta)) is
  f(sigma) = 1/2 [ln det(Sigma_D + sigma diag(beta)) - sum_i ln(sigma beta_i)].
Thm 3 bounds the log-determinant with terms computed once from Sigma_D:
  ln det(Sigma + diag(b)) <= min[ sum ln(c_ii + b_i), sum ln(u_i + k_i) ],
u_i = c_ii - rho_i^T Sigma_{i-1}^{-1} rho_i (the Schur complements, i.e. the
conditional variances), k_i = b_i + w_i^T diag(b_{<i}) w_i with
w_i = Sigma_{i-1}^{-1} rho_i (regression of coordinate i on the previous ones).

Deviation: Eq. (20) and U(sigma) are printed as a *ratio*
ln det[...] / (2 sum ln(sigma beta_i)); the proof of Thm 2 (Eq. 24) gives a
*difference* of the two log-determinants, halved, which is what is
implemented (for diagonal Sigma_D it reduces exactly to Eq. 18).

u and w come from one Cholesky factorisation: with Sigma = L D L^T (L unit
lower triangular), M = L^{-1} has rows (-w_i, 1), so u = diag(D) and
k = (M * M) @ beta — O(d^3) instead of d separate solves.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike
from scipy import linalg

from defenses.accounting._validation import check_positive
from defenses.bounds._bisect import bisect_log_sigma
from defenses.bounds._channel_capacity import _positive_sigma

__all__ = [
    "PersonalizedTerms",
    "personalized_channel_terms",
    "personalized_channel_bound",
    "personalized_channel_log_bound",
    "personalized_channel_sigma",
]


class PersonalizedTerms(NamedTuple):
    """Pre-computed terms of Thm 3 (000): c_ii, u_i, k_i and beta."""

    diag: np.ndarray
    u: np.ndarray
    k: np.ndarray
    beta: np.ndarray


def _beta(beta: ArrayLike, d: int) -> np.ndarray:
    b = np.asarray(beta, dtype=np.float64).ravel()
    if b.size != d:
        raise ValueError(f"beta must have {d} entries (one per data dimension), got {b.size}")
    if not (np.all(np.isfinite(b)) and np.all(b > 0)):
        raise ValueError("beta must be finite and > 0 in every entry")
    return b


def personalized_channel_terms(
    eigenvalues_or_cov: ArrayLike, beta: ArrayLike, *, jitter: float = 0.0
) -> PersonalizedTerms:
    """Computes c_ii, u_i, k_i of Thm 3 for a covariance and a prior beta.

    Args:
      eigenvalues_or_cov: the data covariance Sigma_D (d x d, symmetric,
        positive definite), or a length-d vector taken as a *diagonal*
        covariance (per-coordinate variances; then the bound is exact).
      beta: relative noise weights beta_i > 0, d entries (any shape, raveled
        in the covariance's coordinate order, e.g. a 32 x 32 image prior).
      jitter: added to the diagonal before factorising (for singular data
        covariances, e.g. constant pixels).

    Returns:
      :class:`PersonalizedTerms`.

    Raises:
      ValueError: on shape mismatches, beta <= 0, or a covariance that is not
        positive definite (the message suggests ``jitter``).

    References:
      Tan et al. (000) §5.2 "Personalized Channel", Theorem 3, App. B.4.
    """
    arr = np.asarray(eigenvalues_or_cov, dtype=np.float64)
    if arr.ndim == 1:
        var = arr + jitter
        if not (np.all(np.isfinite(var)) and np.all(var > 0)):
            raise ValueError("eigenvalues_or_cov: diagonal variances must be > 0 (use jitter)")
        b = _beta(beta, var.size)
        return PersonalizedTerms(var, var.copy(), b.copy(), b)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise ValueError(f"eigenvalues_or_cov must be a vector or a square matrix, got shape {arr.shape}")
    d = arr.shape[0]
    b = _beta(beta, d)
    cov = 0.5 * (arr + arr.T) + jitter * np.eye(d)
    try:
        chol = linalg.cholesky(cov, lower=True)
    except linalg.LinAlgError:
        raise ValueError(
            "eigenvalues_or_cov must be positive definite; pass jitter > 0 for a singular covariance"
        ) from None
    dvec = np.diag(chol)
    unit_lower = chol / dvec[None, :]
    m = linalg.solve_triangular(unit_lower, np.eye(d), lower=True, unit_diagonal=True)
    return PersonalizedTerms(np.diag(cov).copy(), dvec**2, (m * m) @ b, b)


def personalized_channel_bound(sigma: float, terms: PersonalizedTerms) -> float:
    """U(sigma): Thm 3 upper bound on the Personalized channel's capacity (nats).

    U(sigma) = 1/2 ( min[ sum ln(c_ii + sigma beta_i), sum ln(u_i + sigma k_i) ]
                     - sum ln(sigma beta_i) ).

    Args:
      sigma: noise scale > 0 (noise N(0, sigma diag(beta))).
      terms: output of :func:`personalized_channel_terms`.

    Returns:
      U(sigma) >= 0.

    Raises:
      ValueError: if sigma <= 0.

    References:
      Tan et al. (000) §5.2, U(sigma) after Theorem 3 (see module deviation).
    """
    return personalized_channel_log_bound(math.log(check_positive("sigma", sigma)), terms)


def personalized_channel_log_bound(log_sigma: float, terms: PersonalizedTerms) -> float:
    """U as a function of t = ln σ, evaluated in log space.

    ln(c_ii + σβ_i) − ln(σβ_i) = logaddexp(0, ln(c_ii/β_i) − t) and
    ln(u_i + σk_i) − ln(σβ_i) = logaddexp(ln u_i − t, ln k_i) − ln β_i, so
    neither σ nor 1/σ is formed: finite for any t (κ up to thousands of nats).

    Args:
      log_sigma: t = ln σ (any real).
      terms: output of :func:`personalized_channel_terms`.

    Returns:
      U(e^t) >= 0.
    """
    t = float(log_sigma)
    log_b = np.log(terms.beta)
    a = np.sum(np.logaddexp(0.0, np.log(terms.diag) - log_b - t))
    c = np.sum(np.logaddexp(np.log(terms.u) - t, np.log(terms.k)) - log_b)
    return float(0.5 * min(a, c))


def personalized_channel_sigma(
    eigenvalues_or_cov: ArrayLike, beta: ArrayLike, kappa: float, *, tol: float = 1e-9,
    jitter: float = 0.0,
) -> float:
    """Noise scale sigma of the Personalized channel: solves U(sigma) = kappa.

    U is strictly decreasing in sigma (+inf at 0, 0 at inf); bisection on
    log(sigma) to an absolute tolerance ``tol`` on U - kappa.

    Args:
      eigenvalues_or_cov: data covariance or per-coordinate variances (see
        :func:`personalized_channel_terms`).
      beta: noise weights beta_i > 0 (d entries).
      kappa: capacity threshold > 0 (nats).
      tol: absolute tolerance on U(sigma) - kappa.
      jitter: see :func:`personalized_channel_terms`.

    Returns:
      sigma > 0; the noise to add is N(0, sigma diag(beta)).

    Raises:
      ValueError: kappa <= 0 or invalid covariance / beta.

    References:
      Tan et al. (000) §5.2 "Personalized Channel", steps 1-4.
    """
    kappa = check_positive("kappa", kappa)
    terms = personalized_channel_terms(eigenvalues_or_cov, beta, jitter=jitter)

    def u_of(log_s: float) -> float:
        return personalized_channel_log_bound(log_s, terms)

    # Each of the d terms of U is at most ½ ln(1 + r_max/σ), r_max = max(c_ii/β_i,
    # u_i/k_i), so σ* ≤ r_max/(e^{2κ/d} − 1): bracket from there and step down.
    ratio = np.concatenate([terms.diag / terms.beta, terms.u / terms.k])
    d = terms.beta.size
    hi = math.log(float(ratio.max())) - _log_expm1(2.0 * kappa / d) + 1.0
    lo = hi - 1.0
    while u_of(lo) < kappa:
        lo -= 1.0
        if lo < -745.0:  # below the smallest positive float64
            raise ValueError(f"personalized_channel_sigma: the noise scale for kappa={kappa} "
                             "underflows float64 (kappa too large for this covariance)")
    # A κ near the float64 limit puts the bracket itself below the smallest float
    # (the loop above never runs): the solved σ is then 0, no noise at all.
    return _positive_sigma(bisect_log_sigma(u_of, kappa, lo, hi, tol=tol), kappa,
                           "personalized_channel_sigma")


def _log_expm1(x: float) -> float:
    return x + math.log1p(-math.exp(-x)) if x > 1.0 else math.log(math.expm1(x))
