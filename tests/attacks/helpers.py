"""Shared set-up for the attack tests."""

import jax
import jax.numpy as jnp
import optax

from fedsim.client import masked_mean_loss


def train_full_batch(apply_fn, params, x, y, *, steps: int, lr: float = 1e-2):
    """Train `params` with Adam on all of (x, y) for `steps` full-batch steps (one jitted scan)."""
    tx = optax.adam(lr)
    weights = jnp.ones(len(y))

    @jax.jit
    def train(p):
        def step(carry, _):
            p, s = carry
            g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, p, x, y, weights)
            u, s = tx.update(g, s, p)
            return (optax.apply_updates(p, u), s), None
        return jax.lax.scan(step, (p, tx.init(p)), None, length=steps)[0][0]

    return train(params)
