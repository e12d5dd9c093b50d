"""Information-theoretic channel defenses of Tan et al. (000, USENIX Security 2024).

Data-space channels (stage "data", fresh noise at every local step), each
bounding I(D; D̃) ≤ κ nats per step and hence n·κ over n steps:

* :func:`natural_channel` — N(0, σ I), f(σ) = κ (§5.2, Eq. 18);
* :func:`white_channel` — N(0, Q Ψ Qᵀ), σ_i = λ_i/(e^{2κ/d} − 1) (Eq. 19);
* :func:`personalized_channel` — N(0, σ diag β), U(σ) = κ (Thm 3).

Also: :func:`parameter_channel` (Thm 2 in parameter space, the slow
baseline), :func:`eigen_compression` (App. D), the leakage ledger
(:func:`attach_leakage_ledger`) and the §6.1 metrics (:func:`imp_mia`,
:func:`imp_dra`, :func:`gdc`). The bounds themselves live in
:mod:`defenses.bounds`.
"""

from defenses.channels._compression import component_index, eigen_compression
from defenses.channels._guarantee import ChannelGuarantee
from defenses.channels._ledger import (
    CHANNEL_DEFENSES,
    LeakageLedger,
    attach_leakage_ledger,
    ledger_from_config,
    simulation_ledger,
    steps_per_participation,
)
from defenses.channels._metrics import gdc, imp_dra, imp_mia
from defenses.channels._natural import natural_capacity, natural_channel, natural_noise_variance
from defenses.channels._parameter_channel import (parameter_channel, solve_natural_log_sigma,
                                                  solve_natural_sigma)
from defenses.channels._personalized import (
    paper_prior_beta,
    personalized_channel,
    personalized_exact_capacity,
    personalized_noise_scale,
)
from defenses.channels._statistics import (
    DataStatistics,
    data_statistics,
    dataset_statistics,
    resolve_statistics,
)
from defenses.channels._white import white_channel, white_noise_variances

__all__ = [
    "DataStatistics", "data_statistics", "dataset_statistics", "resolve_statistics",
    "natural_channel", "natural_noise_variance", "natural_capacity",
    "white_channel", "white_noise_variances",
    "personalized_channel", "paper_prior_beta", "personalized_noise_scale",
    "personalized_exact_capacity",
    "eigen_compression", "component_index",
    "parameter_channel", "solve_natural_log_sigma", "solve_natural_sigma",
    "LeakageLedger", "attach_leakage_ledger", "simulation_ledger", "ledger_from_config",
    "steps_per_participation", "ChannelGuarantee",
    "CHANNEL_DEFENSES",
    "imp_mia", "imp_dra", "gdc",
]

from fedsim.hooks import register_simulation_plugin as _register_simulation_plugin


@_register_simulation_plugin
def _attach_ledger_plugin(sim) -> None:
    """Every Simulation that runs a channel defense (from its config or given by
    hand) gets a leakage ledger."""
    ledger = simulation_ledger(sim)
    if ledger is not None:
        sim.round_callbacks.append(ledger)
