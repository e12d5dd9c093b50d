"""What a DP defense tells the accountants about itself."""

from __future__ import annotations

import functools
import math
import numbers
from typing import NamedTuple

#: Whom a DP guarantee protects: one example of a client's data (DP-SGD inside
#: local training, stage "example"), one client's whole contribution to the
#: round's aggregate (DP-FedAvg, stage "upload"), or one client's update against
#: whoever sees the upload itself (local DP: clipped update noise, stage "upload").
LEVELS = ("record", "client", "local")


class DPParameters(NamedTuple):
    """The privacy-relevant hyper-parameters of a DP defense.

    A DP defense lists it in its :attr:`fedsim.hooks.Defense.guarantees`,
    where the accountants find it (:func:`dp_parameters`).

    Attributes:
      mechanism: "gauss" (Gaussian, incl. DP-PSAC), "vmf", "laplace", or "clip"
        (no noise).
      noise_multiplier: σ (Gaussian: noise std / C; Laplace: b / C); 0 for "clip".
      kappa: κ (VMF), else None.
      clip_norm: C, the clipping norm as configured: one example's L2
        sensitivity with whole-gradient clipping, per layer with
        ``clipping="per_layer"`` (the total is then C·√R over R layers;
        ``noise_multiplier`` is relative to that total); one client's update
        at level "client". Informational: the accountants read only σ or κ.
      dim: p, the number of model parameters (VMF accounting), else None.
      level: "record" (record-level DP within a client's local training,
        :func:`defenses.dp.attach_accountant`), "client" (user-level DP of
        the round's aggregate, :func:`defenses.dp.attach_client_accountant`) or
        "local" (local DP of each upload, :func:`defenses.dp.attach_local_accountant`).
    """

    mechanism: str
    noise_multiplier: float = 0.0
    kappa: float | None = None
    clip_norm: float = 1.0
    dim: int | None = None
    level: str = "record"


def dp_parameters(defense, level: str = "record") -> DPParameters | None:
    """The :class:`DPParameters` of ``defense`` at ``level``, or None.

    None also where the defense (a chain) lists several at that level (which
    one bounds the release depends on their order and on what lies between
    them, which the accountants do not model), and for a "client" guarantee
    that other parts of a chain act after (:func:`unreported_reason`).

    Raises:
      ValueError: ``level`` is not one of :data:`LEVELS`.
    """
    found = dp_guarantees(defense, level)
    if len(found) != 1 or (level == "client" and found[0][1]):
        return None
    return found[0][0]


def dp_guarantees(defense, level: str = "record") -> list[tuple[DPParameters, tuple[str, ...]]]:
    """Every :class:`DPParameters` of ``defense`` at ``level`` (a chain may hold
    several), each with the names of the chain's parts that act after it.

    Raises:
      ValueError: ``level`` is not one of :data:`LEVELS`.
    """
    from fedsim.hooks import unwrap_guarantee

    if level not in LEVELS:
        raise ValueError(f"dp_parameters: level must be one of {list(LEVELS)}, got {level!r}")
    found = [unwrap_guarantee(g) for g in getattr(defense, "guarantees", ())]
    return [(g, later) for g, later in found if isinstance(g, DPParameters) and g.level == level]


def unreported_reason(defense, level: str) -> str | None:
    """Why ``defense``'s DP guarantees at ``level`` give no ε, or None.

    Several at one level: which one bounds the release depends on their order,
    which the accountants do not model. A "client" (DP-FedAvg) guarantee with
    other defenses after it in the chain: each client then transforms its own
    noisy share before the server sums, so the aggregate is no longer the
    Gaussian mechanism on the clipped sum (a per-client function of a share
    is not post-processing of the sum); the shares' local DP still holds.
    """
    found = dp_guarantees(defense, level)
    if len(found) > 1:
        return (f"the {defense.stage!r} defense {defense.name!r} holds several {level}-level "
                "DP mechanisms; which one bounds the release depends on their order, which "
                "the accountant does not model")
    if found and level == "client" and found[0][1]:
        return (f"the chain applies {', '.join(found[0][1])} to each client's upload after its "
                "DP-FedAvg noise share, so the round's aggregate is not the Gaussian mechanism "
                "on the clipped sum; put client_level_dp last among the upload defenses")
    return None


def warn_unreported(defense, level: str, who: str) -> None:
    """Warn that ``who`` reports no ε for ``defense``'s guarantees, and why."""
    reason = unreported_reason(defense, level)
    if reason is not None:
        import warnings
        warnings.warn(f"{who}: {reason}, so it reports no ε", stacklevel=4)


def checked_delta(delta, who: str) -> float:
    """``delta`` as a float in (0, 1), or ValueError naming it (and ``who`` took it)."""
    if (isinstance(delta, bool) or not isinstance(delta, numbers.Real)
            or not 0.0 < float(delta) < 1.0):  # NaN fails the comparison too
        raise ValueError(f"{who}: delta must be a number in (0, 1), got {delta!r}")
    return float(delta)


def configured_delta(sim, key: str) -> float | None:
    """The δ the simulation's config sets for an accountant (``accounting.<key>``), or None."""
    value = getattr(getattr(getattr(sim, "cfg", None), "accounting", None), key, None)
    return None if value is None else checked_delta(value, f"config key 'accounting.{key}'")


def attach_once(sim, delta, *, stage: str, level: str, attribute: str, who: str,
                default_delta, build, config_key: str) -> bool:
    """Attach the accountant ``build`` makes for ``sim``'s DP defense of ``level``, once.

    The shared body of the ``attach_*accountant`` functions: with an
    accountant attached already, a ``delta`` replaces its δ; otherwise the
    defense at ``stage`` is asked for its guarantee at ``level`` and, if it
    has exactly one, ``build(params, delta, given)`` makes the accountant,
    which is appended to ``sim.round_callbacks`` and kept as ``sim.<attribute>``.

    Args:
      sim: the :class:`fedsim.simulation.Simulation`.
      delta: the caller's δ, or None for ``default_delta(sim)``.
      stage, level: where the guarantee is looked for.
      attribute: the simulation attribute holding the accountant.
      who: the attaching function's name, for errors and warnings.
      default_delta: ``default_delta(sim) -> δ``.
      build: ``build(params, delta, given) -> accountant``.
      config_key: the key of the config's ``accounting`` section whose δ,
        when set, is used where ``delta`` is None (as one the caller chose).

    Returns:
      True if an accountant now reports at ``delta``; False if the stage has
      no such guarantee, or ``delta`` is None and one is attached already.

    Raises:
      ValueError: ``delta`` is not a number in (0, 1).
    """
    if delta is not None:
        delta = checked_delta(delta, who)
    existing = getattr(sim, attribute, None)
    if existing is not None:
        if delta is None:
            return False
        existing.set_delta(delta)
        return True
    defense = sim.defenses.get(stage)
    params = None if defense is None else dp_parameters(defense, level=level)
    configured = configured_delta(sim, config_key)
    if params is None:
        if defense is not None:
            warn_unreported(defense, level, who)
        elif configured is not None:
            import warnings
            warnings.warn(f"config key 'accounting.{config_key}' is set, but the run has no "
                          f"{stage}-stage defense with a {level}-level guarantee: no ε uses "
                          "it", stacklevel=4)
        return False
    if delta is None:
        delta = configured
    given = delta is not None
    accountant = build(params, delta if given else default_delta(sim), given)
    sim.round_callbacks.append(accountant)
    setattr(sim, attribute, accountant)
    return True


def infinite_where_unbounded(fn):
    """``fn`` returning ε, with ∞ where the accounting itself cannot bound it.

    At a noise multiplier near the smallest float (≲ 1e-150) dp_accounting's
    RDP divides by zero or overflows: such noise bounds nothing, ε = ∞.
    """

    @functools.wraps(fn)
    def epsilon(*args, **kwargs):
        try:
            return float(fn(*args, **kwargs))
        except (ZeroDivisionError, OverflowError):
            return math.inf

    return epsilon


def reported(epsilon: float) -> float | None:
    """ε as a metrics row holds it: ``None`` (JSON null) where no finite ε exists,
    so that no ``Infinity`` reaches the run's files."""
    return epsilon if math.isfinite(epsilon) else None
