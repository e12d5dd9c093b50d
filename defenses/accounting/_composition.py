"""Composition: the counting convention and Kairouz et al.'s theorem.

Two conventions for how many times the per-batch mechanism is composed:

* ``steps=T`` — standard DP-SGD accounting: one composition per noisy step
  (T = epochs / sample_rate). This is the default everywhere.
* ``compositions=N`` — the convention of Biswas et al. (001, Table I/IV):
  one composition per *epoch* (N = 3), with the sampling rate still that of
  one batch. It under-counts by a factor of about 1/sample_rate and is kept
  only to reproduce the paper's numbers.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from defenses.accounting._validation import (
    check_nonnegative,
    check_positive,
    check_positive_int,
    check_rate,
)

__all__ = [
    "PER_STEP",
    "PER_EPOCH_PAPER",
    "resolve_compositions",
    "steps_for_epochs",
    "kairouz_composition",
]

PER_STEP = "per-step"
PER_EPOCH_PAPER = "per-epoch (paper 001 convention)"


def steps_for_epochs(epochs: float, sample_rate: float) -> int:
    """Number of Poisson-sampled steps in ``epochs`` passes: ceil(epochs / q).

    The standard per-step count (Abadi et al. 2016, T = E/q), against 001's
    per-epoch convention (§III-A, Table I: N = 3 epochs counted as 3
    compositions; :func:`resolve_compositions`).

    Args:
      epochs: number of epochs, > 0.
      sample_rate: q in (0, 1].

    Returns:
      ceil(epochs / q) (rounded up so as never to under-count).

    Raises:
      ValueError: on out-of-range arguments.
    """
    epochs = check_positive("epochs", epochs)
    q = check_rate("sample_rate", sample_rate)
    # Guard against 3 / (128/60000) = 1406.2500000000002 style round-off.
    return int(math.ceil(epochs / q - 1e-9))


def resolve_compositions(
    steps: Optional[int] = None, compositions: Optional[int] = None
) -> tuple[int, str]:
    """Picks the composition count and names the convention it stands for.

    001 §III-A counts compositions per epoch (Table I: N = 3); the standard
    count is per step (:func:`steps_for_epochs`).

    Args:
      steps: number of DP-SGD steps (standard, per-step convention).
      compositions: number of compositions under 001's per-epoch convention.

    Returns:
      ``(count, convention)`` where convention is ``PER_STEP`` or
      ``PER_EPOCH_PAPER``.

    Raises:
      ValueError: unless exactly one of the two is given, as an integer >= 1.
    """
    if (steps is None) == (compositions is None):
        raise ValueError(
            "give exactly one of steps (standard per-step accounting) or "
            "compositions (paper 001's per-epoch convention)"
        )
    if steps is not None:
        return check_positive_int("steps", steps), PER_STEP
    return check_positive_int("compositions", compositions), PER_EPOCH_PAPER


def kairouz_composition(epsilon: float, delta: float, count: int, delta_slack: float) -> tuple[float, float]:
    """N-fold composition of (eps, delta)-DP mechanisms (Kairouz et al., Thm 3.5).

    eps~ = min{ N eps,
                N eps (e^eps - 1)/(e^eps + 1) + eps sqrt(2N log(e + sqrt(N eps^2)/d~)),
                N eps (e^eps - 1)/(e^eps + 1) + eps sqrt(2N log(1/d~)) },
    delta_total = 1 - (1 - delta)^N (1 - d~).

    Deviation: 001 (Thm 2) prints the first summand as (e^eps-1)/(e^eps+1)
    without the factor N eps; Kairouz et al. have N eps (e^eps-1)/(e^eps+1),
    which is used here (the paper's form is not a valid bound for large N).

    Args:
      epsilon: per-mechanism epsilon >= 0.
      delta: per-mechanism delta in [0, 1).
      count: N >= 1.
      delta_slack: d~ in [0, 1); with d~ = 0 only the N eps term applies.

    Returns:
      ``(eps_total, delta_total)``.

    Raises:
      ValueError: on out-of-range arguments.

    References:
      Biswas et al. (001) §III-A, Theorem 2; Kairouz, Oh, Viswanath, "The
      composition theorem for differential privacy", IEEE T-IT 2017, Thm 3.5
      (their [46, Theorem 10] in the arXiv numbering).
    """
    epsilon = check_nonnegative("epsilon", epsilon)
    n = check_positive_int("count", count)
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    if not 0 <= delta_slack < 1:
        raise ValueError(f"delta_slack must be in [0, 1), got {delta_slack!r}")
    candidates = [n * epsilon]
    if delta_slack > 0 and epsilon > 0:
        drift = n * epsilon * np.tanh(epsilon / 2.0)  # (e^e - 1)/(e^e + 1) = tanh(e/2)
        candidates.append(
            drift + epsilon * math.sqrt(2 * n * math.log(math.e + math.sqrt(n * epsilon**2) / delta_slack))
        )
        candidates.append(drift + epsilon * math.sqrt(2 * n * math.log(1.0 / delta_slack)))
    total_delta = 1.0 - (1.0 - delta) ** n * (1.0 - delta_slack)
    return float(min(candidates)), float(total_delta)
