"""Per-round user-level ε of a simulation whose uploads run DP-FedAvg.

``client_level_dp`` (:mod:`defenses.dp.update_noise`) makes each round the
Gaussian mechanism with noise multiplier σ on the sum of the cohort's clipped
updates (McMahan et al., ICLR 2018, Alg 1), a client being one record. The
round callback here reports, after every round r,

* ``client_level_epsilon``: the worst ε over the clients after rounds 0..r
  (:func:`defenses.accounting.dp_fedavg_epsilon`, RDP), at
* ``client_level_delta``: δ, by default 1 / number of clients (as the
  record-level accountant's 1 / largest client); the config's
  ``accounting.client_delta`` or :func:`attach_client_accountant` replaces it.

What the account assumes, and where the engine departs from it:

* Cohorts of m = ``training.clients_per_round`` out of K clients, accounted as
  Poisson sampling at q = m/K (McMahan et al.'s convention; the engine samples
  a fixed-size cohort without replacement).
* Rounds that the observer forces a client into (``observer.clients`` in
  ``observer.rounds``) include it for certain: for that client those rounds
  are unsampled Gaussians. The reported ε is the worst client's, so these
  rounds count unsampled whenever the observer forces anyone. (The other
  clients of such a round are sampled at (m − t)/(K − t) ≤ q; counting them at
  q errs on the safe side.)
* A client skipped for a NaN/Inf update (``training.on_nonfinite:
  skip_client``) takes its noise share with it: a round that skipped s of its
  m clients carries N(0, σ²C²(m − s)/m) on a sum of the same sensitivity C,
  i.e. the multiplier σ·√((m − s)/m), and is accounted so. A round that
  skipped every client released nothing new and costs nothing.
* An honest aggregator that reveals only the round's aggregate (the
  guarantee of DP-FedAvg). A curious server that sees single uploads sees
  each with only N(0, σ²C²/m): the engine's noise is added in distributed form
  (see ``client_level_dp``), and this ε does not hold against it.

The skipped counts go through the checkpoint's callback states, so a resumed
run reports the ε of a run done in one go. Rounds before a checkpoint written
without this state (older runs) are counted as full rounds.
"""

from __future__ import annotations

import collections
import functools
import math

import dp_accounting

from defenses.accounting import dp_fedavg_event
from defenses.dp._params import attach_once, checked_delta, infinite_where_unbounded, reported
from fedsim.hooks import register_simulation_plugin

__all__ = ["ClientLevelAccountant", "attach_client_accountant"]

_STATE_KIND = "client_level_dp_accountant"


def _checked_delta(delta) -> float:
    return checked_delta(delta, "attach_client_accountant")


class ClientLevelAccountant:
    """The ``Simulation.round_callbacks`` entry reporting user-level ε per round.

    Args:
      sim: the :class:`fedsim.simulation.Simulation`.
      params: the ``client_level_dp`` defense's
        :class:`~defenses.dp.DPParameters` (level "client").
      delta: δ in (0, 1).
      delta_given: whether the caller chose ``delta`` (kept over a checkpoint's).
    """

    def __init__(self, sim, params, delta: float, delta_given: bool):
        self.params = params
        t, obs = sim.cfg.training, sim.cfg.observer
        self.cohort_size = min(int(t.clients_per_round), int(sim.num_clients))
        self.sample_rate = self.cohort_size / int(sim.num_clients)
        self.forced_rounds = frozenset(obs.rounds) if obs.clients else frozenset()
        #: round -> clients skipped in it (only rounds that skipped any)
        self.skipped: dict[int, int] = {}
        self.set_delta(delta, given=delta_given)

    def set_delta(self, delta: float, *, given: bool = True) -> None:
        """Account at ``delta`` from now on."""
        self.delta = _checked_delta(delta)
        self.delta_given = given

    def rounds_through(self, round_idx: int) -> dict[float, tuple[int, int]]:
        """{noise multiplier: (sampled rounds, certain rounds)} for the worst
        client over rounds 0..``round_idx``."""
        sampled: collections.Counter = collections.Counter()
        certain: collections.Counter = collections.Counter()
        m, sigma = self.cohort_size, self.params.noise_multiplier
        for r in range(round_idx + 1):
            s = min(self.skipped.get(r, 0), m)
            if s == m:  # every client skipped: the model did not move
                continue
            counts = certain if r in self.forced_rounds else sampled
            counts[sigma * math.sqrt((m - s) / m)] += 1
        return {x: (sampled[x], certain[x]) for x in sorted(set(sampled) | set(certain))}

    def epsilon(self, round_idx: int) -> float:
        """The worst client's ε after rounds 0..``round_idx`` (0 before any release)."""
        groups = tuple(self.rounds_through(round_idx).items())
        if not groups:
            return 0.0
        return _epsilon(groups, self.sample_rate, self.delta)

    def __call__(self, round_idx: int, row: dict) -> dict:
        skipped = row.get("skipped_clients") or ()
        if skipped:
            self.skipped[int(round_idx)] = len(skipped)
        else:
            self.skipped.pop(int(round_idx), None)  # a round run again (a new run)
        return {"client_level_epsilon": reported(self.epsilon(int(round_idx))),
                "client_level_delta": self.delta}

    def state_dict(self) -> dict:
        """JSON-able state for the checkpoint's metadata."""
        return {"kind": _STATE_KIND, "delta": self.delta,
                "skipped": {str(r): s for r, s in sorted(self.skipped.items())}}

    def load_state_dict(self, state: dict) -> None:
        """Restore the skipped counts (and δ unless one was chosen here).

        A state of another callback is ignored (the checkpoint pairs callbacks
        and states by position).
        """
        if not isinstance(state, dict) or state.get("kind") != _STATE_KIND:
            return
        self.skipped = {int(r): int(s) for r, s in state.get("skipped", {}).items()}
        if not self.delta_given and state.get("delta") is not None:
            self.set_delta(state["delta"], given=True)


@functools.lru_cache(maxsize=4096)
@infinite_where_unbounded
def _epsilon(groups: tuple, sample_rate: float, delta: float) -> float:
    """RDP ε of the composed rounds ``groups`` ((σ, (sampled, certain)), ...)."""
    events = [dp_fedavg_event(sigma, sample_rate, sampled_rounds=ns, certain_rounds=nc)
              for sigma, (ns, nc) in groups]
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.ComposedDpEvent(events))
    return float(acc.get_epsilon(delta))


def attach_client_accountant(sim, delta: float | None = None) -> bool:
    """Add ``client_level_epsilon``/``client_level_delta`` to every metrics row of ``sim``.

    Runs as a simulation plugin inside ``Simulation.__init__`` (default δ);
    calling it again with ``delta`` replaces the δ of the accountant attached.

    Args:
      sim: a :class:`fedsim.simulation.Simulation`.
      delta: target δ in (0, 1) (default 1 / number of clients).

    Returns:
      True if the simulation's accountant now reports at ``delta``; False if
      its upload stage has no ``client_level_dp`` (exactly one), or ``delta``
      is None and an accountant is attached already.

    Raises:
      ValueError: ``delta`` is not a number in (0, 1).
    """
    return attach_once(
        sim, delta, stage="upload", level="client", attribute="_client_level_accountant",
        who="attach_client_accountant", default_delta=lambda s: 1.0 / max(int(s.num_clients), 2),
        build=lambda params, delta, given: ClientLevelAccountant(sim, params, delta, given),
        config_key="client_delta")


# Every Simulation whose upload stage runs DP-FedAvg reports its user-level ε.
register_simulation_plugin(attach_client_accountant)
