"""RDP -> (epsilon, delta)-DP conversion (001 Prop 4, from Canonne et al.).

Both directions of Biswas et al. (001) §III-A, Proposition 4:

* fixed epsilon: delta = inf_alpha exp((alpha-1)(tau_alpha - eps)) / (alpha-1)
  * (1 - 1/alpha)^alpha  (Eq. 8), minimised over continuous alpha (the paper
  notes delta_alpha is convex in alpha for the VMF mechanism);
* fixed delta: eps = alpha/(alpha-1) log(1 - 1/alpha) + tau_alpha
  - log((alpha-1) delta)/(alpha-1) (the form after Theorem 3), minimised over
  a given set of orders.

The fixed-delta form is the same conversion dp_accounting uses
(``dp_accounting.rdp.compute_epsilon``), which the tests use as a cross-check.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize

from defenses.accounting._validation import check_nonnegative, check_open_unit

__all__ = ["rdp_to_epsilon", "rdp_to_delta", "log_delta_at_order"]


def rdp_to_epsilon(orders: ArrayLike, rdp: ArrayLike, delta: float) -> tuple[float, float]:
    """Smallest epsilon over the given orders for a target delta (001 Prop 4).

    Args:
      orders: Rényi orders alpha > 1.
      rdp: RDP values tau_alpha at those orders (``inf`` allowed).
      delta: target delta in (0, 1).

    Returns:
      ``(epsilon, alpha)``: the smallest epsilon (clipped at 0) and the order
      that attains it.

    Raises:
      ValueError: if delta is not in (0, 1), shapes differ, or an order <= 1.

    References:
      Biswas et al. (001) §III-A, Prop 4 and the epsilon form after Thm 3;
      Canonne, Kamath, Steinke (2020), Prop 12 (arXiv numbering; 001 cites
      the same conversion as its ref [28], Prop 2.11).
    """
    delta = check_open_unit("delta", delta)
    a = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    r = np.atleast_1d(np.asarray(rdp, dtype=np.float64))
    if a.shape != r.shape:
        raise ValueError(f"orders and rdp must have the same shape, got {a.shape} and {r.shape}")
    if not np.all(a > 1):
        raise ValueError("orders must all be in (1, inf)")
    eps = r + np.log1p(-1.0 / a) - (np.log(delta) + np.log(a)) / (a - 1.0)
    eps = np.where(np.isnan(eps), np.inf, eps)
    i = int(np.argmin(eps))
    return max(0.0, float(eps[i])), float(a[i])


def log_delta_at_order(alpha: ArrayLike, rdp: ArrayLike, epsilon: float) -> np.ndarray:
    """log delta_alpha of Eq. (8) for given orders and RDP values."""
    a = np.asarray(alpha, dtype=np.float64)
    r = np.asarray(rdp, dtype=np.float64)
    return (a - 1.0) * (r - epsilon) - np.log(a - 1.0) + a * np.log1p(-1.0 / a)


def rdp_to_delta(
    rdp_fn: Callable[[np.ndarray], np.ndarray],
    epsilon: float,
    *,
    max_order: float = 1e4,
    grid_size: int = 256,
) -> tuple[float, float]:
    """Smallest delta for a given epsilon, minimising Eq. (8) over alpha.

    A log-spaced grid over alpha - 1 in [1e-4, max_order - 1] brackets the
    minimum; a bounded Brent (golden-section) search refines it. Using the
    grid first keeps this safe if delta_alpha is only unimodal, not convex.

    Args:
      rdp_fn: vectorised map from orders (array, > 1) to tau_alpha.
      epsilon: epsilon >= 0.
      max_order: largest order searched.
      grid_size: number of grid points.

    Returns:
      ``(delta, alpha)`` with delta clipped to at most 1.

    Raises:
      ValueError: if epsilon < 0.

    References:
      Biswas et al. (001) §III-A, Prop 4, Eq. (8) and the alpha* condition.
    """
    epsilon = check_nonnegative("epsilon", epsilon)
    lo, hi = np.log(1e-4), np.log(max_order - 1.0)
    u = np.linspace(lo, hi, grid_size)
    alphas = 1.0 + np.exp(u)
    vals = log_delta_at_order(alphas, rdp_fn(alphas), epsilon)
    vals = np.where(np.isnan(vals), np.inf, vals)
    i = int(np.argmin(vals))
    a_lo, a_hi = u[max(i - 1, 0)], u[min(i + 1, grid_size - 1)]

    def objective(v: float) -> float:
        a = 1.0 + np.exp(v)
        val = float(log_delta_at_order(a, rdp_fn(np.array([a]))[0], epsilon))
        return np.inf if np.isnan(val) else val

    best_u, best_val = u[i], float(vals[i])
    if a_hi > a_lo:
        res = optimize.minimize_scalar(objective, bounds=(a_lo, a_hi), method="bounded",
                                       options={"xatol": 1e-10})
        if res.fun < best_val:
            best_u, best_val = float(res.x), float(res.fun)
    return float(min(1.0, np.exp(best_val))), float(1.0 + np.exp(best_u))
