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
  the config's ``accounting.delta`` or ``attach_accountant(sim, delta=...)``
  replaces it.

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

from defenses.dp._params import attach_once, infinite_where_unbounded, reported
from defenses.dp._participations import ParticipationAccountant
from fedsim.hooks import register_simulation_plugin

# Tags the accountant's saved state, so that a state saved for another round
# callback (the checkpoint pairs callbacks and states by position) is not read
# as participation counts.
_STATE_KIND = "dp_accountant"


def _epsilon_fn(params, dim: int, delta: float):
    from defenses import accounting

    @functools.lru_cache(maxsize=None)
    @infinite_where_unbounded
    def epsilon(q: float, steps: int) -> float:
        if params.mechanism == "gauss":
            return float(accounting.gaussian_epsilon(params.noise_multiplier, q, delta,
                                                     steps=steps).epsilon)
        return float(accounting.vmf_epsilon(params.kappa, dim, q, delta, steps=steps).epsilon)

    return epsilon


class PrivacyAccountant(ParticipationAccountant):
    """The ``Simulation.round_callbacks`` entry that reports ε per round.

    Its state (participation counts and δ, carried through checkpoints) is
    :class:`~defenses.dp._participations.ParticipationAccountant`'s.

    Args:
      sim: the :class:`fedsim.simulation.Simulation` (its cohorts, client
        sizes and training settings).
      params: the DP defense's :class:`~defenses.dp.DPParameters`.
      dim: the number of model parameters (VMF accounting).
      delta: δ in (0, 1).
      delta_given: whether the caller chose ``delta`` (else it is the default
        1 / largest client); a chosen δ is kept over a checkpoint's.
    """

    KIND = _STATE_KIND
    WHO = "attach_accountant"

    def __init__(self, sim, params, dim: int, delta: float, delta_given: bool):
        self.params = params
        self.dim = int(dim)
        self.counts = np.asarray(sim.client_counts, dtype=np.int64)
        t = sim.cfg.training
        self.algorithm = t.algorithm
        self.epochs = 1 if t.algorithm == "fedsgd" else t.local_epochs
        self.batch = sim.settings.effective_batch
        super().__init__(sim, delta, delta_given)

    def set_delta(self, delta: float, *, given: bool = True) -> None:
        """Account at ``delta`` from now on (ε is recomputed from the counts)."""
        super().set_delta(delta, given=given)
        self._epsilon_of = _epsilon_fn(self.params, self.dim, self.delta)

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
        out.update(epsilon=reported(worst), delta=self.delta, epsilon_client=worst_client)
        return out


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
        default_delta=lambda s: 1.0 / float(max(int(np.max(s.client_counts)), 2)),
        config_key="delta")


# Every Simulation whose example-stage defense is a DP defense reports ε.
register_simulation_plugin(attach_accountant)
