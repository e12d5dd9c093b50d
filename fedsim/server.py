"""Server side: cohort sampling, weighted aggregation, the server optimizer.

Plain FedAvg is the server optimizer SGD(lr = 1) applied to the pseudo-gradient
−Δ̄ (McMahan et al. 2017); FedAdam etc. are other optax optimizers on the same
pseudo-gradient (Reddi et al. 2021): ``adam``/``yogi``/``adagrad`` as optax
defines them, ``fedadam``/``fedyogi``/``fedadagrad`` as the paper's Alg 2 prints
them (:func:`reddi_alg2`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedsim.suggest import did_you_mean
from fedsim.typing import Params, PRNGKey, Updates
from fedsim.x64 import x64_invariant

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam", "yogi", "adagrad", "fedadam", "fedyogi",
                     "fedadagrad")
#: The hyperparameters each server optimizer takes (config keys
#: ``training.server_<name>``) with their defaults. ``tau`` is Reddi et al.'s
#: adaptivity τ, optax's ``eps``; ``b1``/``b2`` the moments' decays β1/β2;
#: ``momentum`` FedAvgM's heavy-ball β. The optax ones keep the defaults every
#: earlier run used. The Alg 2 ones take the values the authors' experiments
#: ran with (google-research/federated, ``optimization/docs/hyperparameters.md``):
#: Keras's β1 = 0.9, β2 = 0.999 for Adam and Yogi, no momentum for Adagrad
#: (Keras's Adagrad has none, so β1 = 0), and τ = 1e-3, the value it recommends
#: (its best τ per task ranges from 1e-5 to 1e-1).
SERVER_HYPERPARAMETERS = {
    "sgd": {},
    "momentum": {"momentum": 0.9},
    "adam": {"b1": 0.9, "b2": 0.99, "tau": 1e-3},
    "yogi": {"b1": 0.9, "b2": 0.999, "tau": 1e-3},
    "adagrad": {"tau": 1e-3},
    "fedadam": {"b1": 0.9, "b2": 0.999, "tau": 1e-3},
    "fedyogi": {"b1": 0.9, "b2": 0.999, "tau": 1e-3},
    "fedadagrad": {"b1": 0.0, "tau": 1e-3},
}
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


def make_server_optimizer(name: str, lr: float, **hyperparameters) -> optax.GradientTransformation:
    """The optimizer applied to the pseudo-gradient −Δ̄.

    ``momentum`` is FedAvgM (heavy ball; Hsu et al. 2019). ``fedadam``,
    ``fedyogi`` and ``fedadagrad`` are Reddi et al. 2021, "Adaptive Federated
    Optimization", Alg 2 as printed (:func:`reddi_alg2`). ``adam``, ``yogi``
    and ``adagrad`` are the same methods as optax defines them, which is not
    Alg 2: Adam and Yogi correct the moments' bias (Alg 2 does not), Yogi
    starts both moments at 1e-6, and Adagrad has no momentum, starts its
    accumulator at 0.1 and adds τ inside the square root (Alg 2: v₋₁ = τ², τ
    outside). The authors' experiment code sits between the two: it ran
    Keras's Adam and Adagrad and its own Keras Yogi (google-research/federated,
    ``utils/optimizers/optimizer_utils.py`` and ``yogi.py``), bias-corrected
    like optax's, with Adagrad's and Yogi's accumulators started at 0
    (``optimization/docs/hyperparameters.md``), and τ outside the root as in
    Alg 2. The first rounds' steps differ between the rules; the start's weight
    in the moments fades over the rounds.
    ``tests/fedsim/test_server_optimizers_closed_forms.py`` pins both against
    the rules written out by hand.

    Args:
      name: one of :data:`SERVER_OPTIMIZERS`.
      lr: the server learning rate η.
      **hyperparameters: the ones :data:`SERVER_HYPERPARAMETERS` lists for
        ``name`` (``momentum``, ``b1``, ``b2``, ``tau``); a missing or None one
        takes its default there.

    Raises:
      ValueError: for an unknown name, or a hyperparameter ``name`` does not take.

    Wrapped by :func:`fedsim.x64.x64_invariant` (Adam and Yogi round otherwise
    under ``jax_enable_x64``).
    """
    if name not in SERVER_OPTIMIZERS:
        raise ValueError(f"unknown server optimizer {name!r}; allowed: "
                         f"{', '.join(SERVER_OPTIMIZERS)}{did_you_mean(name, SERVER_OPTIMIZERS)}")
    hp = dict(SERVER_HYPERPARAMETERS[name])
    for key, value in hyperparameters.items():
        if value is None:
            continue
        if key not in hp:
            takes = [n for n, keys in SERVER_HYPERPARAMETERS.items() if key in keys]
            raise ValueError(f"server optimizer {name!r} takes no {key!r} (it takes "
                             f"{', '.join(hp) or 'none'}; {key!r} applies to "
                             f"{', '.join(takes) or 'no server optimizer'})")
        hp[key] = value
    for key, value in hp.items():
        ok = value > 0 if key == "tau" else 0 <= value < 1  # NaN fails both
        if not ok:
            raise ValueError(f"server optimizer {name!r}: {key} must be "
                             f"{'> 0' if key == 'tau' else 'in [0, 1)'}, got {value!r}")
    return x64_invariant(_server_optimizer(name, lr, **hp))


def _server_optimizer(name: str, lr: float, **hp) -> optax.GradientTransformation:
    if name == "sgd":
        return optax.sgd(lr)
    if name == "momentum":
        return optax.sgd(lr, momentum=hp["momentum"])
    if name == "adam":
        return optax.adam(lr, b1=hp["b1"], b2=hp["b2"], eps=hp["tau"])
    if name == "yogi":
        return optax.yogi(lr, b1=hp["b1"], b2=hp["b2"], eps=hp["tau"])
    if name == "adagrad":
        return optax.adagrad(lr, eps=hp["tau"])
    return reddi_alg2(name[len("fed"):], lr, b1=hp["b1"], b2=hp.get("b2", 0.0), tau=hp["tau"])


class ReddiAlg2State(NamedTuple):
    """The server's moments in :func:`reddi_alg2`: m and v, shaped like the params."""

    m: optax.Updates
    v: optax.Updates


def reddi_alg2(rule: str, lr: float, b1: float, b2: float,
               tau: float) -> optax.GradientTransformation:
    """FedAdagrad / FedYogi / FedAdam as Reddi et al. 2021 print them (Alg 2).

    On the round's average update Δ (the pseudo-gradient is g = −Δ; the signs
    below are Alg 2's, on Δ):

    * m_t = β1 m_{t−1} + (1 − β1) Δ_t, m_{−1} = 0, for all three;
    * ``adagrad``: v_t = v_{t−1} + Δ_t²;
      ``yogi``: v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²);
      ``adam``: v_t = β2 v_{t−1} + (1 − β2) Δ_t²;
    * x_{t+1} = x_t + η m_t / (√v_t + τ).

    No bias correction. Alg 2 asks v_{−1} ≥ τ²; this takes v_{−1} = τ², the
    least it allows. ``b2`` is unused by ``adagrad``; β1 = 0 there gives the
    momentum-free Adagrad the authors' experiments ran (the config's default).
    Optax has no transformation for this (its Adam and Yogi always correct the
    bias, its Adagrad has no momentum), hence by hand;
    ``tests/fedsim/test_server_optimizers_closed_forms.py`` checks it against
    the rule written out in numpy, alone and inside the engine.

    Args:
      rule: ``"adam"``, ``"yogi"`` or ``"adagrad"``.
      lr: η.
      b1: β1 in [0, 1).
      b2: β2 in [0, 1) (Adam, Yogi).
      tau: τ > 0, the degree of adaptivity.
    """
    if rule not in ("adam", "yogi", "adagrad"):
        raise ValueError(f"unknown Alg 2 rule {rule!r}; allowed: adam, yogi, adagrad")
    for key, value, ok, allowed in (("b1", b1, 0 <= b1 < 1, "in [0, 1)"),
                                    ("b2", b2, 0 <= b2 < 1, "in [0, 1)"),
                                    ("tau", tau, tau > 0, "> 0")):
        if not ok:  # NaN fails every comparison, so it lands here too
            raise ValueError(f"reddi_alg2: {key} must be {allowed}, got {value!r}")

    def init(params):
        return ReddiAlg2State(m=jax.tree_util.tree_map(jnp.zeros_like, params),
                              v=jax.tree_util.tree_map(lambda p: jnp.full_like(p, tau ** 2),
                                                       params))

    def second_moment(v, d):
        d2 = d * d
        if rule == "adagrad":
            return v + d2
        if rule == "yogi":
            return v - (1 - b2) * d2 * jnp.sign(v - d2)
        return b2 * v + (1 - b2) * d2

    def update(grads, state, params=None):
        del params
        deltas = jax.tree_util.tree_map(jnp.negative, grads)  # Alg 2 is written on Δ = −g
        m = jax.tree_util.tree_map(lambda m, d: b1 * m + (1 - b1) * d, state.m, deltas)
        v = jax.tree_util.tree_map(second_moment, state.v, deltas)
        # optax adds the returned updates to the params: + η m / (√v + τ).
        steps = jax.tree_util.tree_map(lambda m, v: lr * m / (jnp.sqrt(v) + tau), m, v)
        return steps, ReddiAlg2State(m=m, v=v)

    return optax.GradientTransformation(init, update)


def server_update(tx: optax.GradientTransformation, params: Params, opt_state, mean_delta: Updates):
    """Apply the server optimizer to the pseudo-gradient −Δ̄."""
    pseudo_grad = jax.tree_util.tree_map(jnp.negative, mean_delta)
    updates, opt_state = tx.update(pseudo_grad, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
