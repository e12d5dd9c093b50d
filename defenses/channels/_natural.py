"""Natural channel (Tan et al. 000, §5.2): D̃ = D + N(0, σ I) with f(σ) = κ."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from defenses.bounds import channel_capacity, natural_channel_sigma
from defenses.channels._noise import additive_data_channel, check_kappa
from defenses.channels._guarantee import ChannelGuarantee
from defenses.channels._statistics import DataStatistics, resolve_statistics
from fedsim import random_draws
from fedsim.hooks import Defense, register_defense

__all__ = ["natural_channel", "natural_noise_variance"]


def natural_noise_variance(statistics: DataStatistics, kappa: float) -> float:
    """σ of the Natural channel: the root of f(σ) = ½ Σ ln((λ_i + σ)/σ) = κ.

    Bisection (:func:`defenses.bounds.natural_channel_sigma`) on the
    eigenvalues of Σ_D. The realised capacity f(σ) equals κ to 1e-9 nats.
    """
    kappa = check_kappa(kappa, "natural_channel")
    return natural_channel_sigma(statistics.eigenvalues, kappa)


@register_defense("natural_channel")
def natural_channel(kappa: float, *, statistics: DataStatistics | None = None, data=None,
                    dataset: str | None = None, image_size: int | None = None,
                    max_examples: int | None = None, normalize: bool = False,
                    source: str = "auto", data_dir: str | None = None,
                    dataset_seed: int | None = None) -> Defense:
    """Natural channel: add isotropic Gaussian noise N(0, σ I) to every input.

    Implements Tan et al. (000) §5.2 "Natural Channel", steps 1–3: eigen-
    decompose Σ_D, solve f(σ) = κ (Eq. 18) by bisection, D̃ = D + ξ,
    ξ ~ N(0, σ I). Stage "data": fresh noise at every local step.

    Guarantee: I(D; D̃) ≤ f(σ) = κ nats per use of the channel (Thm 2 applied
    in data space), hence by the data-processing inequality (Eq. 16) the update
    of one local step leaks at most κ about D given the received model, and n
    steps leak at most n·κ. The bound is tight when D is Gaussian; it
    describes one example's D (the paper's D, "the data distribution").

    Args:
      kappa: channel capacity threshold κ > 0, in nats.
      statistics: precomputed :class:`DataStatistics` (Σ_D), or
      data: inputs [N, ...] to estimate Σ_D from (one client's data for a
        per-client channel, the training split for a per-dataset one), or
      dataset: a dataset name; Σ_D from its training split (per-dataset),
        resized to ``image_size`` and standardised if ``normalize`` (match
        the simulation's ``data.*`` settings).
      image_size, max_examples, normalize: see ``dataset``.
      source, data_dir, dataset_seed: how ``dataset`` is loaded (``data.source``,
        ``data.data_dir``, and the run's ``seed``, which only the ``synthetic``
        dataset depends on). A simulation fills these, ``image_size`` and
        ``normalize`` from its ``data`` config where the spec names its own
        dataset and leaves them out (:func:`fedsim.simulation.on_run_data`).

    Returns:
      A stage-"data" :class:`~fedsim.hooks.Defense` named "natural_channel(kappa=κ)"
        (κ in the name, so a checkpoint can tell channels apart).

    Raises:
      ValueError: kappa ≤ 0, no/ambiguous data source, or (at apply time)
        inputs of another shape than Σ_D's.
    """
    kappa = check_kappa(kappa, "natural_channel")
    stats = resolve_statistics(statistics=statistics, data=data, dataset=dataset,
                               image_size=image_size, max_examples=max_examples,
                               normalize=normalize, source=source,
                               data_dir=data_dir, dataset_seed=dataset_seed, who="natural_channel")
    sigma = natural_noise_variance(stats, kappa)
    std = float(np.sqrt(sigma))
    d = stats.dim

    def sample(key, b):
        return std * random_draws.normal(key, (b, d), jnp.float32)

    return additive_data_channel(f"natural_channel(kappa={kappa:g})", stats.shape, sample,
                                 guarantee=ChannelGuarantee(kappa, stats))


def natural_capacity(statistics: DataStatistics, sigma: float) -> float:
    """f(σ) of Eq. 18 for the given Σ_D (nats)."""
    return channel_capacity(statistics.eigenvalues, sigma)
