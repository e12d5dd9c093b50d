"""Eigen-compression (Tan et al. 000, §5.3 "Compression", Fig. 7–8, App. D)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from defenses.channels._statistics import DataStatistics, resolve_statistics
from fedsim.hooks import Defense, register_defense

__all__ = ["eigen_compression", "component_index"]


def component_index(component) -> int:
    """Rank (0 = largest eigenvalue) of a component name: "max" → 0, "1" / 1 → 1, 10 → 10.

    The paper's λ_max, λ_1, λ_10 are read as the eigenvalues of rank 0, 1
    and 10 in descending order (its Fashion-MNIST values 101.88 > 61.80 > 3.21
    are consistent with that reading).
    """
    if isinstance(component, str):
        c = component.strip().lower().removeprefix("lambda_").removeprefix("λ_")
        if c == "max":
            return 0
        try:
            component = int(c)
        except ValueError:
            raise ValueError(f"eigen_compression: component must be 'max' or a rank >= 0, got "
                             f"{component!r}") from None
    if isinstance(component, bool) or not isinstance(component, (int, np.integer)) or component < 0:
        raise ValueError(f"eigen_compression: component must be 'max' or a rank >= 0, got "
                         f"{component!r}")
    return int(component)


@register_defense("eigen_compression")
def eigen_compression(component="max", *, statistics: DataStatistics | None = None, data=None,
                      dataset: str | None = None, image_size: int | None = None,
                      max_examples: int | None = None, normalize: bool = False,
                      source: str = "auto", data_dir: str | None = None,
                      dataset_seed: int | None = None) -> Defense:
    """Remove the data's component along one eigenvector of Σ_D; train on the projection.

    D' = μ + (I − q qᵀ)(D − μ), q the eigenvector of the chosen eigenvalue.
    Implements the compression experiment of 000 App. D ("set the eigenvector
    to be 0 ... map the training data to the compressed eigenspace"; one
    dimension compressed). Deterministic (no key used).

    Guarantee (000 §5.3 via Thm 2): the compressed direction's term
    ½ ln((λ_i + σ)/σ) of the channel capacity becomes 0, so the capacity of
    any noisy channel on D' is lower by that term; larger λ_i removes more.
    No standalone bound (without noise the capacity is unbounded).

    Args:
      component: "max" (λ_max, rank 0) or an integer rank in the descending
        eigenvalue order (1 for λ_1, 10 for λ_10).
      statistics / data / dataset / image_size / max_examples / normalize /
        source / data_dir / dataset_seed:
        the source of Σ_D, as for :func:`defenses.channels.natural_channel`.

    Returns:
      A stage-"data" :class:`~fedsim.hooks.Defense` named "eigen_compression".

    Raises:
      ValueError: on a bad component or data source.
    """
    rank = component_index(component)
    stats = resolve_statistics(statistics=statistics, data=data, dataset=dataset,
                               image_size=image_size, max_examples=max_examples,
                               normalize=normalize, source=source,
                               data_dir=data_dir, dataset_seed=dataset_seed, who="eigen_compression")
    if rank >= stats.dim:
        raise ValueError(f"eigen_compression: component rank {rank} >= d = {stats.dim}")
    q = jnp.asarray(stats.eigenvectors[:, rank], jnp.float32)
    mu = jnp.asarray(stats.mean, jnp.float32)
    shape = stats.shape

    def init(params):
        del params
        return ()

    def apply(x, state, *, key=None, context=None):
        del key
        if tuple(x.shape[1:]) != tuple(shape):
            raise ValueError(f"eigen_compression: inputs have example shape "
                             f"{tuple(x.shape[1:])}, Σ_D was computed for {tuple(shape)}")
        flat = x.reshape(x.shape[0], -1)
        centred = flat - mu
        out = flat - jnp.outer(centred @ q, q)
        if context is not None and context.mask is not None:
            out = out * context.mask[:, None].astype(out.dtype)
        return out.reshape(x.shape).astype(x.dtype), state

    return Defense(init=init, apply=apply, stage="data", name="eigen_compression")
