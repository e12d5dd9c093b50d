"""fedsim.x64: optax optimizers that round the same with or without 64-bit JAX."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedsim.x64 import only_32_bit, x64_invariant

OPTIMIZERS = {
    "adam": lambda: optax.adam(0.01),
    "adamw": lambda: optax.adamw(0.01, weight_decay=1e-3),
    "yogi": lambda: optax.yogi(0.01),
    "adagrad": lambda: optax.adagrad(0.1),
    "momentum": lambda: optax.sgd(0.1, momentum=0.9),
}


def _train(tx, dtype=jnp.float32, steps=12):
    params = {"w": jnp.linspace(-1.0, 1.0, 257, dtype=dtype)}
    state = tx.init(params)

    @jax.jit
    def step(params, state, i):
        grads = jax.tree_util.tree_map(lambda w: jnp.sin(3.0 * w + i.astype(w.dtype)), params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for i in range(steps):
        params, state = step(params, state, jnp.int32(i))
    return np.asarray(params["w"]), state


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_float32_model_gets_the_numbers_it_gets_without_x64(name):
    assert not jax.config.jax_enable_x64
    plain, _ = _train(x64_invariant(OPTIMIZERS[name]()))
    with jax.enable_x64(True):
        wide, state = _train(x64_invariant(OPTIMIZERS[name]()))
    assert wide.dtype == np.float32
    assert only_32_bit(state)
    np.testing.assert_array_equal(wide, plain)


@pytest.mark.parametrize("name", ["adam", "yogi"])
def test_without_the_wrapper_adam_and_yogi_round_otherwise_under_x64(name):
    # What the wrapper is for: if optax ever computes its bias correction in the
    # moments' dtype, this fails and the wrapper can go.
    plain, _ = _train(OPTIMIZERS[name]())
    with jax.enable_x64(True):
        wide, _ = _train(OPTIMIZERS[name]())
    assert wide.dtype == np.float32
    assert not np.array_equal(wide, plain)


def test_a_float64_model_is_left_to_x64():
    # training.dtype: float64 must get float64 arithmetic, not a narrowed optimizer.
    with jax.enable_x64(True):
        wrapped, state = _train(x64_invariant(optax.adam(0.01)), jnp.float64)
        bare, _ = _train(optax.adam(0.01), jnp.float64)
    assert wrapped.dtype == np.float64
    moments = [leaf for leaf in jax.tree_util.tree_leaves(state)
               if jnp.issubdtype(leaf.dtype, jnp.floating)]
    assert moments and {str(leaf.dtype) for leaf in moments} == {"float64"}
    np.testing.assert_array_equal(wrapped, bare)


def test_lbfgs_takes_its_extra_arguments_and_is_the_same_under_x64():
    def loss(x):
        return jnp.sum((x - jnp.arange(6.0, dtype=jnp.float32)) ** 2 * jnp.linspace(1.0, 3.0, 6, dtype=jnp.float32))

    def solve():
        tx = x64_invariant(optax.lbfgs())
        assert isinstance(tx, optax.GradientTransformationExtraArgs)
        x = jnp.zeros(6, jnp.float32)
        state = tx.init(x)
        value_and_grad = optax.value_and_grad_from_state(loss)

        @jax.jit
        def step(x, state):
            value, grad = value_and_grad(x, state=state)
            updates, state = tx.update(grad, state, x, value=value, grad=grad, value_fn=loss)
            return optax.apply_updates(x, updates), state

        for _ in range(10):
            x, state = step(x, state)
        return np.asarray(x), state

    plain, _ = solve()
    with jax.enable_x64(True):
        wide, state = solve()
    assert only_32_bit(state)
    np.testing.assert_array_equal(wide, plain)
    np.testing.assert_allclose(plain, np.arange(6.0), atol=1e-3)


def test_only_32_bit_reads_array_widths():
    with jax.enable_x64(True):
        wide = [jnp.zeros(2, jnp.float64), jnp.zeros(2, jnp.int64), jnp.zeros(2, jnp.complex128)]
    narrow = [jnp.zeros(2, jnp.float32), jnp.zeros(2, jnp.bfloat16), jnp.zeros(2, jnp.int32),
              jnp.zeros(2, jnp.complex64), np.zeros(2, np.uint8), jax.random.key(0), 0.5, 3, None]
    assert only_32_bit({"a": narrow})
    for leaf in wide:
        assert not only_32_bit({"a": narrow, "b": leaf})
