"""Checks of the base pruning schemes (paper 002's Table 1 schemes).

FedDST's prune-and-regrow count, its drop rule and cosine-annealed schedule, and
SynFlow's linearised network without biases. Expected values come from the
schemes' definitions (module docstring), recomputed in numpy.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from defenses.pruning import schemes
from defenses.pruning.schemes import feddst_prune_regrow, feddst_reconfiguration, prunable


def _params():
    """Two kernels (13 + 12 = 25 prunable weights) and a bias, distinct |w|."""
    rng = np.random.default_rng(0)
    w = rng.permutation(np.arange(1, 26)) * (1 - 2 * (rng.uniform(size=25) < 0.5))
    return {"a": jnp.asarray(w[:12].reshape(3, 4) / 10, jnp.float32),
            "b": jnp.asarray(rng.normal(size=4), jnp.float32),
            "c": jnp.asarray(w[12:].reshape(13, 1) / 10, jnp.float32)}


def _flat(tree, keys=("a", "c")):
    return np.concatenate([np.asarray(tree[k]).ravel() for k in keys])


def _mask_with_active(params, n_active, seed):
    rng = np.random.default_rng(seed)
    on = np.zeros(25)
    on[rng.choice(25, n_active, replace=False)] = 1.0
    return {"a": jnp.asarray(on[:12].reshape(3, 4), jnp.float32),
            "b": jnp.ones(4, jnp.float32),
            "c": jnp.asarray(on[12:].reshape(13, 1), jnp.float32)}


@pytest.mark.parametrize("n_active, drop", [(13, 0.2), (9, 0.3)])
def test_feddst_drops_the_rounded_count_of_the_smallest_active_weights(n_active, drop):
    """Kills the truncated count ``int(drop·n_active)`` and dropping the largest |w|.

    Reference (FedDST / SET, module docstring): drop round(drop·n_active) of the
    active weights with the smallest |w| (13·0.2 = 2.6 → 3, 9·0.3 = 2.7 → 3; fewer
    inactive weights than that cap it), regrow as many among the inactive ones,
    so the density stays and the biases are untouched.
    """
    params = _params()
    mask = _mask_with_active(params, n_active, seed=n_active)
    new = feddst_prune_regrow(jax.random.key(1), params, mask, drop)
    before, after = _flat(mask), _flat(new)
    n_drop = min(int(math.floor(drop * n_active + 0.5)), 25 - n_active)
    dropped = (before == 1) & (after == 0)
    grown = (before == 0) & (after == 1)
    assert dropped.sum() == n_drop and grown.sum() == n_drop
    w = np.abs(_flat(params))
    active_sorted = np.sort(w[before == 1])
    np.testing.assert_array_equal(np.sort(w[dropped]), active_sorted[:n_drop])
    np.testing.assert_array_equal(np.asarray(new["b"]), np.ones(4))


@pytest.mark.parametrize("k, num", [(0, 3), (1, 4), (3, 4)])
def test_feddst_reconfiguration_anneals_the_drop_fraction_by_a_cosine(k, num):
    """Kills ``(1 − cos(πk/num))/2`` in ``feddst_reconfiguration``.

    Reference (FedDST after RigL, docstring): reconfiguration k of num drops and
    regrows round(0.2·(1 + cos(πk/num))/2 · n_active) weights: 20 % of 20 active at
    k = 0, round(3.41) = 3 at 1/4 and round(0.59) = 1 at 3/4.
    """
    params = _params()
    mask = _mask_with_active(params, 20, seed=3)
    new = feddst_reconfiguration(params, mask, 0.2, k=k, num=num, key=jax.random.key(2))
    frac = 0.2 * (1 + math.cos(math.pi * k / num)) / 2
    n_move = int(math.floor(frac * 20 + 0.5))
    assert int(np.sum(_flat(mask) != _flat(new))) == 2 * n_move


def test_synflow_linearised_network_has_no_biases():
    """Kills dropping the ``* e`` (biases left in the linearised network) in ``synflow``.

    Reference (Tanaka et al. 2020, Alg 1; module docstring): R = 1ᵀ|W2ᵀ||W1ᵀ|1 with
    the biases zeroed, so score(W2_jk) = |W2_jk| Σ_i |W1_ij| and score(W1_ij) =
    |W1_ij| Σ_k |W2_jk|. Hidden unit 3 gets tiny W1 weights but a large bias:
    without biases its five weights score lowest and round(0.25·20) = 5 prunes
    exactly them; a bias in R would lift W2[3, :] above others.
    """
    rng = np.random.default_rng(4)
    W1 = rng.uniform(0.5, 1.5, (3, 4))
    W1[:, 3] = 1e-3
    W2 = rng.uniform(0.5, 1.5, (4, 2))
    b1 = np.array([0.0, 0.0, 0.0, 5.0])
    params = {"W1": jnp.asarray(W1, jnp.float32), "b1": jnp.asarray(b1, jnp.float32),
              "W2": jnp.asarray(W2, jnp.float32)}

    def apply_fn(p, x):
        return (x.reshape(x.shape[0], -1) @ p["W1"] + p["b1"]) @ p["W2"]

    s1 = W1 * W2.sum(axis=1)[None, :]
    s2 = W2 * W1.sum(axis=0)[:, None]
    flat = np.concatenate([s1.ravel(), s2.ravel()])
    cut = np.sort(flat)[4]
    assert np.sort(flat)[5] > 10 * cut  # the 5 lowest are well apart
    mask = schemes.synflow(params, apply_fn, (3,), 0.25, iterations=1)
    np.testing.assert_array_equal(np.asarray(mask["W1"]), (s1 > cut).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(mask["W2"]), (s2 > cut).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(mask["b1"]), np.ones(4, np.float32))
    assert np.all(np.asarray(prunable(params)["b1"]) == 0)
