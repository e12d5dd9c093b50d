"""Flatten per-example gradient pytrees to [B, P] (or per-leaf [B, n]) and back.

DP mechanisms act on the whole flattened gradient (001 §VI: "single flattened
gradients"), and drawing noise in ONE ``jax.random`` call over all P
coordinates keeps compile time low (one draw per leaf costs seconds of XLA
compile per leaf on CPU).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fedsim.typing import PyTree


def batched_rows(tree: PyTree) -> tuple[list[jax.Array], callable]:
    """Ravel every leaf [B, ...] of ``tree`` into a float32 [B, n_leaf] block.

    Returns:
      (blocks, unflatten) where ``unflatten(v)`` maps a flat [P] vector (the
      blocks' columns in order, P = Σ n_leaf) back to an UNbatched pytree with
      the leaves' shapes and dtypes.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        raise ValueError("per-example gradients: the pytree has no leaves")
    batch = leaves[0].shape[0]
    for leaf in leaves:
        if leaf.ndim == 0 or leaf.shape[0] != batch:
            raise ValueError(
                f"per-example gradients must share a leading batch dimension {batch}; "
                f"got a leaf of shape {leaf.shape}")
    shapes = [leaf.shape[1:] for leaf in leaves]
    dtypes = [leaf.dtype for leaf in leaves]
    sizes = [math.prod(s) for s in shapes]
    blocks = [leaf.reshape(batch, -1).astype(jnp.float32) for leaf in leaves]

    def unflatten(vector: jax.Array) -> PyTree:
        parts, start = [], 0
        for shape, dtype, size in zip(shapes, dtypes, sizes):
            parts.append(vector[start:start + size].reshape(shape).astype(dtype))
            start += size
        return jax.tree_util.tree_unflatten(treedef, parts)

    return blocks, unflatten


def flatten_batched(tree: PyTree) -> tuple[jax.Array, callable]:
    """Ravel every leaf [B, ...] of ``tree`` into one [B, P] matrix.

    Returns:
      (matrix [B, P], unflatten) as in :func:`batched_rows`.
    """
    blocks, unflatten = batched_rows(tree)
    return jnp.concatenate(blocks, axis=1), unflatten


def check_mask(mask: jax.Array | None, batch: int, who: str = "") -> None:
    """Refuse a ``DefenseContext.mask`` that is not one entry per example.

    A mask of shape (1,) broadcast silently: the "mean" became the batch's sum
    (8× at B = 8); other shapes failed deep in a multiply.

    Raises:
      ValueError: unless the mask has shape (batch,).
    """
    if mask is not None and tuple(jnp.shape(mask)) != (batch,):
        raise ValueError(f"{who + ': ' if who else ''}context.mask must have shape ({batch},), "
                         f"one 0/1 entry per example "
                         f"of the batch; got shape {tuple(jnp.shape(mask))}")


def real_count(mask: jax.Array | None, batch: int) -> jax.Array:
    """The number of real examples (Alg 1 divides by it), at least 1."""
    if mask is None:
        return jnp.asarray(float(batch), jnp.float32)
    return jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
