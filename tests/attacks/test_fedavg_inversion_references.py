"""Checks of attacks/fedavg_inversion.py (Geiping et al. 2020 §4,
"multiple local steps"): the objective the attack reports, against local SGD
unrolled by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from attacks import run_attack
from fedsim.typing import Observation

SHAPE, K = (2, 3, 1), 3


def _linear(params, x):
    d = params["dense"]
    return x.reshape(x.shape[0], -1) @ d["kernel"] + d["bias"]


def _unrolled_update(params, x, y, batch, steps, lr):
    """Local SGD by hand: S steps over the examples in order, mini-batches of ``batch``
    (a partial last batch the mean over its real rows), w ← w − lr·∇ mean CE; Δ = w_S − w_0."""
    n = x.shape[0]
    w = params
    starts = list(range(0, n, batch))
    for s in range(steps):
        lo = starts[s % len(starts)]
        xb, yb = x[lo:lo + batch], y[lo:lo + batch]
        g = jax.grad(lambda p: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
            _linear(p, xb), yb)))(w)
        w = jax.tree_util.tree_map(lambda a, b: a - lr * b, w, g)
    return jax.tree_util.tree_map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64),
                                  w, params)


def _cosine_loss(a, b):
    fa = np.concatenate([v.ravel() for v in jax.tree_util.tree_leaves(a)])
    fb = np.concatenate([v.ravel() for v in jax.tree_util.tree_leaves(b)])
    return 1.0 - fa @ fb / (np.linalg.norm(fa) * np.linalg.norm(fb))


def test_reported_loss_is_the_cosine_of_the_unrolled_local_training():
    """Kills F1 (n dummies → B dummies), F2 (the victim's lr replaced by 0.1),
    G12 (the wrapped-around padding row weighted 1) and G13 (the local lr dropped).

    Reference: :func:`_unrolled_update` (the module docstring: Δ = w_S − w_0 after
    S SGD steps on mini-batches of B out of n at lr, examples in a fixed
    order) and Geiping et al.'s cosine loss 1 − ⟨Δ̂, Δ⟩/(‖Δ̂‖‖Δ‖). With the
    attack's step size 0 its dummies stay at their start, so the loss it
    reports is the objective at the returned x (n = 3 of them, with the
    granted labels), TV weight 0. Here n = 3, B = 2 (a partial last batch),
    S = 4 (two epochs), lr = 0.7.
    """
    rng = np.random.default_rng(0)
    params = {"dense": {"kernel": jnp.asarray(rng.normal(0, 1, (6, K)), jnp.float32),
                        "bias": jnp.asarray(rng.normal(0, 1, K), jnp.float32)}}
    n, batch, steps, lr = 3, 2, 4, 0.7
    x = jnp.asarray(rng.uniform(0, 1, (n, *SHAPE)), jnp.float32)
    y = jnp.asarray([0, 2, 1], jnp.int32)
    upload = _unrolled_update(params, x, y, batch, steps, lr)
    upload = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), upload)
    obs = Observation(upload, params, _linear, "fedavg", lr, steps, batch, n, y, SHAPE, K)
    rec = run_attack("fedavg_inversion", obs, {"iterations": 1, "lr": 0.0, "tv": 0.0},
                     jax.random.key(2))
    assert rec.x.shape == (n, *SHAPE)
    xd, yd = jnp.asarray(rec.x), jnp.asarray(rec.labels)
    np.testing.assert_array_equal(np.asarray(yd), np.asarray(y))
    want = _cosine_loss(_unrolled_update(params, xd, yd, batch, steps, lr), upload)
    assert float(rec.loss) == pytest.approx(want, rel=1e-4, abs=1e-6)
    # The instance tells the wrong local lr apart (the loss is not lr-invariant).
    other = _cosine_loss(_unrolled_update(params, xd, yd, batch, steps, 0.1), upload)
    assert abs(other - want) > 1e-3


def test_the_attackers_configured_step_count_overrides_the_granted_one():
    """Kills F3 (``_resolve``: the granted value taken before the config's).

    Reference: check_config's contract for the training keys ("a positive
    integer (or absent, to take the granted value)"): a configured
    ``local_steps`` is what the attack unrolls. The observation grants S = 9
    but the attacker configures S = 4 (the true count); the reported loss
    must be the cosine loss of :func:`_unrolled_update` with S = 4.
    """
    rng = np.random.default_rng(1)
    params = {"dense": {"kernel": jnp.asarray(rng.normal(0, 1, (6, K)), jnp.float32),
                        "bias": jnp.asarray(rng.normal(0, 1, K), jnp.float32)}}
    n, batch, lr = 3, 2, 0.7
    x = jnp.asarray(rng.uniform(0, 1, (n, *SHAPE)), jnp.float32)
    y = jnp.asarray([1, 0, 2], jnp.int32)
    upload = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32),
                                    _unrolled_update(params, x, y, batch, 4, lr))
    obs = Observation(upload, params, _linear, "fedavg", lr, 9, batch, n, y, SHAPE, K)
    rec = run_attack("fedavg_inversion", obs,
                     {"iterations": 1, "lr": 0.0, "tv": 0.0, "local_steps": 4}, jax.random.key(2))
    xd, yd = jnp.asarray(rec.x), jnp.asarray(rec.labels)
    want = _cosine_loss(_unrolled_update(params, xd, yd, batch, 4, lr), upload)
    assert float(rec.loss) == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert abs(_cosine_loss(_unrolled_update(params, xd, yd, batch, 9, lr), upload) - want) > 1e-3
