"""Representation inference (paper 003 App. A, Alg 3–4) and cor."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attacks.representation import (correlation, infer_classes, infer_previous_layer,
                                    infer_representations)
from fedsim.client import masked_mean_loss
from fedsim.models import build_model, init_params, make_apply_fn


def test_correlation_matches_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(size=50)
    assert correlation(a, b) == pytest.approx(np.corrcoef(a, b)[0, 1], abs=1e-12)
    assert correlation(a, 3 * a + 1) == pytest.approx(1.0)
    assert np.isnan(correlation(np.ones(4), a[:4]))


def test_previous_layer_sums_top_m_columns():
    k = np.arange(12.0).reshape(3, 4)
    out = infer_previous_layer(k, np.array([0.1, -5.0, 2.0, 0.0]), 2)
    np.testing.assert_allclose(out, k[:, 1] + k[:, 2])
    with pytest.raises(ValueError, match="M="):
        infer_previous_layer(k, np.zeros(4), 5)


def test_two_class_update_reveals_classes_and_last_layer_representation():
    model = build_model("lenet5")
    params = init_params(model, (16, 16, 1), jax.random.key(0))
    apply_fn = make_apply_fn(model)
    x = jax.random.uniform(jax.random.key(1), (16, 16, 16, 1))
    y = jnp.array([3] * 8 + [7] * 8)
    g = jax.jit(jax.grad(masked_mean_loss, argnums=1), static_argnums=0)(
        apply_fn, params, x, y, jnp.ones(16))
    update = jax.tree_util.tree_map(lambda v: -0.01 * v, g)
    np.testing.assert_array_equal(infer_classes(update["Dense_2"]["kernel"]), [3, 7])
    # True class-3 representation entering the last layer: recompute LeNet-5's
    # features by hand from the params (independent of the attack code).
    h = jax.nn.relu(jax.lax.conv_general_dilated(
        x, params["Conv_0"]["kernel"], (1, 1), "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC")) + params["Conv_0"]["bias"])
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    h = jax.nn.relu(jax.lax.conv_general_dilated(
        h, params["Conv_1"]["kernel"], (1, 1), "VALID",
        dimension_numbers=("NHWC", "HWIO", "NHWC")) + params["Conv_1"]["bias"])
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    h = h.reshape(16, -1)
    h = jax.nn.relu(h @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"])
    h = jax.nn.relu(h @ params["Dense_1"]["kernel"] + params["Dense_1"]["bias"])
    reps = infer_representations(update, [("Dense_0",), ("Dense_1",), ("Dense_2",)], [3, 7])
    assert correlation(reps[3][-1], h[:8].mean(0)) > 0.9
    assert reps[3][0].shape == (params["Dense_0"]["kernel"].shape[0],)
