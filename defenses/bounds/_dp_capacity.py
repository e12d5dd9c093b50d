"""Channel-capacity bounds of DP-SGD's Gaussian mechanism (000, Thm 4)."""

from __future__ import annotations

import math

from defenses.accounting._validation import check_open_unit, check_positive, check_positive_int

__all__ = ["dp_capacity_from_noise", "dp_capacity_from_epsilon"]


def dp_capacity_from_noise(batch_size: int, clip_norm: float, noise_variance: float) -> float:
    """C_DP <= B S^2 / sigma (nats per round).

    Note: 000 writes the noise as sqrt(sigma) xi, so ``noise_variance`` is
    sigma = (noise multiplier)^2 when clip_norm = 1: multipliers
    {0.8, 0.57, 0.46, 0.2066} with B = 64, S = 1 give {100, 197, 302, 1499}.

    Args:
      batch_size: B >= 1.
      clip_norm: L2 clipping bound S > 0.
      noise_variance: sigma > 0.

    Returns:
      The bound B S^2 / sigma.

    Raises:
      ValueError: on out-of-range arguments.

    References:
      Tan et al. (000) §5.3, Theorem 4 (1); App. B.5, Eq. (34).
    """
    b = check_positive_int("batch_size", batch_size)
    s = check_positive("clip_norm", clip_norm)
    v = check_positive("noise_variance", noise_variance)
    return b * s * s / v


def dp_capacity_from_epsilon(batch_size: int, epsilon: float, delta: float) -> float:
    """C_DP <= B eps^2 / (2 log(1.25 / delta)) (nats per round).

    Uses the classical calibration sigma >= S^2 2 log(1.25/delta) / eps^2 of
    the Gaussian mechanism (single release, eps < 1 in its original form).

    Args:
      batch_size: B >= 1.
      epsilon: epsilon > 0.
      delta: delta in (0, 1).

    Returns:
      The bound.

    Raises:
      ValueError: on out-of-range arguments.

    References:
      Tan et al. (000) §5.3, Theorem 4 (2); Dwork & Roth (2014), Thm A.1.
    """
    b = check_positive_int("batch_size", batch_size)
    e = check_positive("epsilon", epsilon)
    d = check_open_unit("delta", delta)
    return b * e * e / (2.0 * math.log(1.25 / d))
