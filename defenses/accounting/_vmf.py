"""Rényi DP of the von Mises-Fisher (VMF) mechanism.

Implements Biswas et al. (001) §III-A: Prop 1 (one VMF on S^{p-1}), the KL
bound used for alpha -> 1, and Prop 2 (independent multi-variate VMF). All
Bessel functions are evaluated in log space (:mod:`._bessel`), so p = 13,700
and alpha in the thousands are fine.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.typing import ArrayLike

from defenses.accounting._bessel import bessel_iv_ratio, log_bessel_iv
from defenses.accounting._validation import check_dim, check_nonnegative

__all__ = ["vmf_rdp", "vmf_kl_bound", "multivariate_vmf_rdp"]


def _check_orders(orders: ArrayLike) -> np.ndarray:
    alphas = np.asarray(orders, dtype=np.float64)
    if alphas.size == 0 or not (np.all(np.isfinite(alphas)) and np.all(alphas > 1)):
        raise ValueError(f"orders must be finite and in (1, inf), got {orders!r}")
    return alphas


def vmf_rdp(kappa: float, dim: int, orders: ArrayLike) -> np.ndarray:
    """RDP curve tau_alpha of the VMF mechanism on the sphere S^{dim-1}.

    tau_alpha = nu/(alpha-1) * log(1/(2 alpha - 1))
                + 1/(alpha-1) * log(I_nu((2 alpha - 1) kappa) / I_nu(kappa)),
    with nu = dim/2 - 1 (antipodal centres, the worst case).

    Args:
      kappa: concentration, ``kappa >= 0``.
      dim: dimension p of the ambient space (the sphere is S^{p-1}), ``p >= 2``.
      orders: Rényi orders alpha, each in (1, inf).

    Returns:
      float64 array of tau_alpha, same shape as ``orders``.

    Raises:
      ValueError: if kappa < 0, dim < 2 or an order is not in (1, inf).

    References:
      Biswas et al. (001), §III-A, Proposition 1.
    """
    kappa = check_nonnegative("kappa", kappa)
    dim = check_dim("dim", dim)
    alphas = _check_orders(orders)
    if kappa == 0.0:
        return np.zeros_like(alphas)
    nu = dim / 2.0 - 1.0
    m = 2.0 * alphas - 1.0
    log_ratio = log_bessel_iv(nu, m * kappa) - log_bessel_iv(nu, kappa)
    return (-nu * np.log(m) + log_ratio) / (alphas - 1.0)


def vmf_kl_bound(kappa: float, dim: int) -> float:
    """Upper bound on the KL divergence (the alpha -> 1 RDP) of the VMF mechanism.

    tau_1 <= 2 kappa I_{nu+1}(kappa) / I_nu(kappa), nu = dim/2 - 1.

    Args:
      kappa: concentration, ``kappa >= 0``.
      dim: ambient dimension p >= 2.

    Returns:
      The bound as a float.

    Raises:
      ValueError: if kappa < 0 or dim < 2.

    References:
      Biswas et al. (001), §III-A, remark after Proposition 1.
    """
    kappa = check_nonnegative("kappa", kappa)
    dim = check_dim("dim", dim)
    if kappa == 0.0:
        return 0.0
    return float(2.0 * kappa * bessel_iv_ratio(dim / 2.0 - 1.0, kappa))


def multivariate_vmf_rdp(
    kappas: Sequence[float], dims: Sequence[int], orders: ArrayLike
) -> np.ndarray:
    """RDP of R independent VMF mechanisms (one per block of the gradient).

    tau_alpha = sum_i tau_alpha(kappa_i, p_i), i.e. Eq. (7): the Rényi
    divergence of a product distribution is the sum of the blocks'.

    Args:
      kappas: concentration of each block, each >= 0.
      dims: dimension of each block, each >= 2 (same length as ``kappas``).
      orders: Rényi orders, each in (1, inf).

    Returns:
      float64 array of tau_alpha, same shape as ``orders``.

    Raises:
      ValueError: on a length mismatch, an empty list, or an invalid entry.

    References:
      Biswas et al. (001), §III-A, Proposition 2, Eq. (7); Proposition 3
      (a single block, R = 1, gives the smallest tau for equal kappas).
    """
    kappas = list(np.atleast_1d(np.asarray(kappas, dtype=np.float64)))
    dims = list(np.atleast_1d(np.asarray(dims)))
    if len(kappas) == 0 or len(kappas) != len(dims):
        raise ValueError(
            f"kappas and dims must be non-empty and of equal length, got "
            f"{len(kappas)} and {len(dims)}"
        )
    alphas = _check_orders(orders)
    total = np.zeros_like(alphas)
    for i, (k, p) in enumerate(zip(kappas, dims)):
        try:
            total = total + vmf_rdp(k, int(p) if float(p) == int(p) else p, alphas)
        except ValueError as err:
            raise ValueError(f"block {i}: {err}") from None
    return total
