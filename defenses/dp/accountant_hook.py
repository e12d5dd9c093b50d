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
* δ defaults to 1 / max_c n_c (fixed for the run; reported as ``delta``).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from defenses.dp._params import dp_parameters
from fedsim.hooks import register_simulation_plugin


def _epsilon_fn(params, dim: int, delta: float):
    from defenses import accounting

    @functools.lru_cache(maxsize=None)
    def epsilon(q: float, steps: int) -> float:
        if params.mechanism == "gauss":
            return float(accounting.gaussian_epsilon(params.noise_multiplier, q, delta,
                                                     steps=steps).epsilon)
        return float(accounting.vmf_epsilon(params.kappa, dim, q, delta, steps=steps).epsilon)

    return epsilon


def attach_accountant(sim, delta: float | None = None) -> bool:
    """Add ``epsilon``/``delta`` to every metrics row of ``sim`` (if it uses DP).

    Args:
      sim: a :class:`fedsim.simulation.Simulation`.
      delta: target δ (default 1 / largest client size).

    Returns:
      True if an accountant was attached, False if the simulation has no
      example-stage DP defense (or one was attached already).
    """
    if getattr(sim, "_dp_accountant_attached", False):
        return False
    defense = sim.defenses.get("example")
    params = None if defense is None else dp_parameters(defense)
    if params is None:
        return False
    counts = np.asarray(sim.client_counts, dtype=np.int64)
    if delta is None:
        delta = 1.0 / float(max(int(counts.max()), 2))
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    t = sim.cfg.training
    epochs = 1 if t.algorithm == "fedsgd" else t.local_epochs
    batch = sim.settings.effective_batch
    participations = np.zeros(len(counts), dtype=np.int64)
    import jax
    from fedsim.models import count_params, init_params
    # Shapes only (eval_shape): the constant key draws no numbers.
    dim = count_params(jax.eval_shape(
        lambda k: init_params(sim.model, sim.dataset.input_shape, k), jax.random.key(0)))
    epsilon_of = _epsilon_fn(params, dim, float(delta))

    def callback(round_idx: int, row: dict) -> dict:
        out = {"dp_mechanism": params.mechanism}
        for cid in sim.cohort(round_idx):
            participations[int(cid)] += 1
        if params.mechanism == "clip":
            return out
        worst, worst_client = 0.0, -1
        for cid in np.nonzero(participations)[0]:
            n_c = int(counts[cid])
            q = min(1.0, batch / n_c) if t.algorithm == "fedavg" else 1.0
            steps = epochs * math.ceil(n_c / batch) * int(participations[cid])
            eps = epsilon_of(round(q, 12), steps)
            if eps > worst:
                worst, worst_client = eps, int(cid)
        out.update(epsilon=worst, delta=float(delta), epsilon_client=worst_client)
        return out

    sim.round_callbacks.append(callback)
    sim._dp_accountant_attached = True
    return True


# Every Simulation whose example-stage defense is a DP defense reports ε.
register_simulation_plugin(attach_accountant)
