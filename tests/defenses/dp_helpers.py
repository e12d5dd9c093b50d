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


def check_keyed_randomness(defense, tree, ctx, *, rtol, atol):
    """Assert a randomised defense is a function of its key, jit-stable, and key-sensitive.

    Same key → same output (eager), jitted == eager to (rtol, atol), another key → a
    different output. Returns the eager output for key 1 for further checks.
    """
    import chex
    import numpy as np

    state = defense.init(None)
    a, _ = defense.apply(tree, state, key=jax.random.key(1), context=ctx)
    b, _ = defense.apply(tree, state, key=jax.random.key(1), context=ctx)
    c, _ = defense.apply(tree, state, key=jax.random.key(2), context=ctx)
    j, _ = jax.jit(lambda t, k: defense.apply(t, state, key=k, context=ctx))(tree, jax.random.key(1))
    chex.assert_trees_all_close(a, b)
    chex.assert_trees_all_close(a, j, rtol=rtol, atol=atol)
    assert not np.allclose(a["w"], c["w"]), "a different key gave the same noise"
    return a
