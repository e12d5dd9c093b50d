"""Second-order statistics of a client's (or a dataset's) inputs: Σ_D and its eigenbasis.

The data-space channels of Tan et al. (000, §5.2) calibrate their noise from
the covariance Σ_D of the flattened inputs D ∈ R^d. It needs the whole data,
not one batch, so it is computed once on the host (float64 numpy, outside any
jit) and closed over by the defense factories.

Per-dataset vs per-client: the paper's D is "the local dataset" of a client.
:func:`data_statistics` accepts any array, so a caller may pass one client's
data (per-client channel) or the whole training split (per-dataset channel,
the default of the config path: one Σ_D shared by every client, which keeps the
defense state empty and the noise identical in law for all clients).
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import numpy as np

# Eigenvalues below this fraction of the largest are round-off of a singular
# covariance (e.g. constant border pixels) and are set to exactly 0.
from defenses.bounds._channel_capacity import EIGENVALUE_RTOL as _EIG_RTOL

__all__ = ["DataStatistics", "data_statistics", "dataset_statistics", "resolve_statistics"]


class DataStatistics(NamedTuple):
    """Σ_D of flattened inputs and its eigen-decomposition (float64).

    Attributes:
      shape: the shape of one example (e.g. (32, 32, 1)); d = prod(shape).
      num_examples: how many examples the statistics come from.
      mean: [d] the data mean μ_D.
      covariance: [d, d] the sample covariance Σ_D (divisor N − 1).
      eigenvalues: [d] eigenvalues λ_i ≥ 0 of Σ_D, descending.
      eigenvectors: [d, d] orthonormal Q, column i is the eigenvector of λ_i,
        so Σ_D = Q diag(λ) Qᵀ.
    """

    shape: tuple[int, ...]
    num_examples: int
    mean: np.ndarray
    covariance: np.ndarray
    eigenvalues: np.ndarray
    eigenvectors: np.ndarray

    @property
    def dim(self) -> int:
        return int(np.prod(self.shape))


def data_statistics(x, *, max_examples: int | None = None) -> DataStatistics:
    """Σ_D and its eigen-decomposition from examples x [N, ...].

    Args:
      x: inputs [N, ...] (numpy or jax array), N ≥ 2.
      max_examples: use only the first ``max_examples`` examples.

    Returns:
      :class:`DataStatistics`.

    Raises:
      ValueError: if x has fewer than 2 examples or non-finite values.
    """
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"data must be [N, ...] with one row per example, got shape {x.shape}")
    if max_examples is not None:
        if int(max_examples) < 2:
            raise ValueError(f"max_examples must be >= 2, got {max_examples}")
        x = x[: int(max_examples)]
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"data needs at least 2 examples to estimate a covariance, got {n}")
    flat = x.reshape(n, -1).astype(np.float64)
    if not np.all(np.isfinite(flat)):
        raise ValueError("data contains NaN or Inf values")
    mean = flat.mean(axis=0)
    centred = flat - mean
    cov = centred.T @ centred / (n - 1)
    lam, q = np.linalg.eigh(cov)
    order = np.argsort(lam)[::-1]
    lam, q = lam[order], q[:, order]
    lam = np.where(lam > _EIG_RTOL * max(lam[0], 1e-300), lam, 0.0)
    return DataStatistics(tuple(x.shape[1:]), n, mean, cov, lam, q)


@functools.lru_cache(maxsize=8)
def dataset_statistics(name: str, image_size: int | None = None, *,
                       max_examples: int | None = None, normalize: bool = False,
                       source: str = "auto", data_dir: str | None = None,
                       seed: int | None = None) -> DataStatistics:
    """Σ_D of a named dataset's training split (cached per argument tuple).

    Args:
      name: dataset name for :func:`fedsim.data.load_dataset`.
      image_size: resize as the simulation does (``data.image_size``).
      max_examples: use the first ``max_examples`` training examples.
      normalize: standardise per channel as ``data.normalize: true`` does; must
        match the simulation's setting, or Σ_D describes other inputs.
      source, data_dir: where to load it from (``data.source``, ``data.data_dir``).
      seed: the seed of the ``synthetic`` dataset (a run's ``seed``), which it
        needs; real datasets do not depend on it.

    Raises:
      ValueError: for ``synthetic`` without a seed.
    """
    from fedsim.data import load_dataset

    if name == "synthetic" and seed is None:
        raise ValueError("dataset_statistics('synthetic') needs seed= (its examples are drawn "
                         "from it; a run's Σ_D is that of its own seed)")
    ds = load_dataset(name, image_size=image_size, max_train=max_examples, source=source,
                      data_dir=data_dir, seed=seed)
    x = ds.x_train
    if normalize:
        x = (x - ds.mean) / ds.std
    return data_statistics(x)


def _check_loading(who, *, dataset, image_size, max_examples, normalize, source, data_dir,
                   dataset_seed) -> None:
    """Refuse loading settings of the wrong type by name.

    They used to be coerced: ``normalize: abc`` read as true, a negative
    ``max_examples`` dropped the last examples, a list ``data_dir`` was named
    as a directory, a bool ``dataset_seed`` drew seed 1.
    """
    def integer(value, low):
        return (isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
                and value >= low)

    problems = []
    if not isinstance(dataset, str):
        problems.append(f"dataset must be a dataset name (a string), got {dataset!r}")
    if image_size is not None and not integer(image_size, 1):
        problems.append(f"image_size must be an integer >= 1 or null, got {image_size!r}")
    if max_examples is not None and not integer(max_examples, 2):
        problems.append(f"max_examples must be an integer >= 2 or null, got {max_examples!r}")
    if not isinstance(normalize, (bool, np.bool_)):
        problems.append(f"normalize must be true or false, got {normalize!r}")
    if not isinstance(source, str):
        problems.append(f"source must be a string, got {source!r}")
    if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
        problems.append(f"data_dir must be a path or null, got {data_dir!r}")
    if dataset_seed is not None and not integer(dataset_seed, 0):
        problems.append(f"dataset_seed must be an integer >= 0 or null, got {dataset_seed!r}")
    if problems:
        raise ValueError(f"{who}: " + "; ".join(problems))


def resolve_statistics(*, statistics=None, data=None, dataset=None, image_size=None,
                       max_examples=None, normalize=False, source="auto", data_dir=None,
                       dataset_seed=None, who="channel") -> DataStatistics:
    """Exactly one of ``statistics``, ``data`` or ``dataset`` → :class:`DataStatistics`.

    ``image_size``, ``max_examples``, ``normalize``, ``source``, ``data_dir`` and
    ``dataset_seed`` say how to load ``dataset`` (:func:`dataset_statistics`).

    Raises:
      ValueError: if none or several are given, or ``dataset="synthetic"``
        without ``dataset_seed`` (naming the defense ``who``).
    """
    given = [k for k, v in (("statistics", statistics), ("data", data), ("dataset", dataset))
             if v is not None]
    if len(given) != 1:
        raise ValueError(f"{who}: give exactly one of statistics=, data= or dataset= "
                         f"(the inputs whose covariance Σ_D calibrates the noise); got "
                         f"{given or 'none'}")
    if statistics is not None:
        if not isinstance(statistics, DataStatistics):
            raise ValueError(f"{who}: statistics must be a DataStatistics "
                             f"(from data_statistics), got {type(statistics).__name__}")
        return statistics
    if data is not None:
        return data_statistics(data, max_examples=max_examples)
    _check_loading(who, dataset=dataset, image_size=image_size, max_examples=max_examples,
                   normalize=normalize, source=source, data_dir=data_dir,
                   dataset_seed=dataset_seed)
    if str(dataset) == "synthetic" and dataset_seed is None:
        # Σ_D of seed 0's synthetic data would calibrate a run of another seed.
        raise ValueError(f"{who}: dataset 'synthetic' needs dataset_seed= (its examples are "
                         f"drawn from it; a config spec naming the run's dataset gets the "
                         f"run's seed)")
    return dataset_statistics(str(dataset), image_size, max_examples=max_examples,
                              normalize=bool(normalize), source=str(source),
                              data_dir=None if data_dir is None else str(data_dir),
                              seed=None if dataset_seed is None else int(dataset_seed))
