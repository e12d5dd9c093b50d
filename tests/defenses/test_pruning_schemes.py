"""Base pruning schemes: rates, biases kept, scheme-specific properties."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedsim.models import build_model, init_params, make_apply_fn
from defenses.pruning import flatten
from defenses.pruning.schemes import (SCHEMES, feddst_prune_regrow, grasp, initial_mask,
                                      prunable, prunefl_reprune, snip)


@pytest.fixture(scope="module")
def lenet():
    model = build_model("lenet5", 10)
    params = init_params(model, (16, 16, 1), jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (8, 16, 16, 1))
    y = jnp.arange(8) % 10
    return params, make_apply_fn(model), x, y


@pytest.mark.parametrize("scheme", SCHEMES)
def test_scheme_prunes_rate_of_weights_only(lenet, scheme):
    params, apply_fn, x, y = lenet
    m = initial_mask(scheme, jax.random.key(2), params, 0.6, apply_fn=apply_fn, x=x, y=y,
                     input_shape=(16, 16, 1), synflow_iterations=5)
    f, e = np.asarray(flatten(m)), np.asarray(flatten(prunable(params)))
    assert set(np.unique(f)) <= {0.0, 1.0}
    assert np.all(f[e == 0] == 1), "biases must never be pruned"
    expected = 0.0 if scheme == "prunefl" else round(0.6 * e.sum())
    assert (1 - f[e > 0]).sum() == expected


def test_snip_keeps_the_most_sensitive(lenet):
    params, apply_fn, x, y = lenet
    m = snip(params, apply_fn, x, y, 0.5)
    from fedsim.client import masked_mean_loss
    g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, jnp.ones(8))
    s = np.abs(np.asarray(flatten(g)) * np.asarray(flatten(params)))
    f, e = np.asarray(flatten(m)), np.asarray(flatten(prunable(params))) > 0
    assert s[e & (f == 1)].min() >= s[e & (f == 0)].max()


def test_grasp_prunes_the_highest_minus_w_hg_with_a_dense_hessian():
    # GraSP (Wang et al. 2020, Eq 8): S = −θ ⊙ Hg at temperature T; the highest go.
    # Independent computation: the full Hessian of a tiny MLP's loss, times g.
    from jax.flatten_util import ravel_pytree

    k1, k2, k3 = jax.random.split(jax.random.key(5), 3)
    params = {"w1": jax.random.normal(k1, (6, 5)), "b1": jnp.zeros(5),
              "w2": jax.random.normal(k2, (5, 3))}
    apply_fn = lambda p, x: jnp.tanh(x.reshape(x.shape[0], -1) @ p["w1"] + p["b1"]) @ p["w2"]
    x, y = jax.random.normal(k3, (8, 6)), jnp.arange(8) % 3
    T = 200.0
    m = grasp(params, apply_fn, x, y, 0.4, temperature=T)
    flat, unravel = ravel_pytree(params)

    def loss(v):
        logits = apply_fn(unravel(v), x) / T
        return jnp.mean(-jax.nn.log_softmax(logits)[jnp.arange(8), y])

    g = jax.grad(loss)(flat)
    s = np.asarray(-flat * (jax.hessian(loss)(flat) @ g))
    f = np.asarray(ravel_pytree(m)[0])
    e = np.asarray(ravel_pytree(prunable(params))[0]) > 0
    assert (f[e] == 0).sum() == round(0.4 * e.sum())
    assert s[e & (f == 0)].min() >= s[e & (f == 1)].max()


def test_prunefl_iterative_and_feddst_constant_density(lenet):
    params, *_ = lenet
    e = np.asarray(flatten(prunable(params))) > 0
    m = initial_mask("prunefl", None, params, 0.5)
    m1 = prunefl_reprune(params, m, 0.5, 1, 2)
    m2 = prunefl_reprune(params, m1, 0.5, 2, 2)
    f1, f2 = np.asarray(flatten(m1)), np.asarray(flatten(m2))
    assert (1 - f1[e]).sum() == round(0.25 * e.sum()) and (1 - f2[e]).sum() == round(0.5 * e.sum())
    assert np.all(f2 <= f1), "PruneFL re-pruning never revives a pruned weight"
    w = np.abs(np.asarray(flatten(params)))
    assert w[e & (f1 == 1)].min() >= w[e & (f1 == 0)].max()
    d = feddst_prune_regrow(jax.random.key(4), params, m2, 0.2)
    fd = np.asarray(flatten(d))
    assert fd[e].sum() == f2[e].sum(), "FedDST keeps its density"
    assert (fd != f2).sum() == 2 * round(0.2 * f2[e].sum())


def test_unknown_scheme_and_missing_data():
    with pytest.raises(ValueError, match="unknown pruning scheme"):
        initial_mask("magic", jax.random.key(0), {"w": jnp.ones((2, 2))}, 0.1)
    with pytest.raises(ValueError, match="needs apply_fn"):
        initial_mask("snip", jax.random.key(0), {"w": jnp.ones((2, 2))}, 0.1)


@pytest.mark.parametrize("p", [0.05, 0.1, 0.5])
def test_feddst_keeps_the_rate_where_fewer_weights_are_inactive_than_it_drops(lenet, p):
    """FedDST drops 20 % of the active weights and regrows as many inactive ones.
    At p < 1/6 fewer are inactive than that: it used to drop 20 % anyway and regrow
    only p, so p = 0.1 pruned 18 % of the weights. The density must stay 1 − p."""
    params = lenet[0]
    e = np.asarray(flatten(prunable(params))) > 0
    m = initial_mask("feddst", jax.random.key(5), params, p)
    f = np.asarray(flatten(m))
    assert (1 - f[e]).sum() == round(p * e.sum())
    moved = np.asarray(flatten(feddst_prune_regrow(jax.random.key(6), params, m, 0.2)))
    assert moved[e].sum() == f[e].sum()
    # Where few are inactive, every one of them regrows and as many active ones drop.
    n_move = min(round(0.2 * f[e].sum()), (1 - f[e]).sum())
    assert (moved != f).sum() == 2 * n_move
