"""Privacy accountants for DP-SGD with Gaussian and VMF noise.

Composition convention (important): every accountant takes exactly one of
``steps=T`` (standard DP-SGD accounting, one composition per noisy step;
T = steps_for_epochs(epochs, sample_rate)) or ``compositions=N`` (the
convention of Biswas et al. 001, Table I/IV: one composition per *epoch*,
N = 3). The per-step one is the default that library code should use; the
per-epoch one exists to reproduce the paper and is labelled as such in every
result (``PrivacyGuarantee.convention``).

Signatures:

Gaussian (via dp_accounting):
  gaussian_epsilon(noise_multiplier, sample_rate, delta, *, steps=None,
                   compositions=None, accountant="rdp"|"pld") -> PrivacyGuarantee
  gaussian_rdp(noise_multiplier, sample_rate, orders, *, steps=None,
               compositions=None) -> ndarray
  gaussian_noise_for_epsilon(target_epsilon, sample_rate, delta, *, steps=None,
                             compositions=None, accountant="rdp", tol=1e-4) -> float
  gaussian_rdp_unsampled(noise_multiplier, orders) -> ndarray   # alpha/(2 sigma^2)

DP-FedAvg (user level, McMahan et al. 2018):
  dp_fedavg_epsilon(noise_multiplier, sample_rate, delta, *, sampled_rounds,
                    certain_rounds=0, accountant="rdp"|"pld") -> PrivacyGuarantee
  dp_fedavg_event(noise_multiplier, sample_rate, *, sampled_rounds,
                  certain_rounds=0) -> DpEvent

VMF (001 §III-A):
  vmf_rdp(kappa, dim, orders) -> ndarray                         # Prop 1
  vmf_kl_bound(kappa, dim) -> float
  multivariate_vmf_rdp(kappas, dims, orders) -> ndarray          # Prop 2
  vmf_epsilon(kappa, dim, sample_rate, delta, *, steps=None, compositions=None,
              max_order=512, fractional_orders=False, delta_split=None)
      -> PrivacyGuarantee   # best of approaches 1 and 2, .approach in {"1","2"}

Building blocks:
  rdp_to_epsilon(orders, rdp, delta) -> (eps, alpha)             # Prop 4
  rdp_to_delta(rdp_fn, epsilon, *, max_order=1e4) -> (delta, alpha)  # Eq 8
  subsample_dp(epsilon, delta, sample_rate) -> (eps_s, delta_s)  # Eq 9
  kairouz_composition(epsilon, delta, count, delta_slack) -> (eps, delta)  # Thm 2
  poisson_subsampled_rdp(rdp_int, sample_rate) -> ndarray        # Thm 3 (Zhu & Wang)
  subsampled_kl_bound(kl, sample_rate) -> float
  interpolate_rdp(rdp_int, orders, *, method="holder"|"paper") -> ndarray
  approach_one(rdp_fn, sample_rate, count, delta, ...) -> (eps, alpha)
  approach_two(rdp_fn, sample_rate, count, delta, ...) -> (eps, alpha)
  resolve_compositions(steps=None, compositions=None) -> (count, convention)
  steps_for_epochs(epochs, sample_rate) -> int
  log_bessel_iv(nu, x) -> ndarray; bessel_iv_ratio(nu, x) -> ndarray

Bayes capacity and the information bounds live in :mod:`defenses.bounds`.
The CLI (``privacy`` sub-command) is :mod:`defenses.accounting.cli`.
"""

from defenses.accounting._amplification import (
    interpolate_rdp,
    poisson_subsampled_rdp,
    subsample_dp,
    subsampled_kl_bound,
)
from defenses.accounting._approaches import approach_one, approach_two
from defenses.accounting._bessel import bessel_iv_ratio, log_bessel_iv
from defenses.accounting._composition import (
    PER_EPOCH_PAPER,
    PER_STEP,
    kairouz_composition,
    resolve_compositions,
    steps_for_epochs,
)
from defenses.accounting._dp_fedavg import dp_fedavg_epsilon, dp_fedavg_event
from defenses.accounting._gaussian import (
    gaussian_epsilon,
    gaussian_event,
    gaussian_noise_for_epsilon,
    gaussian_rdp,
    gaussian_rdp_unsampled,
)
from defenses.accounting._rdp_conversion import rdp_to_delta, rdp_to_epsilon
from defenses.accounting._result import PrivacyGuarantee
from defenses.accounting._vmf import multivariate_vmf_rdp, vmf_kl_bound, vmf_rdp
from defenses.accounting._vmf_accountant import vmf_epsilon

__all__ = [
    "PrivacyGuarantee",
    "PER_STEP",
    "PER_EPOCH_PAPER",
    "resolve_compositions",
    "steps_for_epochs",
    "gaussian_epsilon",
    "gaussian_event",
    "gaussian_rdp",
    "gaussian_rdp_unsampled",
    "gaussian_noise_for_epsilon",
    "dp_fedavg_epsilon",
    "dp_fedavg_event",
    "vmf_rdp",
    "vmf_kl_bound",
    "multivariate_vmf_rdp",
    "vmf_epsilon",
    "rdp_to_epsilon",
    "rdp_to_delta",
    "subsample_dp",
    "kairouz_composition",
    "poisson_subsampled_rdp",
    "subsampled_kl_bound",
    "interpolate_rdp",
    "approach_one",
    "approach_two",
    "log_bessel_iv",
    "bessel_iv_ratio",
]
