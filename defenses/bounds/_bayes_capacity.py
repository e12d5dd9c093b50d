"""Bayes capacity of the Gaussian and VMF noise channels (001 §V, Thm 5-6).

Both are returned as natural logarithms: for p = 13,700 the capacities are
far outside float64 (e.g. Gamma(p/2) alone is ~10^{26,000}).
"""

from __future__ import annotations

import numpy as np
from scipy import special

from defenses.accounting._bessel import log_bessel_ive
from defenses.accounting._validation import check_dim, check_nonnegative, check_positive

__all__ = ["log_bayes_capacity_gaussian", "log_bayes_capacity_vmf"]

_LOG2 = np.log(2.0)

#: The Gaussian capacity sums p terms (one array of p floats): beyond this it
#: would ask for more memory than a machine has, or numpy's size limit.
MAX_GAUSSIAN_DIM = 10**8


def _checked_sum(terms: list[float], who: str) -> float:
    """``sum(terms)``, or a ValueError where float64 cannot hold it to 1e-3
    (relative, or absolute below 1 nat).

    At an absurd κ or p the terms reach 1e150 and cancel: the sum was
    rounding noise (the VMF capacity came out 0 at κ = p = 1e200, with only a
    RuntimeWarning), so its rounding error is bounded and checked instead.
    """
    val = float(sum(terms))
    scale = max(abs(t) for t in terms)
    if not np.isfinite(val) or 8 * np.finfo(np.float64).eps * scale > 1e-3 * max(1.0, abs(val)):
        raise ValueError(f"{who}: the capacity's log-terms reach {scale:.3g} and cancel beyond "
                         "float64's precision at these settings; use a smaller kappa or dim")
    return val


def log_bayes_capacity_gaussian(sigma: float, radius: float, dim: int) -> float:
    """log C_Bayes of y = x + N(0, sigma^2 I_p) with inputs x in the ball B_R^p.

    C = R^p / (Gamma(p/2 + 1) 2^{p/2} sigma^p)
        + 2 / (Gamma(p/2) 2^{p/2} sigma^p) * Z,
    Z = 1/2 sum_{i=0}^{p-1} C(p-1, i) Gamma((p-i)/2) (sqrt(2) sigma)^{p-i} R^i,
    summed with logsumexp.

    Deviation: Thm 5 as printed has C(p-i, i) and no 1/2 in Z; its own proof
    (App. B-F) expands (s + R)^{p-1}, giving C(p-1, i), and the Gaussian
    moment identity carries the 1/2. With these, C = 1 at R = 0 (no leakage
    when every input is the same point), as a capacity must, and the value
    matches radial quadrature of Def. 7 (tests). ``radius`` is the clipping
    radius R (the paper's "R layers each clipped to 1" is one choice of it).

    Args:
      sigma: noise standard deviation per coordinate, > 0.
      radius: clipping radius R >= 0.
      dim: dimension p >= 2 (p = 1 also works but is rejected for
        consistency with the VMF channel).

    Returns:
      log C_Bayes (natural log), >= 0.

    Raises:
      ValueError: sigma <= 0, radius < 0, dim < 2.

    References:
      Biswas et al. (001) §V-B, Theorem 5; App. B-F; Definition 7.
    """
    sigma = check_positive("sigma", sigma)
    radius = check_nonnegative("radius", radius)
    p = check_dim("dim", dim)
    if p > MAX_GAUSSIAN_DIM:
        raise ValueError(f"dim must be at most {MAX_GAUSSIAN_DIM:.0e} for the Gaussian capacity "
                         f"(it sums p terms), got {p:.3g}")
    if radius == 0.0:
        return 0.0
    log_r, log_s = np.log(radius), np.log(sigma)
    common = -0.5 * p * _LOG2 - p * log_s
    ball = p * log_r - special.gammaln(p / 2.0 + 1.0) + common
    i = np.arange(p, dtype=np.float64)
    log_binom = special.gammaln(p) - special.gammaln(i + 1.0) - special.gammaln(p - i)
    shell = (
        common
        - special.gammaln(p / 2.0)
        + log_binom
        + special.gammaln((p - i) / 2.0)
        + (p - i) * (0.5 * _LOG2 + log_s)
        + i * log_r
    )  # the factor 2 and the 1/2 cancel
    return float(special.logsumexp(np.concatenate([[ball], shell])))


def log_bayes_capacity_vmf(kappa: float, dim: int) -> float:
    """log C_Bayes of the VMF mechanism on S^{p-1}.

    C = 2 / Gamma(p/2) * kappa^{p/2-1} e^kappa / (2^{p/2} I_{p/2-1}(kappa)),
    evaluated as a sum of logs, with e^kappa / I(kappa) as the scaled
    log-Bessel ``log I − kappa`` (:func:`log_bessel_ive`): subtracting
    ``log I`` from ``kappa`` after the fact lost every digit at large kappa
    (0.0 at kappa = 1e20, p = 10, against 202.2).

    Args:
      kappa: concentration >= 0 (kappa = 0 gives log C = 0).
      dim: dimension p >= 2.

    Returns:
      log C_Bayes (natural log), >= 0.

    Raises:
      ValueError: kappa < 0 or dim < 2.

    References:
      Biswas et al. (001) §V-C, Theorem 6; App. B-G.
    """
    kappa = check_nonnegative("kappa", kappa)
    p = check_dim("dim", dim)
    if kappa == 0.0:
        return 0.0
    nu = p / 2.0 - 1.0
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is named below
        terms = [float(_LOG2), -float(special.gammaln(p / 2.0)), float(nu * np.log(kappa)),
                 -float(0.5 * p * _LOG2), -float(log_bessel_ive(nu, kappa))]
    val = _checked_sum(terms, "log_bayes_capacity_vmf")
    # Rounding can put the kappa -> 0 limit a hair below 0.
    return float(max(val, 0.0))
