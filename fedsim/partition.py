"""Seeded, pure partitions of a dataset's training split over clients.

Each function returns a list of int64 index arrays, one per client, covering
every training example at most once (exactly once for ``iid``, ``dirichlet``,
``shards`` without a per-client cap, and ``natural``). :func:`pad_indices`
turns them into the padded index matrix the engine gathers from.
"""

from __future__ import annotations

import numpy as np


def _check(num_clients: int, n: int) -> None:
    if not _is_int(num_clients) or num_clients < 1:
        raise ValueError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    if num_clients > n:
        raise ValueError(f"num_clients={num_clients} exceeds the {n} training examples")


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _labels(labels) -> np.ndarray:
    """``labels`` as an int [N] array.

    One-hot labels [N, C] used to pass: their 0/1 entries were read as two
    classes of N·C "examples", and ``dirichlet`` dealt out indices past N.

    Raises:
      ValueError: for labels that are not one integer per example.
    """
    arr = np.asarray(labels)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ValueError(f"labels must be one integer class per example, shape [N]; got "
                         f"{arr.dtype} of shape {arr.shape}"
                         + (" (one-hot? pass labels.argmax(-1))" if arr.ndim == 2 else ""))
    return arr


def iid(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """Shuffle all examples, then split them into near-equal parts."""
    labels = _labels(labels)
    _check(num_clients, len(labels))
    perm = np.random.default_rng(seed).permutation(len(labels))
    return [np.sort(p) for p in np.array_split(perm, num_clients)]


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, seed: int,
              min_size: int = 1, max_tries: int = 100) -> list[np.ndarray]:
    """Label-skewed split: each class is divided over clients by Dir(α) shares.

    Resamples (up to ``max_tries`` times) until every client has at least
    ``min_size`` examples.

    Raises:
      ValueError: if α ≤ 0 or no draw gives every client ``min_size`` examples.
    """
    labels = _labels(labels)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.number)) \
            or not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"dirichlet alpha must be a finite number > 0, got {alpha!r}")
    _check(num_clients, len(labels))
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return out
    raise ValueError(f"dirichlet(alpha={alpha}): could not give each of {num_clients} clients "
                     f"{min_size} examples in {max_tries} draws; raise alpha or lower num_clients")


def shards(labels: np.ndarray, num_clients: int, classes_per_client: int, seed: int,
           examples_per_client: int | None = None) -> list[np.ndarray]:
    """McMahan et al. shards: sort by label, cut into ``num_clients × k`` shards.

    Each client gets ``classes_per_client`` shards, so it sees at most about that
    many classes, not exactly: shards are dealt at random, so two of a
    client's shards can come from one class (it then holds fewer classes), and
    a shard straddling a class boundary adds one. With ``examples_per_client``
    each client keeps at most that many examples, split evenly over its shards
    (fewer where the shards are smaller: N / (num_clients × k) examples each).
    Soteria (paper 003 §6.1) gives each device 2 random, distinct classes of
    100 samples each; this partition approximates it.
    """
    labels = _labels(labels)
    _check(num_clients, len(labels))
    if not _is_int(classes_per_client) or classes_per_client < 1:
        raise ValueError(f"classes_per_client must be an integer >= 1, got "
                         f"{classes_per_client!r}")
    rng = np.random.default_rng(seed)
    # Stable sort after a shuffle: random order inside each class.
    perm = rng.permutation(len(labels))
    order = perm[np.argsort(labels[perm], kind="stable")]
    num_shards = num_clients * classes_per_client
    pieces = np.array_split(order, num_shards)
    assign = rng.permutation(num_shards).reshape(num_clients, classes_per_client)
    out = []
    for row in assign:
        if examples_per_client is None:
            out.append(np.sort(np.concatenate([pieces[s] for s in row])))
        else:
            per = np.array_split(np.arange(examples_per_client), classes_per_client)
            out.append(np.sort(np.concatenate([pieces[s][: len(q)] for s, q in zip(row, per)])))
    return out


def natural(groups: np.ndarray, num_clients: int | None = None,
            seed: int | None = None) -> list[np.ndarray]:
    """One client per natural id (writer, identity); a seeded subset if asked.

    Args:
      groups: int [N] natural id of each example.
      num_clients: keep this many ids, drawn with ``seed`` (which it then
        needs); None keeps every id, in order.
      seed: the draw's seed (a run passes its own).

    Raises:
      ValueError: if the dataset has no natural ids, or a subset is asked for
        without a seed.
    """
    if groups is None:
        raise ValueError("partition 'natural' needs a dataset with writer/identity ids "
                         "(this dataset has none); use iid, dirichlet or shards")
    ids = np.unique(groups)
    if num_clients is not None:
        if not _is_int(num_clients) or num_clients < 1:
            raise ValueError(f"num_clients must be an integer >= 1 (or None: every id), got "
                             f"{num_clients!r}")
        if num_clients > len(ids):
            raise ValueError(f"num_clients={num_clients} exceeds the {len(ids)} natural ids")
        if seed is None:
            raise ValueError(f"natural(num_clients={num_clients}) draws its subset of the "
                             f"{len(ids)} natural ids with seed=, which is missing")
        ids = np.sort(np.random.default_rng(seed).choice(ids, num_clients, replace=False))
    return [np.flatnonzero(groups == i) for i in ids]


def pad_indices(parts: list[np.ndarray], n_max: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Padded index matrix int32 [N, n_max] (−1 = padding) and counts int32 [N].

    Clients with more than ``n_max`` examples keep their first ``n_max``.
    """
    counts = np.array([len(p) for p in parts])
    n_max = int(counts.max()) if n_max is None else int(n_max)
    idx = np.full((len(parts), n_max), -1, dtype=np.int32)
    for i, p in enumerate(parts):
        idx[i, : min(len(p), n_max)] = p[:n_max]
    return idx, np.minimum(counts, n_max).astype(np.int32)
