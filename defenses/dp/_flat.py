"""Flatten per-example gradient pytrees to one [B, P] matrix and back.

DP mechanisms act on the whole flattened gradient (001 §VI: "single flattened
gradients"), and drawing noise in ONE ``jax.random`` call over all P
coordinates keeps compile time low (one draw per leaf costs seconds of XLA
compile per leaf on CPU).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fedsim.typing import PyTree


def flatten_batched(tree: PyTree) -> tuple[jax.Array, callable]:
    """Ravel every leaf [B, ...] of ``tree`` into a [B, P] matrix.

    Returns:
      (matrix [B, P], unflatten) where ``unflatten(v)`` maps a [P] vector back
      to an UNbatched pytree with the leaves' shapes and dtypes.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        raise ValueError("flatten_batched: empty gradient pytree")
    batch = leaves[0].shape[0]
    for leaf in leaves:
        if leaf.ndim == 0 or leaf.shape[0] != batch:
            raise ValueError(
                f"per-example gradients must share a leading batch dimension {batch}; "
                f"got a leaf of shape {leaf.shape}")
    shapes = [leaf.shape[1:] for leaf in leaves]
    dtypes = [leaf.dtype for leaf in leaves]
    sizes = [math.prod(s) for s in shapes]
    matrix = jnp.concatenate([leaf.reshape(batch, -1).astype(jnp.float32) for leaf in leaves],
                             axis=1)

    def unflatten(vector: jax.Array) -> PyTree:
        parts, start = [], 0
        for shape, dtype, size in zip(shapes, dtypes, sizes):
            parts.append(vector[start:start + size].reshape(shape).astype(dtype))
            start += size
        return jax.tree_util.tree_unflatten(treedef, parts)

    return matrix, unflatten


def layer_segments(tree: PyTree) -> jax.Array:
    """int32 [P]: the index of the leaf (layer tensor) each flat coordinate belongs to."""
    leaves = jax.tree_util.tree_leaves(tree)
    sizes = [math.prod(leaf.shape[1:]) for leaf in leaves]
    # Static (numpy) so that it is a constant under jit.
    return jnp.asarray(np.repeat(np.arange(len(sizes), dtype=np.int32), sizes))


def real_count(mask: jax.Array | None, batch: int) -> jax.Array:
    """The number of real examples (Alg 1 divides by it), at least 1."""
    if mask is None:
        return jnp.asarray(float(batch), jnp.float32)
    return jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
