"""Named random-key streams that never collide with the engine's own.

The engine derives every key of a run from ``jax.random.key(seed)``: the initial
model from ``fold_in(key, ENGINE_INIT)`` and round r from
``fold_in(fold_in(key, ENGINE_ROUNDS), r)`` (see :mod:`fedsim.simulation`).
Work done beside a simulation with the same seed (a benchmark's masks, victims'
dummies, an attack's restarts) needs keys of its own. ``split(key(seed))`` is
not one: with JAX's partitionable threefry, ``split(k)[i]`` *is*
``fold_in(k, i)``, so it hands out the engine's init and round keys again.

:func:`experiment_key` folds a name's CRC-32 into the seed's key, shifted past
the engine's streams, so a named stream is disjoint from both of them and from
every other name (up to a CRC-32 collision between two names, which
:func:`experiment_key` cannot see; pick distinct, descriptive names).
"""

from __future__ import annotations

import zlib

import jax
import numpy as np

ENGINE_INIT = 0
ENGINE_ROUNDS = 1
_RESERVED = 2  # fold_in indices below this belong to the engine
_UINT32 = 2**32


def stream_index(name: str) -> int:
    """The ``fold_in`` index of stream ``name``: CRC-32 of its UTF-8 bytes, mapped
    into [2, 2³²) so it is never one of the engine's indices (0, 1).

    Raises:
        ValueError: ``name`` is empty or not a string.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a key stream needs a non-empty name, got {name!r}")
    return _RESERVED + zlib.crc32(name.encode()) % (_UINT32 - _RESERVED)


def experiment_key(seed: int, name: str) -> jax.Array:
    """The key of stream ``name`` for a run with seed ``seed``.

    Same (seed, name) → same key; it never equals the engine's init key or a
    round's key for that seed, nor (CRC-32 collisions aside) another name's.
    Derive what a stream needs from it by ``split``/``fold_in``, as usual.

    Args:
        seed: the run's seed (``cfg.seed``).
        name: what the stream is for, e.g. ``"chu2023/A/masks"``.
    """
    return jax.random.fold_in(jax.random.key(seed), stream_index(name))


def numpy_generator(seed: int, name: str) -> np.random.Generator:
    """A NumPy generator for stream ``name`` of a run with seed ``seed``.

    Its entropy is (seed, :func:`stream_index` of ``name``), so it never shares
    its draws with ``np.random.default_rng(seed)`` (which the partitions in
    :mod:`fedsim.partition` use) nor with another name's generator.

    Args:
        seed: the run's seed.
        name: what the draws are for, e.g. ``"chu2023/A/victims"``.
    """
    return np.random.default_rng([seed, stream_index(name)])


def require_key(key, who: str) -> None:
    """Refuse a missing or malformed key before JAX does, naming who needed it.

    JAX's own messages ("unexpected PRNG key type <class 'NoneType'>") do not
    say which of a chain of defenses drew from the key nor what to pass. Under
    ``jit`` a key is a tracer with a dtype, and passes; only its kind is
    checked here, JAX checks a raw key's shape.

    Args:
      key: what the caller passed: a typed key (``jax.random.key``) or a raw
        uint32 key (``jax.random.PRNGKey``) is accepted.
      who: the randomised step, e.g. the defense's name, for the message.

    Raises:
      TypeError: ``key`` is None, not an array, or an array of another dtype.
    """
    hint = "pass key=jax.random.key(seed), split afresh for every call"
    if key is None:
        raise TypeError(f"{who} draws random numbers and needs a key; got key=None ({hint})")
    dtype = getattr(key, "dtype", None)
    if dtype is None:
        raise TypeError(f"{who} needs a JAX random key; got a {type(key).__name__} ({hint})")
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) or dtype == np.uint32:
        return
    raise TypeError(f"{who} needs a JAX random key; got an array of dtype {dtype} and shape "
                    f"{tuple(np.shape(key))} ({hint})")
