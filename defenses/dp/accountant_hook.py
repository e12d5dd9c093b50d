"""Per-round privacy accounting of a simulation with an example-stage DP defense.

What is accounted (record-level DP within each client's local training):

* Each client runs DP-SGD on its own n_c examples: per local step it samples a
  batch of B examples, i.e. sampling rate q_c = B / n_c (capped at 1), and a
  round of local training takes T_c = local_epochs · ⌈n_c / B⌉ steps (FedSGD:
  one full-batch step, q_c = 1). The engine shuffles each epoch (sampling
  without replacement); like Opacus and TF-Privacy reports, the accountant
  treats the steps as Poisson-subsampled at rate q_c — the standard, slightly
  optimistic convention.
* After round r a client has taken T_c · (rounds it participated in) steps;
  the ε reported for the round is the WORST CASE over all clients so far
  (``epsilon``), with the client attaining it (``epsilon_client``).
* Gaussian (``dp_gaussian``, ``dp_psac``): ``defenses.accounting.gaussian_epsilon``
  (dp_accounting RDP), noise multiplier σ.  VMF (``dp_vmf``):
  ``defenses.accounting.vmf_epsilon`` with p = number of model parameters,
  best of 001's approaches 1 and 2. Both use the standard per-step
  composition. Clipping alone (σ = 0) has no ε (only ``dp_mechanism``).
* δ defaults to 1 / max_c n_c (fixed for the run; reported as ``delta``);
  ``attach_accountant(sim, delta=...)`` replaces it.

The ε of round r depends only on the cohorts of rounds 0..r, so it must not
depend on whether the run was checkpointed and resumed in between: the
accountant saves its counts through the checkpoint's callback states
(``state_dict``/``load_state_dict``) and, where a round is missing from them (a
checkpoint written before it had a state), replays the missing rounds'
cohorts (:meth:`Simulation.cohort` is a pure function of seed and round).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from defenses._round_counts import count_through, restored_counts
from defenses.dp._params import attach_once, checked_delta
from fedsim.hooks import register_simulation_plugin

# Tags the accountant's saved state, so that a state saved for another round
# callback (the checkpoint pairs callbacks and states by position) is not read
# as participation counts.
_STATE_KIND = "dp_accountant"


def _epsilon_fn(params, dim: int, delta: float):
    from defenses import accounting

    @functools.lru_cache(maxsize=None)
    def epsilon(q: float, steps: int) -> float:
        if params.mechanism == "gauss":
            return float(accounting.gaussian_epsilon(params.noise_multiplier, q, delta,
                                                     steps=steps).epsilon)
        return float(accounting.vmf_epsilon(params.kappa, dim, q, delta, steps=steps).epsilon)

    return epsilon


def _checked_delta(delta) -> float:
    return checked_delta(delta, "attach_accountant")


class PrivacyAccountant:
    """The ``Simulation.round_callbacks`` entry that reports ε per round.

    Its state is the per-client participation counts over rounds
    ``0 .. rounds_counted - 1`` and δ. ``state_dict``/``load_state_dict`` carry
    both through a checkpoint (:mod:`fedsim.checkpoint`), so a resumed or
    extended run reports the ε (at the δ) of a run done in one go.

    Args:
      sim: the :class:`fedsim.simulation.Simulation` (its cohorts, client
        sizes and training settings).
      params: the DP defense's :class:`~defenses.dp.DPParameters`.
      dim: the number of model parameters (VMF accounting).
      delta: δ in (0, 1).
      delta_given: whether the caller chose ``delta`` (else it is the default
        1 / largest client); a chosen δ is kept over a checkpoint's.
    """

    def __init__(self, sim, params, dim: int, delta: float, delta_given: bool):
        self.params = params
        self.dim = int(dim)
        self.counts = np.asarray(sim.client_counts, dtype=np.int64)
        t = sim.cfg.training
        self.algorithm = t.algorithm
        self.epochs = 1 if t.algorithm == "fedsgd" else t.local_epochs
        self.batch = sim.settings.effective_batch
        self.cohort = sim.cohort
        self.participations = np.zeros(len(self.counts), dtype=np.int64)
        self.rounds_counted = 0
        self.set_delta(delta, given=delta_given)

    def set_delta(self, delta: float, *, given: bool = True) -> None:
        """Account at ``delta`` from now on (ε is recomputed from the counts)."""
        self.delta = _checked_delta(delta)
        self.delta_given = given
        self._epsilon_of = _epsilon_fn(self.params, self.dim, self.delta)

    def _count_through(self, round_idx: int) -> None:
        """Bring the counts to rounds ``0 .. round_idx``.

        Rounds not counted yet are replayed from their cohorts, so the counts
        are the same whether the rounds before ``round_idx`` were seen by this
        object, restored from a checkpoint, or neither (a checkpoint without
        the accountant's state). An earlier round than the last one counted
        means a new run on the same simulation: count again from round 0.
        """
        self.rounds_counted = count_through(self.participations, self.rounds_counted,
                                            round_idx, self.cohort)

    def epsilon(self) -> tuple[float, int | None]:
        """(worst ε over the clients counted so far, the client attaining it).

        The client is None (and ε 0) before anyone has trained. Ties, e.g.
        every ε = 0 at a huge σ, go to the lowest client id.
        """
        worst, worst_client = 0.0, None
        for cid in np.nonzero(self.participations)[0]:
            n_c = int(self.counts[cid])
            q = min(1.0, self.batch / n_c) if self.algorithm == "fedavg" else 1.0
            steps = self.epochs * math.ceil(n_c / self.batch) * int(self.participations[cid])
            eps = self._epsilon_of(round(q, 12), steps)
            if worst_client is None or eps > worst:
                worst, worst_client = eps, int(cid)
        return worst, worst_client

    def __call__(self, round_idx: int, row: dict) -> dict:
        del row
        out = {"dp_mechanism": self.params.mechanism}
        self._count_through(int(round_idx))
        if self.params.mechanism == "clip":
            return out
        worst, worst_client = self.epsilon()
        out.update(epsilon=worst, delta=self.delta, epsilon_client=worst_client)
        return out

    def state_dict(self) -> dict:
        """JSON-able state for the checkpoint's metadata."""
        return {"kind": _STATE_KIND, "rounds_counted": int(self.rounds_counted),
                "participations": [int(p) for p in self.participations],
                "delta": self.delta}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s counts (and its δ unless one was chosen here).

        A state of another callback is ignored: the counts are then replayed
        from the cohorts on the next call.

        Raises:
          ValueError: the state counts another number of clients.
        """
        restored = restored_counts(state, _STATE_KIND, "participations", self.participations,
                                   "dp accountant")
        if restored is None:
            return
        self.participations, self.rounds_counted = restored
        # The run's δ survives a resume from the command line, where no one can
        # call attach_accountant; a δ chosen in this process wins.
        if not self.delta_given and state.get("delta") is not None:
            self.set_delta(state["delta"], given=True)


def attach_accountant(sim, delta: float | None = None) -> bool:
    """Add ``epsilon``/``delta`` to every metrics row of ``sim`` (if it uses DP).

    Runs as a simulation plugin inside ``Simulation.__init__`` with the default
    δ. Calling it again with ``delta`` on such a simulation replaces the δ of
    the accountant already attached (before :func:`fedsim.run.run_simulation`;
    after rounds have been reported, later rows carry the new δ and the ε of the
    whole history at it).

    Args:
      sim: a :class:`fedsim.simulation.Simulation`.
      delta: target δ in (0, 1) (default 1 / largest client size).

    Returns:
      True if the simulation's accountant now reports at ``delta`` (attached
      now, or its δ replaced); False if the simulation has no example-stage
      DP defense, or ``delta`` is None and an accountant is attached already.

    Raises:
      ValueError: ``delta`` is not a number in (0, 1).
    """
    def build(params, delta, given):
        import jax
        from fedsim.models import count_params, init_params
        # Shapes only (eval_shape): the constant key draws no numbers.
        dim = count_params(jax.eval_shape(
            lambda k: init_params(sim.model, sim.dataset.input_shape, k), jax.random.key(0)))
        return PrivacyAccountant(sim, params, dim, delta, given)

    return attach_once(
        sim, delta, stage="example", level="record", attribute="_dp_accountant",
        who="attach_accountant", build=build,
        default_delta=lambda s: 1.0 / float(max(int(np.max(s.client_counts)), 2)))


# Every Simulation whose example-stage defense is a DP defense reports ε.
register_simulation_plugin(attach_accountant)
