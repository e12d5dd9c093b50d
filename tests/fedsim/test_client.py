import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedsim.client import LocalTraining, make_client_update, masked_mean_loss
from fedsim.models import build_model, init_params, make_apply_fn
from fedsim.typing import CohortData


@pytest.fixture(scope="module")
def setup():
    model = build_model("mlp")
    params = init_params(model, (16, 16, 1), jax.random.key(0))
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(37, 16, 16, 1)).astype(np.float32)
    y = rng.integers(0, 10, 37).astype(np.int32)
    return make_apply_fn(model), params, x, y


def _data(x, y, n_max):
    n = len(y)
    pad = n_max - n
    return CohortData(
        jnp.concatenate([x, np.zeros((pad,) + x.shape[1:], np.float32)]),
        jnp.concatenate([y, np.zeros(pad, np.int32)]),
        jnp.concatenate([jnp.ones(n), jnp.zeros(pad)]),
        jnp.int32(n))


@pytest.mark.parametrize("algorithm,epochs,batch", [("fedavg", 2, 8), ("fedavg", 1, 16),
                                                     ("fedsgd", 1, 8)])
def test_padded_client_gives_the_same_update(setup, algorithm, epochs, batch):
    apply_fn, params, x, y = setup
    tx = optax.sgd(0.3, momentum=0.5)
    key = jax.random.key(7)
    outs = []
    for n_max in (37, 64):
        fn = make_client_update(apply_fn, tx, LocalTraining(algorithm, epochs, batch, n_max))
        outs.append(jax.jit(fn)(params, _data(x, y, n_max), {}, key))
    chex.assert_trees_all_close(outs[0].update, outs[1].update, atol=1e-6)
    np.testing.assert_allclose(outs[0].loss, outs[1].loss, rtol=1e-5)
    assert float(outs[1].num_examples) == 37


def test_fedsgd_update_is_minus_lr_times_full_batch_gradient(setup):
    apply_fn, params, x, y = setup
    lr = 0.1
    fn = make_client_update(apply_fn, optax.sgd(lr), LocalTraining("fedsgd", 1, 8, 40))
    out = fn(params, _data(x, y, 40), {}, jax.random.key(0))
    g = jax.grad(lambda p: masked_mean_loss(apply_fn, p, x, y, jnp.ones(37)))(params)
    chex.assert_trees_all_close(out.update, jax.tree_util.tree_map(lambda v: -lr * v, g),
                                atol=1e-6)


def test_fedavg_steps_follow_a_shuffled_order(setup):
    apply_fn, params, x, y = setup
    fn = jax.jit(make_client_update(apply_fn, optax.sgd(0.3), LocalTraining("fedavg", 1, 8, 37)))
    a = fn(params, _data(x, y, 37), {}, jax.random.key(1))
    b = fn(params, _data(x, y, 37), {}, jax.random.key(2))
    c = fn(params, _data(x, y, 37), {}, jax.random.key(1))
    chex.assert_trees_all_close(a.update, c.update)  # same key, same update
    diff = jax.tree_util.tree_map(lambda u, v: float(jnp.abs(u - v).max()), a.update, b.update)
    assert max(jax.tree_util.tree_leaves(diff)) > 1e-6  # another key, another order


@pytest.mark.parametrize("unroll", [0, 32])
def test_a_float64_client_follows_the_float32_clients_batch_order(setup, unroll):
    # Under jax_enable_x64, jax.random.uniform's default dtype is float64, which
    # draws other bits from the key: the batch order must not follow it, or a
    # float64 reference of a run (benchmarks/diagnose_vmap_rounding.py) trains
    # on other batches. The MLP is smooth, so the two differ by rounding.
    apply_fn, params, x, y = setup
    fn = make_client_update(apply_fn, optax.sgd(0.3),
                            LocalTraining("fedavg", 2, 8, 40, unroll_steps=unroll))
    data, key = _data(x, y, 40), jax.random.key(3)
    out32 = jax.jit(fn)(params, data, {}, key)
    to64 = lambda t: jax.tree_util.tree_map(  # noqa: E731
        lambda a: a.astype(jnp.float64) if a.dtype == jnp.float32 else a, t)
    with jax.enable_x64(True):
        out64 = jax.jit(fn)(to64(params), to64(data), {}, key)
        assert all(a.dtype == jnp.float64 for a in jax.tree_util.tree_leaves(out64.update))
        chex.assert_trees_all_close(to64(out32.update), out64.update, atol=1e-6, rtol=0)
