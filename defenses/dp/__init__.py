"""Differential-privacy defenses (issue 5).

Example stage (per-example gradients [B, ...] -> one gradient):
  dp_gaussian(noise_multiplier, clip_norm=1.0, clipping="flat"|"per_layer")  # 001 Alg 1
  dp_clip(clip_norm=1.0, clipping="per_layer")            # 001 Table II "clip"
  dp_vmf(kappa, clip_norm=1.0, clipping="flat")           # 001 Alg 2
  dp_psac(noise_multiplier, clip_norm=1.0, r=0.1)         # Xia et al. 2023
Upload stage (client update):
  update_gaussian(sigma), update_laplace(scale)           # Soteria baselines (003 §6.1)
  client_level_dp(clip_norm, noise_multiplier, clients_per_round)   # DP-FedAvg
  adaptive_client_level_dp(noise_multiplier, clients_per_round, ...)  # Andrew et al. 2021
Server side, in one's own JAX code:
  quantile_dp_fedavg(noise_multiplier, expected_clients_per_round, ...)   # Andrew et al. 2021
      DP-FedAvg whose clip norm tracks a private quantile of the update norms
Sampler:
  sample_vmf(key, mu, kappa, num=None), sample_vmf_cosine(key, kappa, dim, num)
Accounting:
  attach_accountant(sim, delta=None) -> per-round record-level ``epsilon``/``delta``
  attach_client_accountant(sim, delta=None) -> per-round user-level
      ``client_level_epsilon``/``client_level_delta`` (client_level_dp)
  attach_local_accountant(sim, delta=None) -> per-round local-DP
      ``local_epsilon``/``local_delta`` (update_gaussian/laplace with clip_norm)
  dp_parameters(defense, level="record"|"client"|"local") -> DPParameters | None
"""

from defenses.dp._params import DPParameters, dp_parameters
from defenses.dp.adaptive_clipping import (adaptive_client_level_dp, clip_to_quantile_estimate,
                                           quantile_dp_fedavg, update_noise_multiplier)
from defenses.dp.clipping import clip_examples, clip_layers
from defenses.dp.gaussian import dp_clip, dp_gaussian
from defenses.dp.psac import dp_psac, psac_weights
from defenses.dp.update_noise import client_level_dp, update_gaussian, update_laplace
from defenses.dp.vmf import dp_vmf, sample_vmf, sample_vmf_cosine, wood_constants

__all__ = [
    "DPParameters", "dp_parameters", "clip_examples", "clip_layers", "dp_clip",
    "dp_gaussian", "dp_psac", "psac_weights", "client_level_dp", "update_gaussian",
    "update_laplace", "dp_vmf", "sample_vmf", "sample_vmf_cosine", "wood_constants",
    "quantile_dp_fedavg", "clip_to_quantile_estimate", "update_noise_multiplier",
    "adaptive_client_level_dp",
]

from defenses.dp.accountant_hook import attach_accountant  # noqa: E402  (registers the plugin)
from defenses.dp.client_accountant import attach_client_accountant  # noqa: E402  (likewise)
from defenses.dp.local_accountant import attach_local_accountant  # noqa: E402  (likewise)

__all__ += ["attach_accountant", "attach_client_accountant", "attach_local_accountant"]
