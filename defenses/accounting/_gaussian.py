"""Poisson-subsampled Gaussian mechanism (DP-SGD), through dp_accounting.

RDP and PLD accounting and noise calibration are delegated to Google's
``dp_accounting`` (RdpAccountant, PLDAccountant, calibrate_dp_mechanism);
this module only fixes the event structure (T-fold self-composition of a
Poisson-sampled Gaussian with noise multiplier sigma = noise std / clip norm)
and the project's composition convention (see :mod:`._composition`).

For 001's approaches 1 and 2 applied to the Gaussian (used to study Table IV's
sigma column) :func:`gaussian_rdp_unsampled` gives the plain curve
tau_alpha = alpha / (2 sigma^2).

Finding on 001's Table IV sigma column (benchmarks/gaussian_sigma_column.py,
results in benchmarks/results/gaussian_sigma_column.md): the printed sigmas
are reproduced within 0.5 % on every row by *standard per-step* RDP
accounting (dp_accounting RDP, T = ceil(3 / gamma) = 1,407 steps,
delta = 1/60000) — e.g. eps = 0.49 needs sigma = 1.226 (printed 1.23). They
are not reproduced by the paper's own per-epoch convention (N = 3, which
the VMF epsilons use; sigma off by 8-55 %), by approaches 1/2 applied to the
Gaussian, or by PLD (tighter: 0.26 at sigma = 1.23). So Table IV compares a
per-epoch VMF epsilon with a per-step Gaussian epsilon.
"""

from __future__ import annotations

from typing import Literal, Optional, Sequence

import dp_accounting
import numpy as np
from numpy.typing import ArrayLike

from defenses.accounting._composition import resolve_compositions
from defenses.accounting._result import PrivacyGuarantee
from defenses.accounting._validation import check_open_unit, check_positive, check_rate

__all__ = [
    "gaussian_event",
    "gaussian_rdp",
    "gaussian_rdp_unsampled",
    "gaussian_epsilon",
    "gaussian_noise_for_epsilon",
]

Accountant = Literal["rdp", "pld"]


def _make_accountant(kind: str, orders: Optional[Sequence[float]] = None):
    if kind == "rdp":
        return dp_accounting.rdp.RdpAccountant(orders=orders)
    if kind == "pld":
        return dp_accounting.pld.PLDAccountant()
    raise ValueError(f"accountant must be one of ['rdp', 'pld'], got {kind!r}")


def gaussian_event(noise_multiplier: float, sample_rate: float, count: int) -> dp_accounting.DpEvent:
    """The dp_accounting event for ``count`` Poisson-sampled Gaussian steps.

    DP-SGD with Gaussian noise (001 Alg 1; Abadi et al. 2016), accounted by
    the sampled Gaussian mechanism's RDP (Mironov, Talwar and Zhang 2019) or PLD.

    Args:
      noise_multiplier: sigma (noise std / L2 clipping norm), > 0.
      sample_rate: Poisson sampling rate q in (0, 1].
      count: number of compositions >= 1.

    Returns:
      ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), count)``.
    """
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier)),
        count,
    )


def gaussian_rdp_unsampled(noise_multiplier: float, orders: ArrayLike) -> np.ndarray:
    """RDP of one non-subsampled Gaussian step: tau_alpha = alpha / (2 sigma^2).

    Args:
      noise_multiplier: sigma > 0.
      orders: orders alpha > 1.

    Returns:
      float64 array of tau_alpha.

    Raises:
      ValueError: if sigma <= 0.

    References:
      Mironov (2017), Prop 7; 001 §III-A (input of approaches 1 and 2).
    """
    sigma = check_positive("sigma", noise_multiplier)
    return np.asarray(orders, dtype=np.float64) / (2.0 * sigma**2)


def gaussian_rdp(
    noise_multiplier: float,
    sample_rate: float,
    orders: Sequence[float],
    *,
    steps: Optional[int] = None,
    compositions: Optional[int] = None,
) -> np.ndarray:
    """RDP curve of T-fold Poisson-subsampled Gaussian, from dp_accounting.

    Args:
      noise_multiplier: sigma > 0.
      sample_rate: q in (0, 1].
      orders: Rényi orders.
      steps: number of steps (standard convention).
      compositions: number of compositions (001's per-epoch convention).

    Returns:
      float64 array of the composed RDP at ``orders``.

    Raises:
      ValueError: on out-of-range arguments.

    References:
      Mironov, Talwar, Zhang (2019), "Rényi DP of the sampled Gaussian
      mechanism", as implemented by dp_accounting.rdp.RdpAccountant.
    """
    sigma = check_positive("sigma", noise_multiplier)
    q = check_rate("sample_rate", sample_rate)
    count, _ = resolve_compositions(steps=steps, compositions=compositions)
    acc = dp_accounting.rdp.RdpAccountant(orders=list(orders))
    acc.compose(gaussian_event(sigma, q, count))
    # dp_accounting has no public accessor for the RDP curve; _rdp has been
    # the accountant's state since its first release.
    return np.array(acc._rdp, dtype=np.float64)  # pylint: disable=protected-access


def gaussian_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    delta: float,
    *,
    steps: Optional[int] = None,
    compositions: Optional[int] = None,
    accountant: Accountant = "rdp",
) -> PrivacyGuarantee:
    """Epsilon of DP-SGD with Gaussian noise (Alg. 1 of 001), via dp_accounting.

    Composition convention as in :func:`vmf_epsilon`: ``steps=T`` is standard
    (one composition per step); ``compositions=N`` is 001's per-epoch one.

    Args:
      noise_multiplier: sigma > 0 (noise std / clip norm).
      sample_rate: q in (0, 1].
      delta: target delta in (0, 1).
      steps: number of DP-SGD steps (standard convention).
      compositions: number of compositions (001's per-epoch convention).
      accountant: ``"rdp"`` (dp_accounting's default orders; the conversion is
        Canonne et al.'s, as 001 Prop 4) or ``"pld"`` (tight numerical).

    Returns:
      :class:`PrivacyGuarantee` with ``approach`` = ``accountant``.

    Raises:
      ValueError: sigma <= 0, q not in (0, 1], delta not in (0, 1), bad
        accountant, or not exactly one of steps / compositions.

    References:
      Abadi et al. (2016); dp_accounting RdpAccountant / PLDAccountant.
    """
    sigma = check_positive("sigma", noise_multiplier)
    q = check_rate("sample_rate", sample_rate)
    delta = check_open_unit("delta", delta)
    count, convention = resolve_compositions(steps=steps, compositions=compositions)
    acc = _make_accountant(accountant)
    acc.compose(gaussian_event(sigma, q, count))
    if accountant == "rdp":
        eps, alpha = acc.get_epsilon_and_optimal_order(delta)
        alpha = float(alpha)
    else:
        eps, alpha = acc.get_epsilon(delta), None
    return PrivacyGuarantee(
        epsilon=float(eps), delta=delta, approach=accountant, alpha=alpha,
        convention=convention, count=count, candidates={accountant: float(eps)},
    )


def gaussian_noise_for_epsilon(
    target_epsilon: float,
    sample_rate: float,
    delta: float,
    *,
    steps: Optional[int] = None,
    compositions: Optional[int] = None,
    accountant: Accountant = "rdp",
    tol: float = 1e-4,
) -> float:
    """Smallest noise multiplier sigma meeting (target_epsilon, delta).

    The ε → σ mapping of 001 App C (Table IV lists the σ its experiments used).
    Delegates to ``dp_accounting.calibrate_dp_mechanism`` (bracketing search).

    Args:
      target_epsilon: epsilon > 0.
      sample_rate: q in (0, 1].
      delta: target delta in (0, 1).
      steps: number of DP-SGD steps (standard convention).
      compositions: number of compositions (001's per-epoch convention).
      accountant: ``"rdp"`` or ``"pld"``.
      tol: tolerance on sigma.

    Returns:
      sigma such that the accountant reports epsilon <= target_epsilon.

    Raises:
      ValueError: on out-of-range arguments.

    References:
      dp_accounting.mechanism_calibration.calibrate_dp_mechanism.
    """
    target_epsilon = check_positive("target_epsilon", target_epsilon)
    q = check_rate("sample_rate", sample_rate)
    delta = check_open_unit("delta", delta)
    count, _ = resolve_compositions(steps=steps, compositions=compositions)
    _make_accountant(accountant)  # validates the name early
    return float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: _make_accountant(accountant),
            lambda s: gaussian_event(s, q, count),
            target_epsilon,
            delta,
            dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
            tol=tol,
        )
    )
