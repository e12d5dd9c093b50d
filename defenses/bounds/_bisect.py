"""Bisection for the noise level of a channel, in log space."""

from __future__ import annotations

import math
from typing import Callable


def bisect_log_sigma(capacity_of_log_sigma: Callable[[float], float], kappa: float,
                     lo: float, hi: float, *, tol: float, max_iter: int = 300) -> float:
    """σ = exp(t) with capacity(t) = κ for a capacity decreasing in t.

    Args:
      capacity_of_log_sigma: capacity (nats) as a function of t = log σ,
        decreasing in t.
      kappa: the target capacity.
      lo, hi: a bracket in t (capacity(lo) ≥ κ ≥ capacity(hi)).
      tol: stop once |capacity − κ| ≤ tol.
      max_iter: at most this many halvings.

    Returns:
      σ at the last midpoint.
    """
    mid = 0.5 * (lo + hi)
    for _ in range(max_iter):
        mid = 0.5 * (lo + hi)
        val = capacity_of_log_sigma(mid)
        if abs(val - kappa) <= tol:
            break
        if val > kappa:
            lo = mid
        else:
            hi = mid
    return math.exp(mid)
