"""(eps, delta) of DP-SGD with VMF noise: the better of 001's two approaches."""

from __future__ import annotations

import functools
import math
from typing import Optional

from defenses.accounting._approaches import approach_one, approach_two
from defenses.accounting._composition import resolve_compositions
from defenses.accounting._result import PrivacyGuarantee
from defenses.accounting._validation import check_dim, check_nonnegative, check_open_unit, check_rate
from defenses.accounting._vmf import vmf_rdp

__all__ = ["vmf_epsilon"]


def vmf_epsilon(
    kappa: float,
    dim: int,
    sample_rate: float,
    delta: float,
    *,
    steps: Optional[int] = None,
    compositions: Optional[int] = None,
    max_order: int = 512,
    fractional_orders: bool = False,
    delta_split: Optional[float] = None,
) -> PrivacyGuarantee:
    """Epsilon of Poisson-subsampled DP-SGD with VMF noise (Alg. 2 of 001).

    Runs approach 1 and approach 2 of 001 §III-A on the VMF RDP curve
    (Prop 1) and reports the smaller epsilon and which approach gave it.

    Composition convention: pass ``steps=T`` for standard DP-SGD accounting
    (one composition per noisy step, T ~ epochs / sample_rate), or
    ``compositions=N`` for the paper's convention (one composition per epoch,
    N = 3 in Table I/IV), which under-counts by ~1/sample_rate. Exactly one
    must be given; library code should use ``steps``.

    Args:
      kappa: VMF concentration, >= 0.
      dim: gradient dimension p >= 2 (the sphere is S^{p-1}).
      sample_rate: Poisson sampling rate gamma in (0, 1].
      delta: target delta in (0, 1).
      steps: number of DP-SGD steps (standard convention).
      compositions: number of compositions under 001's per-epoch convention.
      max_order: largest integer Rényi order for approach 2.
      fractional_orders: let approach 2 also use interpolated orders.
      delta_split: fixed delta split for approach 1 (see :func:`approach_one`);
        ``None`` optimises it.

    Returns:
      A :class:`PrivacyGuarantee` with ``approach`` ``"1"`` or ``"2"``.

    Raises:
      ValueError: kappa < 0, dim < 2, sample_rate not in (0, 1], delta not in
        (0, 1), or not exactly one of steps / compositions.

    References:
      Biswas et al. (001) §III-A, Prop 1, approaches 1 and 2, Table I / IV.
    """
    kappa = check_nonnegative("kappa", kappa)
    dim = check_dim("dim", dim)
    gamma = check_rate("sample_rate", sample_rate)
    delta = check_open_unit("delta", delta)
    count, convention = resolve_compositions(steps=steps, compositions=compositions)
    rdp_fn = functools.partial(vmf_rdp, kappa, dim)
    eps1, alpha1 = approach_one(rdp_fn, gamma, count, delta, delta_split=delta_split)
    eps2, alpha2 = approach_two(rdp_fn, gamma, count, delta, max_order=max_order,
                                fractional_orders=fractional_orders)
    if eps1 <= eps2:
        approach, eps, alpha = "1", eps1, alpha1
    else:
        approach, eps, alpha = "2", eps2, alpha2
    return PrivacyGuarantee(
        epsilon=float(eps),
        delta=delta,
        approach=approach,
        alpha=None if math.isnan(alpha) else float(alpha),
        convention=convention,
        count=count,
        candidates={"approach_1": float(eps1), "approach_2": float(eps2)},
    )
