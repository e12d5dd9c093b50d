"""Checks that a benchmark's keys are not another run's keys.

A reproduction that derives keys from raw seed offsets (``key(seed + 17)``)
or from indices the engine owns (``fold_in(key(seed), 1)``) hands out keys
that a run with another seed, or the engine itself, also uses. These helpers
write the engine's derivation out independently of ``fedsim.simulation``
(root ``key(s)``, init ``fold_in(root, 0)``, rounds root ``fold_in(root, 1)``
and round r ``fold_in(rounds root, r)``) for many seeds at once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def key_bytes(key) -> bytes:
    """A typed key's raw data as bytes (hashable, comparable)."""
    return np.asarray(jax.random.key_data(key)).tobytes()


def run_keys(max_seed: int = 1000, rounds: int = 64) -> set[bytes]:
    """The root, init, rounds-root and first ``rounds`` round keys of seeds
    ``0 .. max_seed - 1``: what a raw seed offset or an engine index collides with."""
    roots = jax.vmap(jax.random.key)(jnp.arange(max_seed))
    fold = jax.vmap(jax.random.fold_in, in_axes=(0, None))
    init, rounds_root = fold(roots, 0), fold(roots, 1)
    found = [roots, init, rounds_root] + [fold(rounds_root, r) for r in range(rounds)]
    out = set()
    for keys in found:
        data = np.asarray(jax.random.key_data(keys))
        out.update(row.tobytes() for row in data)
    return out


def assert_fresh(keys, taken: set[bytes], what: str) -> None:
    """Fail naming ``what`` if any of ``keys`` is in ``taken`` or two are equal."""
    seen = [key_bytes(k) for k in keys]
    clash = [i for i, b in enumerate(seen) if b in taken]
    assert not clash, f"{what}: keys {clash} are another run's root/engine keys"
    assert len(set(seen)) == len(seen), f"{what}: the same key is handed out twice"
