"""User-level ε of DP-FedAvg (McMahan et al., ICLR 2018), through dp_accounting.

DP-FedAvg clips each client's update to L2 norm C and adds N(0, σ²C²) to the
sum over the round's cohort, so one round is the Gaussian mechanism with
noise multiplier σ on the sum, a client being one "record" (user-level DP,
add/remove adjacency). A client in a cohort sampled at rate q = m/K enjoys
amplification by subsampling; McMahan et al. §3 account each round as a
Poisson-sampled Gaussian at that q with the moments accountant (RDP here).

A client that a round includes for certain (the engine's observer forces the
clients it watches into its cohorts) gets no amplification in that round:
that round is the plain Gaussian mechanism for it. So the ε of one client is
that of ``sampled_rounds`` Poisson-sampled Gaussians composed with
``certain_rounds`` unsampled ones.
"""

from __future__ import annotations

from typing import Literal

import dp_accounting

from defenses.accounting._gaussian import _make_accountant, gaussian_event
from defenses.accounting._result import PrivacyGuarantee
from defenses.accounting._validation import check_open_unit, check_positive, check_rate

__all__ = ["dp_fedavg_epsilon", "dp_fedavg_event"]

#: PrivacyGuarantee.convention of a per-round account.
PER_ROUND = "per-round (one composition per FL round)"


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def dp_fedavg_event(noise_multiplier: float, sample_rate: float, *, sampled_rounds: int,
                    certain_rounds: int = 0) -> dp_accounting.DpEvent:
    """The dp_accounting event of one client's rounds under DP-FedAvg.

    McMahan et al. (ICLR 2018) §3: each round a Poisson-sampled Gaussian at
    q = m/K; a round that includes the client for certain, an unsampled one.

    Args:
      noise_multiplier: σ > 0 (the round's noise std / C).
      sample_rate: q = m/K in (0, 1], the rate at which a round samples the client.
      sampled_rounds: rounds that sampled the client at rate q (≥ 0).
      certain_rounds: rounds that included it for certain (≥ 0).

    Returns:
      ``ComposedDpEvent`` of the two self-compositions (the empty ones left out).

    Raises:
      ValueError: σ ≤ 0, q outside (0, 1], a negative or non-integer count, or
        no round at all.
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    q = check_rate("sample_rate", sample_rate)
    sampled = _count("sampled_rounds", sampled_rounds)
    certain = _count("certain_rounds", certain_rounds)
    if sampled + certain == 0:
        raise ValueError("dp_fedavg_event needs at least one round (sampled_rounds + "
                         "certain_rounds >= 1)")
    events = []
    if sampled:
        events.append(gaussian_event(sigma, q, sampled))
    if certain:
        events.append(dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(sigma), certain))
    return dp_accounting.ComposedDpEvent(events)


def dp_fedavg_epsilon(noise_multiplier: float, sample_rate: float, delta: float, *,
                      sampled_rounds: int, certain_rounds: int = 0,
                      accountant: Literal["rdp", "pld"] = "rdp") -> PrivacyGuarantee:
    """User-level (ε, δ) of DP-FedAvg for one client after its rounds.

    Implements the accounting of McMahan et al. (2018), "Learning
    Differentially Private Recurrent Language Models", §3 and Alg 1 (the
    fixed-denominator estimator with σ relative to C), with rounds that
    include the client for certain composed in unsampled.

    Deviation: the engine samples a fixed-size cohort (m of K without
    replacement); like McMahan et al. (and Opacus / TF-Privacy for fixed-size
    batches) the account treats it as Poisson sampling at q = m/K.

    Args:
      noise_multiplier: σ > 0.
      sample_rate: q = m/K in (0, 1].
      delta: target δ in (0, 1).
      sampled_rounds: rounds that sampled the client at rate q.
      certain_rounds: rounds that included the client for certain.
      accountant: ``"rdp"`` (dp_accounting's default orders) or ``"pld"``.

    Returns:
      :class:`PrivacyGuarantee` (``count`` = all rounds, ``convention`` per round).

    Raises:
      ValueError: as :func:`dp_fedavg_event`, or δ outside (0, 1), or an
        unknown accountant.
    """
    event = dp_fedavg_event(noise_multiplier, sample_rate, sampled_rounds=sampled_rounds,
                            certain_rounds=certain_rounds)
    delta = check_open_unit("delta", delta)
    acc = _make_accountant(accountant)
    acc.compose(event)
    if accountant == "rdp":
        eps, alpha = acc.get_epsilon_and_optimal_order(delta)
        alpha = float(alpha)
    else:
        eps, alpha = acc.get_epsilon(delta), None
    return PrivacyGuarantee(epsilon=float(eps), delta=delta, approach=accountant, alpha=alpha,
                            convention=PER_ROUND, count=sampled_rounds + certain_rounds,
                            candidates={accountant: float(eps)})
