"""Server side: cohort sampling, weighted aggregation, the server optimizer.

Plain FedAvg is the server optimizer SGD(lr = 1) applied to the pseudo-gradient
−Δ̄ (McMahan et al. 2017); FedAdam etc. are other optax optimizers on the same
pseudo-gradient (Reddi et al. 2021).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedsim.typing import Params, PRNGKey, Updates

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam", "yogi", "adagrad")


def sample_cohort(key: PRNGKey, num_clients: int, cohort_size: int) -> jax.Array:
    """Uniform sample of ``cohort_size`` distinct client ids (sorted), int32 [C]."""
    ids = jax.random.choice(key, num_clients, (cohort_size,), replace=False)
    return jnp.sort(ids).astype(jnp.int32)


def weighted_sum(updates: Updates, weights: jax.Array) -> Updates:
    """Σ_c w_c Δ_c over the leading (client) axis of every leaf."""
    return jax.tree_util.tree_map(lambda u: jnp.tensordot(weights, u, axes=1), updates)


def aggregate(updates: Updates, weights: jax.Array) -> Updates:
    """Weighted mean Σ_c w_c Δ_c / Σ_c w_c over the leading client axis.

    Args:
      updates: pytree with leaves [C, ...].
      weights: float32 [C], e.g. the clients' example counts (FedAvg).
    """
    total = jnp.maximum(jnp.sum(weights), 1e-12)
    return jax.tree_util.tree_map(lambda s: s / total, weighted_sum(updates, weights))


def make_server_optimizer(name: str, lr: float, **kwargs) -> optax.GradientTransformation:
    """The optax optimizer applied to the pseudo-gradient −Δ̄."""
    if name == "sgd":
        return optax.sgd(lr)
    if name == "momentum":
        return optax.sgd(lr, momentum=kwargs.get("momentum", 0.9))
    if name == "adam":
        return optax.adam(lr, b1=kwargs.get("b1", 0.9), b2=kwargs.get("b2", 0.99),
                          eps=kwargs.get("eps", 1e-3))
    if name == "yogi":
        return optax.yogi(lr, eps=kwargs.get("eps", 1e-3))
    if name == "adagrad":
        return optax.adagrad(lr, eps=kwargs.get("eps", 1e-3))
    raise ValueError(f"unknown server optimizer {name!r}; allowed: {', '.join(SERVER_OPTIMIZERS)}")


def server_update(tx: optax.GradientTransformation, params: Params, opt_state, mean_delta: Updates):
    """Apply the server optimizer to the pseudo-gradient −Δ̄."""
    pseudo_grad = jax.tree_util.tree_map(jnp.negative, mean_delta)
    updates, opt_state = tx.update(pseudo_grad, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
