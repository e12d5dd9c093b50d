"""Privacy amplification by Poisson subsampling, in (eps, delta) and in RDP.

* (eps, delta): eps_s = log(1 + gamma (e^eps - 1)), delta_s = gamma delta
  (001 Eq. 9, from Balle et al. 2018, Thm 8) — used by approach 1.
* RDP: the general upper bound of Zhu & Wang (2019) for integer orders
  (001 Thm 3), the KL case tau_1^s <= gamma tau_1, and the interpolation to
  non-integer orders — used by approach 2.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from defenses.accounting._validation import check_nonnegative, check_rate

__all__ = [
    "subsample_dp",
    "poisson_subsampled_rdp",
    "subsampled_kl_bound",
    "interpolate_rdp",
]


def subsample_dp(epsilon: float, delta: float, sample_rate: float) -> tuple[float, float]:
    """(eps, delta) amplification by Poisson subsampling.

    Args:
      epsilon: epsilon >= 0 of the mechanism on the sampled batch.
      delta: delta in [0, 1].
      sample_rate: gamma in (0, 1].

    Returns:
      ``(eps_s, delta_s) = (log(1 + gamma (e^eps - 1)), gamma delta)``.

    Raises:
      ValueError: on out-of-range arguments.

    References:
      Biswas et al. (001) §III-A, Eq. (9); Balle, Barthe, Gaboardi (2018), Thm 8.
    """
    epsilon = check_nonnegative("epsilon", epsilon)
    delta = float(delta)
    if not 0 <= delta <= 1:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    gamma = check_rate("sample_rate", sample_rate)
    # log1p(gamma * expm1(eps)) stays accurate for eps and gamma both tiny.
    if epsilon > 700:
        eps_s = epsilon + np.log(gamma) + np.log1p((1 - gamma) * np.exp(-epsilon) / gamma)
    else:
        eps_s = np.log1p(gamma * np.expm1(epsilon))
    return float(eps_s), gamma * delta


def poisson_subsampled_rdp(rdp_int: ArrayLike, sample_rate: float) -> np.ndarray:
    """Zhu & Wang's upper bound on the RDP of a Poisson-subsampled mechanism.

    For integer alpha >= 2:
      tau_alpha^s <= 1/(alpha-1) log{ (1-g)^{alpha-1} (alpha g - g + 1)
                     + C(alpha,2) g^2 (1-g)^{alpha-2} e^{tau_2}
                     + 3 sum_{l=3}^{alpha} C(alpha,l) (1-g)^{alpha-l} g^l e^{(l-1) tau_l} }.

    Deviation: 001 prints the prefactor as 1/alpha; Zhu & Wang (2019, Thm 6)
    have 1/(alpha-1), which is what an RDP value must be normalised by, and
    with it Table I's approach-2 values (2.48 / 4.59 / 10.9) are reproduced.

    Args:
      rdp_int: tau_alpha of the base mechanism at alpha = 2, 3, ..., A
        (element k is alpha = k + 2).
      sample_rate: gamma in (0, 1].

    Returns:
      float64 array of tau_alpha^s at the same orders 2..A.

    Raises:
      ValueError: on out-of-range arguments.

    References:
      Biswas et al. (001) §III-A, Theorem 3; Zhu & Wang, "Poisson subsampled
      Rényi differential privacy", ICML 2019, Thm 6 (general upper bound;
      001 cites it as its ref [24], Thm 5: the numbering of another version).
    """
    gamma = check_rate("sample_rate", sample_rate)
    tau = np.asarray(rdp_int, dtype=np.float64)
    if tau.ndim != 1 or tau.size == 0:
        raise ValueError("rdp_int must be a non-empty 1-d array (orders 2, 3, ...)")
    if gamma == 1.0:
        return tau.copy()
    log_g, log_1g = np.log(gamma), np.log1p(-gamma)
    max_alpha = tau.size + 1
    ells = np.arange(2, max_alpha + 1, dtype=np.float64)
    # Precompute (l-1) tau_l + l log g per l; binomials per alpha below.
    base_terms = (ells - 1.0) * tau + ells * log_g
    out = np.empty_like(tau)
    for k, alpha in enumerate(range(2, max_alpha + 1)):
        a = float(alpha)
        head = (a - 1.0) * log_1g + np.log1p((a - 1.0) * gamma)
        ls = ells[: alpha - 1]
        log_binom = special.gammaln(a + 1) - special.gammaln(ls + 1) - special.gammaln(a - ls + 1)
        terms = log_binom + (a - ls) * log_1g + base_terms[: alpha - 1]
        # l = 2 has coefficient 1, l >= 3 coefficient 3.
        terms[1:] += np.log(3.0)
        total = special.logsumexp(np.concatenate([[head], terms]))
        out[k] = total / (a - 1.0)
    return out


def subsampled_kl_bound(kl: float, sample_rate: float) -> float:
    """KL (alpha = 1) case of subsampling: tau_1^s <= gamma tau_1.

    Args:
      kl: KL divergence bound tau_1 >= 0 of the base mechanism.
      sample_rate: gamma in (0, 1].

    Returns:
      gamma * tau_1.

    Raises:
      ValueError: on out-of-range arguments.

    References:
      Biswas et al. (001) §III-A, remark after Theorem 3 (joint convexity of KL).
    """
    return check_rate("sample_rate", sample_rate) * check_nonnegative("kl", kl)


def interpolate_rdp(
    rdp_int: ArrayLike, orders: ArrayLike, *, method: str = "holder", kl: float = 0.0
) -> np.ndarray:
    """RDP at non-integer orders from its values at integer orders.

    ``method="holder"`` (default) interpolates the cumulant
    K(alpha) = (alpha - 1) tau_alpha linearly between floor and ceil, which is
    a valid upper bound because K is convex in alpha (Hölder's inequality):
      tau_alpha <= [(1-t)(a-1) tau_a + t a tau_{a+1}] / (alpha - 1),
    with a = floor(alpha), t = alpha - a; for 1 < alpha < 2 it uses K(1) = 0
    (``kl`` only matters in the limit and is kept for completeness).

    ``method="paper"`` is the formula printed in 001 §III-A,
    tau_alpha <= (1-t) tau_a + t tau_{a+1}. Deviation: that weights the
    smaller tau_a more than the Hölder bound does, so it can undershoot the
    Hölder bound; it is offered only to reproduce the paper.

    Args:
      rdp_int: tau at alpha = 2, 3, ..., A (element k is alpha = k + 2).
      orders: orders in (1, A] to evaluate at.
      method: ``"holder"`` or ``"paper"``.
      kl: tau_1, used by ``"paper"`` for 1 < alpha < 2.

    Returns:
      float64 array of interpolated tau, same shape as ``orders``.

    Raises:
      ValueError: on an unknown method or an order outside (1, A].

    References:
      Biswas et al. (001) §III-A (interpolation, citing Wang, Balle,
      Kasiviswanathan 2019, Cor 10).
    """
    if method not in ("holder", "paper"):
        raise ValueError(f"method must be one of ['holder', 'paper'], got {method!r}")
    tau = np.concatenate([[kl], np.asarray(rdp_int, dtype=np.float64)])  # index 0 = alpha 1
    alphas = np.asarray(orders, dtype=np.float64)
    max_alpha = tau.size
    if not (np.all(alphas > 1) and np.all(alphas <= max_alpha)):
        raise ValueError(f"orders must be in (1, {max_alpha}], got {orders!r}")
    a = np.floor(alphas)
    t = alphas - a
    lo = tau[a.astype(int) - 1]
    hi = tau[np.minimum(a.astype(int), max_alpha - 1)]
    if method == "paper":
        return (1 - t) * lo + t * hi
    k_lo = (a - 1.0) * lo
    k_hi = a * hi
    out = ((1 - t) * k_lo + t * k_hi) / (alphas - 1.0)
    return np.where(t == 0, lo, out)
