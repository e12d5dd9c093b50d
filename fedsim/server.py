"""Server side: cohort sampling, weighted aggregation, the server optimizer.

Plain FedAvg is the server optimizer SGD(lr = 1) applied to the pseudo-gradient
−Δ̄ (McMahan et al. 2017); FedAdam etc. are other optax optimizers on the same
pseudo-gradient (Reddi et al. 2021).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedsim.suggest import did_you_mean
from fedsim.typing import Params, PRNGKey, Updates
from fedsim.x64 import x64_invariant

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam", "yogi", "adagrad")
AGGREGATIONS = ("mean", "sender_mean")


def sample_cohort_order(key: PRNGKey, num_clients: int, cohort_size: int) -> jax.Array:
    """``cohort_size`` distinct client ids, uniform and in random order, int32 [C].

    :func:`sample_cohort` sorts the same draw; the order lets a caller thin the
    cohort uniformly (observed clients forced in, :meth:`Simulation.cohort`).
    """
    return jax.random.choice(key, num_clients, (cohort_size,), replace=False).astype(jnp.int32)


def sample_cohort(key: PRNGKey, num_clients: int, cohort_size: int) -> jax.Array:
    """Uniform sample of ``cohort_size`` distinct client ids (sorted), int32 [C]."""
    return jnp.sort(sample_cohort_order(key, num_clients, cohort_size))


def weighted_sum(updates: Updates, weights: jax.Array) -> Updates:
    """Σ_c w_c Δ_c over the leading (client) axis of every leaf."""
    return jax.tree_util.tree_map(lambda u: jnp.tensordot(weights, u, axes=1), updates)


def aggregate(updates: Updates, weights: jax.Array, aggregation: str = "mean") -> Updates:
    """Weighted mean of the updates over the leading client axis.

    Args:
      updates: pytree with leaves [C, ...].
      weights: float32 [C], e.g. the clients' example counts (FedAvg).
      aggregation: ``"mean"``: Σ_c w_c Δ_c / Σ_c w_c for every coordinate;
        ``"sender_mean"``: each coordinate averaged over the clients whose
        update is non-zero there (see :func:`zero_total`).
    """
    total = add_weights(zero_total(updates, aggregation, leading_axis=True), weights, updates,
                        aggregation)
    return mean_update(weighted_sum(updates, weights), total)


def zero_total(params: Updates, aggregation: str, leading_axis: bool = False):
    """The empty weight total that :func:`add_weight` / :func:`add_weights` grow.

    ``"mean"`` (FedAvg) divides every coordinate by the cohort's total weight,
    so a client that uploads 0 at a coordinate (a pruned or withheld weight
    under update uploads) pulls the average there towards the global value.
    ``"sender_mean"`` divides each coordinate by the total weight of the
    clients whose update is non-zero there: the sparse averaging of pruned-FL
    servers that average a coordinate over the clients holding it (FedDST,
    Bibikar et al. 2022; HeteroFL), with "sent" read from the upload itself,
    as an honest-but-curious server (and the SGI attack) reads the mask. A
    coordinate nobody sent gets update 0. An update that is exactly 0 by
    accident (e.g. a dead ReLU unit's weights) is also read as not sent.

    Args:
      params: a pytree shaped like one client's update (``leading_axis=False``)
        or like a stack of them (``leading_axis=True``, the axis is dropped).
      aggregation: ``"mean"`` or ``"sender_mean"``.
      leading_axis: whether ``params`` leaves carry a leading client axis.
    """
    check_aggregation(aggregation)
    if aggregation == "mean":
        return jnp.zeros((), jnp.float32)
    shape = (lambda a: a.shape[1:]) if leading_axis else (lambda a: a.shape)
    return jax.tree_util.tree_map(lambda a: jnp.zeros(shape(a), jnp.float32), params)


def add_weight(total, weight: jax.Array, update: Updates, aggregation: str):
    """``total`` plus one client's weight (per coordinate it sent, for sender_mean)."""
    if aggregation == "mean":
        return total + weight
    return jax.tree_util.tree_map(lambda t, u: t + weight * (u != 0), total, update)


def add_weights(total, weights: jax.Array, updates: Updates, aggregation: str):
    """``total`` plus the weights [C] of a stack of updates (leaves [C, ...])."""
    if aggregation == "mean":
        return total + jnp.sum(weights)
    return jax.tree_util.tree_map(
        lambda t, u: t + jnp.tensordot(weights, (u != 0).astype(jnp.float32), axes=1),
        total, updates)


def mean_update(wsum: Updates, total) -> Updates:
    """Σ w Δ divided by the total from :func:`zero_total` (scalar or per coordinate)."""
    if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(total)) and jnp.ndim(total) == 0:
        return jax.tree_util.tree_map(lambda s: s / jnp.maximum(total, 1e-12), wsum)
    return jax.tree_util.tree_map(
        lambda s, t: jnp.where(t > 0, s / jnp.where(t > 0, t, 1.0), 0.0).astype(s.dtype),
        wsum, total)


def check_aggregation(aggregation: str) -> None:
    """Raise a ValueError naming the allowed values for an unknown aggregation."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; allowed: {', '.join(AGGREGATIONS)}"
                         f"{did_you_mean(aggregation, AGGREGATIONS)}")


def make_server_optimizer(name: str, lr: float, **kwargs) -> optax.GradientTransformation:
    """The optax optimizer applied to the pseudo-gradient −Δ̄.

    ``momentum`` is FedAvgM (heavy ball, 0.9); ``adam``, ``yogi`` and
    ``adagrad`` are the optimizers of Reddi et al. 2021, "Adaptive Federated
    Optimization" (FedAdam / FedYogi / FedAdagrad, Alg 2), as optax defines them
    (defaults: Adam β = (0.9, 0.99), ε = 1e-3; Yogi and Adagrad ε = 1e-3, optax's
    other defaults). Deviation: optax's rules are not Alg 2's. Adam and Yogi
    correct the moments' bias (Alg 2 does not), Yogi uses β2 = 0.999 and starts
    both moments at 1e-6, and Adagrad starts its accumulator at 0.1 and adds ε inside the
    square root (Alg 2: v₀ = τ², τ outside). The first rounds' steps differ
    from Alg 2's; the start's weight in the moments fades over the rounds.
    Kept as optax's so far, since the results committed with a server optimizer
    ran with these; ``tests/fedsim/test_server_optimizers_closed_forms.py`` pins them.

    Wrapped by :func:`fedsim.x64.x64_invariant` (Adam and Yogi round otherwise
    under ``jax_enable_x64``).
    """
    return x64_invariant(_server_optimizer(name, lr, **kwargs))


def _server_optimizer(name: str, lr: float, **kwargs) -> optax.GradientTransformation:
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
    raise ValueError(f"unknown server optimizer {name!r}; allowed: {', '.join(SERVER_OPTIMIZERS)}"
                     f"{did_you_mean(name, SERVER_OPTIMIZERS)}")


def server_update(tx: optax.GradientTransformation, params: Params, opt_state, mean_delta: Updates):
    """Apply the server optimizer to the pseudo-gradient −Δ̄."""
    pseudo_grad = jax.tree_util.tree_map(jnp.negative, mean_delta)
    updates, opt_state = tx.update(pseudo_grad, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
