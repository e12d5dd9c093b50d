"""Per-round local-DP ε of each client's uploads under clipped update noise.

``update_gaussian(sigma, clip_norm=C)`` and ``update_laplace(scale,
clip_norm=C)`` (:mod:`defenses.dp.update_noise`) clip the client's whole
update to norm C (L2 resp. L1) and add the noise to it before it leaves the
client. Whoever sees the upload itself (the curious server of the attacks
here) then sees the output of a DP mechanism on the client's update, with
any two updates in the ball as neighbours (local DP): sensitivity 2C.

* Gaussian: one upload is the Gaussian mechanism with multiplier σ/(2C); a
  client's k uploads compose (RDP, dp_accounting; no amplification: the
  server knows who uploads).
* Laplace: one upload is (2C/b, 0)-DP (Dwork & Roth 2014, Thm 3.6, with L1
  sensitivity 2C); k uploads are (k·2C/b, 0)-DP (basic composition).

The round callback reports, after every round r, ``local_epsilon`` (the worst
client's: the one with the most uploads so far) and ``local_delta`` (δ of the
Gaussian, by default 1 / number of clients, or the config's
``accounting.local_delta``; 0 for Laplace). A client that
uploads a NaN/Inf update (``training.on_nonfinite: skip_client``) still sent
it, so it is counted. The upload counts travel through checkpoints as the
record-level accountant's do.

Unclipped update noise (the Soteria baselines, ``clip_norm=None``) bounds
nothing and gets no accountant.
"""

from __future__ import annotations

import functools

import dp_accounting

from defenses.dp._params import attach_once, infinite_where_unbounded, reported
from defenses.dp._participations import ParticipationAccountant
from fedsim.hooks import register_simulation_plugin

__all__ = ["LocalAccountant", "attach_local_accountant", "local_epsilon"]

_STATE_KIND = "local_dp_accountant"


def local_epsilon(params, uploads: int, delta: float) -> float:
    """ε of ``uploads`` uploads of a client under local DP (sensitivity 2C).

    Args:
      params: the upload defense's :class:`~defenses.dp.DPParameters`
        (level "local"; ``noise_multiplier`` = noise std / C, or b / C).
      uploads: the client's uploads so far (≥ 0).
      delta: δ (Gaussian only; Laplace is pure DP).

    Raises:
      ValueError: a mechanism other than "gauss" or "laplace".
    """
    if uploads <= 0:
        return 0.0
    if params.mechanism == "laplace":
        return uploads * 2.0 / params.noise_multiplier
    if params.mechanism != "gauss":
        raise ValueError(f"local_epsilon: no local-DP account for mechanism "
                         f"{params.mechanism!r}")
    return _gaussian_epsilon(params.noise_multiplier / 2.0, int(uploads), delta)


@functools.lru_cache(maxsize=4096)
@infinite_where_unbounded
def _gaussian_epsilon(multiplier: float, uploads: int, delta: float) -> float:
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(multiplier),
                                                  uploads))
    return float(acc.get_epsilon(delta))


class LocalAccountant(ParticipationAccountant):
    """The ``Simulation.round_callbacks`` entry reporting local-DP ε per round.

    A participation is an upload; the counts and δ travel through checkpoints
    as :class:`~defenses.dp._participations.ParticipationAccountant` says.

    Args:
      sim: the :class:`fedsim.simulation.Simulation` (its cohorts).
      params: the upload defense's :class:`~defenses.dp.DPParameters` (level "local").
      delta: δ in (0, 1).
      delta_given: whether the caller chose ``delta`` (kept over a checkpoint's).
    """

    KIND = _STATE_KIND
    WHO = "attach_local_accountant"

    def __init__(self, sim, params, delta: float, delta_given: bool):
        self.params = params
        super().__init__(sim, delta, delta_given)

    def __call__(self, round_idx: int, row: dict) -> dict:
        del row
        self._count_through(int(round_idx))
        pure = self.params.mechanism == "laplace"
        eps = local_epsilon(self.params, int(self.participations.max()), self.delta)
        return {"local_epsilon": reported(eps),
                "local_delta": 0.0 if pure else self.delta}


def attach_local_accountant(sim, delta: float | None = None) -> bool:
    """Add ``local_epsilon``/``local_delta`` to every metrics row of ``sim``.

    Runs as a simulation plugin inside ``Simulation.__init__`` (default δ);
    calling it again with ``delta`` replaces the δ of the accountant attached.

    Args:
      sim: a :class:`fedsim.simulation.Simulation`.
      delta: target δ in (0, 1) for Gaussian noise (default 1 / number of clients).

    Returns:
      True if the simulation's accountant now reports at ``delta``; False if
      its upload stage has no clipped update noise (exactly one), or ``delta``
      is None and an accountant is attached already.

    Raises:
      ValueError: ``delta`` is not a number in (0, 1).
    """
    return attach_once(
        sim, delta, stage="upload", level="local", attribute="_local_accountant",
        who="attach_local_accountant", default_delta=lambda s: 1.0 / max(int(s.num_clients), 2),
        build=lambda params, delta, given: LocalAccountant(sim, params, delta, given),
        config_key="local_delta")


# Every Simulation whose uploads carry clipped noise reports its local-DP ε.
register_simulation_plugin(attach_local_accountant)
