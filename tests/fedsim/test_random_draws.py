"""fedsim.random_draws: the same bits as jax.random, however it is called."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedsim import random_draws

SHAPES = [(), (5,), (3, 4), (2, 5, 5, 3), (1, 7, 1)]
DRAWS = [
    (random_draws.normal, jax.random.normal, {}),
    (random_draws.uniform, jax.random.uniform, {}),
    (random_draws.uniform, jax.random.uniform, {"minval": -0.3, "maxval": 0.3}),
    (random_draws.gumbel, jax.random.gumbel, {}),
]


@pytest.mark.parametrize("ours, theirs, kwargs", DRAWS)
@pytest.mark.parametrize("shape", SHAPES)
def test_same_bits_as_jax_random(ours, theirs, kwargs, shape):
    key = jax.random.key(11)
    a, b = ours(key, shape, **kwargs), theirs(key, shape, **kwargs)
    assert a.shape == b.shape == shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
def test_same_bits_for_every_dtype_and_key_implementation(dtype, impl):
    key = jax.random.key(4, impl=impl)
    for ours, theirs, kwargs in DRAWS:
        a, b = ours(key, (3, 2, 4), dtype, **kwargs), theirs(key, (3, 2, 4), dtype, **kwargs)
        assert a.dtype == b.dtype == dtype
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("partitionable", [True, False])
def test_same_bits_under_jit_and_vmap_either_way_threefry_is_partitioned(partitionable):
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", partitionable)
    try:
        keys = jax.random.split(jax.random.key(2), 3)
        for ours, theirs, kwargs in DRAWS:
            a = jax.jit(jax.vmap(lambda k: ours(k, (4, 3, 2), **kwargs)))(keys)
            b = jax.vmap(lambda k: theirs(k, (4, 3, 2), **kwargs))(keys)
            np.testing.assert_array_equal(a, b)
    finally:
        jax.config.update("jax_threefry_partitionable", before)


def test_the_comparison_can_fail():
    # Other keys give other bits: the checks above compare values, not just shapes.
    a = random_draws.normal(jax.random.key(0), (3, 4))
    b = jax.random.normal(jax.random.key(1), (3, 4))
    assert not np.array_equal(a, b)


def test_uniform_refuses_array_bounds_by_name():
    with pytest.raises(ValueError, match="scalar minval and maxval"):
        random_draws.uniform(jax.random.key(0), (2, 3), minval=jnp.zeros((2, 3)))


@pytest.mark.parametrize("shape", [(2.5, 3), (2, "3"), 4])
def test_a_shape_that_is_not_integers_is_refused_not_truncated(shape):
    with pytest.raises(TypeError, match="a shape is a sequence of integers"):
        random_draws.normal(jax.random.key(0), shape)


def test_numpy_integers_are_a_shape():
    a = random_draws.normal(jax.random.key(0), (np.int64(2), np.int32(3)))
    np.testing.assert_array_equal(a, jax.random.normal(jax.random.key(0), (2, 3)))
