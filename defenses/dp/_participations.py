"""Per-client participation counts and δ, which two DP accountants share."""

from __future__ import annotations

import numpy as np

from defenses._round_counts import count_through, restored_counts
from defenses.dp._params import checked_delta


class ParticipationAccountant:
    """Base of the round callbacks whose ε depends on how often each client took part.

    Its state is the per-client participation counts over rounds
    ``0 .. rounds_counted - 1`` and δ. ``state_dict``/``load_state_dict`` carry
    both through a checkpoint (:mod:`fedsim.checkpoint`), so a resumed or
    extended run reports the ε (at the δ) of a run done in one go; a
    checkpoint without them is replayed from the earlier rounds' cohorts.

    Subclasses set ``KIND`` (the state's tag) and ``WHO`` (the attaching
    function, named in errors).

    Args:
      sim: the :class:`fedsim.simulation.Simulation` (its cohorts).
      delta: δ in (0, 1).
      delta_given: whether the caller chose ``delta``; a chosen δ is kept over
        a checkpoint's.
    """

    KIND = "participations"
    WHO = "accountant"

    def __init__(self, sim, delta: float, delta_given: bool):
        self.cohort = sim.cohort
        self.participations = np.zeros(int(sim.num_clients), dtype=np.int64)
        self.rounds_counted = 0
        self.set_delta(delta, given=delta_given)

    def set_delta(self, delta: float, *, given: bool = True) -> None:
        """Account at ``delta`` from now on (ε is recomputed from the counts)."""
        self.delta = checked_delta(delta, self.WHO)
        self.delta_given = given

    def _count_through(self, round_idx: int) -> None:
        """Bring the counts to rounds ``0 .. round_idx`` (:func:`count_through`)."""
        self.rounds_counted = count_through(self.participations, self.rounds_counted,
                                            int(round_idx), self.cohort)

    def state_dict(self) -> dict:
        """JSON-able state for the checkpoint's metadata."""
        return {"kind": self.KIND, "rounds_counted": int(self.rounds_counted),
                "participations": [int(p) for p in self.participations],
                "delta": self.delta}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s counts (and its δ unless one was chosen here).

        A state of another callback is ignored: the counts are then replayed
        from the cohorts on the next call.

        Raises:
          ValueError: the state counts another number of clients.
        """
        restored = restored_counts(state, self.KIND, "participations", self.participations,
                                   self.KIND)
        if restored is None:
            return
        self.participations, self.rounds_counted = restored
        # The run's δ survives a resume from the command line, where no one can
        # call the attaching function; a δ chosen in this process wins.
        if not self.delta_given and state.get("delta") is not None:
            self.set_delta(state["delta"], given=True)
