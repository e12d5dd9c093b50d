"""Information bounds: Bayes capacity (001), channel capacities (000), PriPrune (002).

Plain numpy functions (they accept numpy or jax arrays; results are float64
numpy) for defenses and reports. Signatures:

Bayes capacity (Biswas et al., 001 §V), natural log:
  log_bayes_capacity_gaussian(sigma, radius, dim) -> float       # Thm 5
  log_bayes_capacity_vmf(kappa, dim) -> float                    # Thm 6

Channels (Tan et al., 000 §5), capacities in nats, sigma = noise *variance*:
  channel_capacity(eigenvalues, sigma) -> float                  # Thm 2, Eq 15
  natural_channel_sigma(eigenvalues, kappa, *, tol=1e-9) -> float
      # noise N(0, sigma I) with f(sigma) = kappa
  white_channel_sigmas(eigenvalues, kappa) -> ndarray            # Eq 19
      # sigma_i = lambda_i / (exp(2 kappa / d) - 1), d = #positive eigenvalues
  white_channel_covariance(covariance, kappa) -> ndarray         # Q Psi Q^T
  personalized_channel_sigma(eigenvalues_or_cov, beta, kappa, *, tol=1e-9,
                             jitter=0.0) -> float
      # noise N(0, sigma diag(beta)) with U(sigma) = kappa (Thm 3)
  personalized_channel_terms(eigenvalues_or_cov, beta, *, jitter=0.0)
      -> PersonalizedTerms(diag, u, k, beta)
  personalized_channel_bound(sigma, terms) -> float              # U(sigma)
  large_batch_channel_capacity(eigenvalues, sigma, batch_size) -> float  # Eq 22
  total_leakage_bound(kappa, rounds) -> float                    # n * kappa
  mse_lower_bound(entropy, mutual_information, dim) -> float     # Thm 1, Eq 5
  gaussian_entropy(eigenvalues) -> float
  dp_capacity_from_noise(batch_size, clip_norm, noise_variance) -> float   # Thm 4 (1)
  dp_capacity_from_epsilon(batch_size, epsilon, delta) -> float            # Thm 4 (2)

PriPrune (Chu et al., 002), in bits:
  priprune_leakage_bound(pruning_rate, batch_size, covariance=None, *,
                         logdet=None, dim=None, rounds=1) -> float  # Thm 1 / Cor 1

Every function validates its arguments and raises ValueError naming the bad
argument and its allowed range.
"""

from defenses.bounds._bayes_capacity import log_bayes_capacity_gaussian, log_bayes_capacity_vmf
from defenses.bounds._channel_capacity import (
    channel_capacity,
    large_batch_channel_capacity,
    natural_channel_sigma,
    total_leakage_bound,
    white_channel_covariance,
    white_channel_sigmas,
)
from defenses.bounds._dp_capacity import dp_capacity_from_epsilon, dp_capacity_from_noise
from defenses.bounds._mse_bound import gaussian_entropy, mse_lower_bound
from defenses.bounds._personalized import (
    PersonalizedTerms,
    personalized_channel_bound,
    personalized_channel_sigma,
    personalized_channel_terms,
)
from defenses.bounds._priprune import priprune_leakage_bound

__all__ = [
    "log_bayes_capacity_gaussian",
    "log_bayes_capacity_vmf",
    "channel_capacity",
    "natural_channel_sigma",
    "white_channel_sigmas",
    "white_channel_covariance",
    "large_batch_channel_capacity",
    "total_leakage_bound",
    "PersonalizedTerms",
    "personalized_channel_terms",
    "personalized_channel_bound",
    "personalized_channel_sigma",
    "mse_lower_bound",
    "gaussian_entropy",
    "dp_capacity_from_noise",
    "dp_capacity_from_epsilon",
    "priprune_leakage_bound",
]
