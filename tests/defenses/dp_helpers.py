"""Shared fixtures for the DP defense tests."""

import jax
import jax.numpy as jnp

from fedsim.hooks import DefenseContext


def per_example_tree(key, batch=8, scale=3.0):
    """A per-example gradient pytree with two leaves of different shapes."""
    k1, k2 = jax.random.split(key)
    return {"w": scale * jax.random.normal(k1, (batch, 6, 5)),
            "v": scale * jax.random.normal(k2, (batch, 7))}


def context(mask):
    return DefenseContext(mask=jnp.asarray(mask, jnp.float32))


def flat_rows(tree):
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.concatenate([l.reshape(l.shape[0], -1) for l in leaves], axis=1)
