"""Leakage ledger: κ per local step, running n·κ and the Thm 1 MSE floor (000)."""

from __future__ import annotations

import math

import numpy as np

from defenses._round_counts import count_through, restored_counts
from defenses.bounds import gaussian_entropy, mse_lower_bound
from defenses.channels._guarantee import ChannelGuarantee
from defenses.channels._statistics import DataStatistics, data_statistics
from fedsim.hooks import unwrap_guarantee

__all__ = ["LeakageLedger", "attach_leakage_ledger", "simulation_ledger", "CHANNEL_DEFENSES"]

# Data-space channels whose spec carries a per-step capacity ``kappa``.
CHANNEL_DEFENSES = ("natural_channel", "white_channel", "personalized_channel",
                    "parameter_channel")

# Tags the ledger's saved state (see LeakageLedger.load_state_dict).
_STATE_KIND = "leakage_ledger"


class LeakageLedger:
    """A ``Simulation.round_callbacks`` entry recording the information budget spent.

    Every local step of a client is one use of a channel of capacity κ, so
    after n_c steps client c has leaked at most n_c·κ nats (000 §1, §4, DPI
    Eq. 16). The row of each round gets:

    * ``leakage_kappa``: κ per local step (nats);
    * ``leakage_steps``: max over clients of their cumulative local steps n;
    * ``leakage_total``: n·κ for that client (the federation's worst case);
    * ``leakage_total_mean``: mean over clients that trained at least once;
    * ``mse_lower_bound``: Thm 1 (Eq. 5) at I = leakage_total, averaged over
      all d coordinates (see below), or absent without data statistics.

    Thm 1 needs h(D). We use the Gaussian entropy of Σ_D's positive
    eigenvalues (the maximum entropy for that covariance), restricted to the
    d' directions with variance > 0 (a zero-variance direction is known
    exactly and contributes 0 error): floor = (d'/d) · e^{2h/d'}/(2πe) ·
    e^{−2I/d'}. Because h is over-estimated, this is the Thm 1 floor for
    Gaussian data with covariance Σ_D — an upper estimate of the floor for
    the real data, not a guaranteed lower bound for it.

    The row of round r depends only on the cohorts of rounds 0..r, whether or
    not the run was checkpointed and resumed in between: the step counts go
    through the checkpoint's callback states (``state_dict`` /
    ``load_state_dict``), and rounds missing from them (a checkpoint written
    before the ledger had a state) are replayed from ``cohort_fn``, which must
    therefore be a pure function of the round (as ``Simulation.cohort`` is).
    """

    def __init__(self, kappa: float, steps_per_participation, num_clients: int,
                 cohort_fn, statistics: DataStatistics | None = None):
        self.kappa = float(kappa)
        self.steps = np.asarray(steps_per_participation, np.int64)
        self.cum = np.zeros(num_clients, np.int64)
        self.rounds_counted = 0  # cum holds the steps of rounds 0 .. rounds_counted - 1
        self.cohort_fn = cohort_fn
        self._entropy = None
        if statistics is not None:
            lam = statistics.eigenvalues[statistics.eigenvalues > 0]
            self._dprime, self._dim = lam.size, statistics.dim
            self._entropy = gaussian_entropy(lam)

    def mse_floor(self, information: float) -> float | None:
        if self._entropy is None:
            return None
        return (self._dprime / self._dim) * mse_lower_bound(self._entropy, information,
                                                            self._dprime)

    def _count_through(self, round_idx: int) -> None:
        """Bring ``cum`` to rounds ``0 .. round_idx``.

        Rounds not counted yet are replayed from their cohorts (after a resume
        from a checkpoint without the ledger's state, the rounds before it). An
        earlier round than the last one counted means a new run on the same
        simulation: count again from round 0.
        """
        self.rounds_counted = count_through(self.cum, self.rounds_counted, round_idx,
                                            self.cohort_fn, per_client=self.steps)

    def state_dict(self) -> dict:
        """JSON-able state for the checkpoint's metadata."""
        return {"kind": _STATE_KIND, "rounds_counted": int(self.rounds_counted),
                "cum": [int(c) for c in self.cum]}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s step counts.

        A state of another callback is ignored (the checkpoint pairs callbacks
        and states by position): the counts are then replayed from the
        cohorts on the next call.

        Raises:
          ValueError: the state counts another number of clients.
        """
        restored = restored_counts(state, _STATE_KIND, "cum", self.cum, "leakage ledger")
        if restored is not None:
            self.cum, self.rounds_counted = restored

    def __call__(self, round_idx: int, row: dict) -> dict:
        del row
        self._count_through(int(round_idx))
        n = int(self.cum.max())
        total = n * self.kappa
        out = {"leakage_kappa": self.kappa, "leakage_steps": n, "leakage_total": total,
               "leakage_total_mean": float(self.cum[self.cum > 0].mean() * self.kappa)}
        floor = self.mse_floor(total)
        if floor is not None:
            out["mse_lower_bound"] = floor
        return out


def steps_per_participation(sim) -> np.ndarray:
    """Local steps with real data each client takes when it trains once."""
    counts = np.asarray(sim.client_counts, np.int64)
    t = sim.cfg.training
    if t.algorithm == "fedsgd":
        return (counts > 0).astype(np.int64)
    b = sim.settings.effective_batch
    return t.local_epochs * -(-counts // b)


def attach_leakage_ledger(sim, kappa: float, *, statistics: DataStatistics | None = None,
                          compute_statistics: bool = True) -> LeakageLedger:
    """Give ``sim`` a :class:`LeakageLedger` of ``kappa`` and return it.

    A simulation that runs a channel has one already (:func:`simulation_ledger`,
    attached when it was built); this one takes its place in
    ``sim.round_callbacks`` (so a checkpoint pairs their states alike), and
    its κ and Σ_D are what the rows report. Otherwise it is appended.

    Args:
      sim: a :class:`fedsim.simulation.Simulation`.
      kappa: the channel's per-step capacity κ (nats).
      statistics: Σ_D for the Thm 1 floor; default: computed from the
        simulation's training inputs when ``compute_statistics``.
    """
    if not (isinstance(kappa, (int, float)) and math.isfinite(kappa) and kappa > 0):
        raise ValueError(f"attach_leakage_ledger: kappa must be > 0, got {kappa!r}")
    if statistics is None and compute_statistics:
        statistics = data_statistics(sim.dataset.x_train)
    ledger = LeakageLedger(kappa, steps_per_participation(sim), sim.num_clients, sim.cohort,
                           statistics)
    callbacks = sim.round_callbacks
    mine = [i for i, cb in enumerate(callbacks) if isinstance(cb, LeakageLedger)]
    if mine:
        callbacks[mine[0]] = ledger
    else:
        callbacks.append(ledger)
    return ledger


def unwrap(g):
    """``g`` without :class:`fedsim.hooks.FollowedBy` wrappers."""
    return unwrap_guarantee(g)[0]


def simulation_ledger(sim):
    """Round-callback factory: a ledger for a simulation that runs a channel defense.

    The channels are found by what they promise (:class:`ChannelGuarantee` in
    :attr:`fedsim.hooks.Defense.guarantees`), whether the config built them
    or they were given by hand (``Simulation(cfg, defenses=...)``), chained or
    inside the pruning mask. Several channels in sequence leak at most the
    smallest κ (DPI), so the ledger uses min κ. Σ_D is the one the first
    data-space channel was calibrated on (for a config channel on the run's own
    dataset: that dataset loaded as the run loads it,
    :func:`fedsim.simulation.on_run_data`), else, for the parameter channel
    alone, the simulation's training inputs'.

    Returns:
      A :class:`LeakageLedger`, or None when no defense is a channel.
    """
    # What acts after a channel in its chain only processes D̃ further: by the
    # DPI it cannot add to I(D; D̃), so a FollowedBy wrapper changes nothing here.
    found = [g for d in sim.defenses.values() for g in map(unwrap, d.guarantees)
             if isinstance(g, ChannelGuarantee)]
    if not found:
        return None
    kappa = min(g.kappa for g in found)
    stats = next((g.statistics for g in found if g.statistics is not None), None)
    if stats is None:
        stats = data_statistics(sim.dataset.x_train)
    return LeakageLedger(kappa, steps_per_participation(sim), sim.num_clients, sim.cohort, stats)


#: The name this factory had when it read the config's defense specs.
ledger_from_config = simulation_ledger
