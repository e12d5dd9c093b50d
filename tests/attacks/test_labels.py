"""Label inference on constructed gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attacks import labels as L
from attacks.metrics import multiset_label_accuracy
from fedsim.client import masked_mean_loss
from fedsim.models import build_model, init_params, make_apply_fn


def _model(name):
    m = build_model(name)
    return make_apply_fn(m), init_params(m, (16, 16, 1), jax.random.key(0))


def _grad(f, p, x, y):
    return jax.grad(masked_mean_loss, argnums=1)(f, p, x, y, jnp.ones(len(y)))


@pytest.mark.parametrize("name", ["mlp", "lenet"])
def test_idlg_batch_one_exact(name):
    f, p = _model(name)
    x = jnp.asarray(np.random.default_rng(0).random((10, 1, 16, 16, 1)), jnp.float32)
    one = lambda xi, yi: L.idlg_label(_grad(f, p, xi, yi[None]), 10)
    got = jax.jit(jax.vmap(one))(x, jnp.arange(10))
    np.testing.assert_array_equal(np.asarray(got), np.arange(10))


def test_idlg_rule_on_handmade_bias_free_gradient():
    h = np.array([0.5, 1.0, 0.2])
    prob = np.full(4, 0.25)
    kernel = np.outer(h, prob - np.eye(4)[2])
    assert int(L.idlg_label({"Dense_0": {"kernel": jnp.asarray(kernel)}}, 4)) == 2


def test_count_inference_batch_mlp():
    f, p = _model("mlp")
    rng = np.random.default_rng(1)
    y = jnp.asarray([0, 0, 3, 5, 5, 5, 7, 9], jnp.int32)
    x = jnp.asarray(rng.random((8, 16, 16, 1)), jnp.float32)
    counts = L.infer_label_counts(_grad(f, p, x, y), f, p, 8, (16, 16, 1), 10, jax.random.key(2))
    assert counts.sum() == 8
    assert multiset_label_accuracy(np.repeat(np.arange(10), counts), np.asarray(y)) >= 0.875


def test_observed_gradient_fedsgd():
    from fedsim.typing import Observation
    g = {"a": jnp.arange(3.0)}
    obs = Observation(update={"a": -0.1 * g["a"]}, params=None, apply_fn=None, algorithm="fedsgd",
                      lr=0.1, local_steps=None, batch_size=None, num_examples=None, labels=None,
                      input_shape=(1,), num_classes=3)
    np.testing.assert_allclose(L.observed_gradient(obs)["a"], g["a"], rtol=1e-6)


def test_missing_last_layer_is_a_clear_error():
    with pytest.raises(ValueError, match="last layer"):
        L.last_layer({"Conv_0": {"kernel": jnp.zeros((3, 3, 1, 4))}}, 10)


@pytest.mark.parametrize("batch_size", [1, 8])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_upload_is_refused_not_given_a_label(batch_size, bad):
    # Before: at B = 1 argmin of a NaN signal gave class 0; at B = 8 the counts
    # came out as int64's minimum and np.repeat failed without naming the upload.
    f, p = _model("mlp")
    x = jnp.asarray(np.random.default_rng(3).random((batch_size, 16, 16, 1)), jnp.float32)
    g = _grad(f, p, x, jnp.arange(batch_size, dtype=jnp.int32) % 10)
    layer = L.last_layer(g, 10)
    assert layer["bias"] is None  # the MLP's signal is the kernel's column sums
    g = jax.tree_util.tree_map(lambda a: a.at[(0,) * a.ndim].set(bad) if a.ndim == 2
                               and a.shape[-1] == 10 else a, g)
    with pytest.raises(ValueError, match=r"label inference: the observed update's last layer "
                                         r"is NaN/inf"):
        L.infer_label_counts(g, f, p, batch_size, (16, 16, 1), 10, jax.random.key(2))


@pytest.mark.parametrize("lr", [0.0, -0.1, float("nan"), float("inf"), "0.1", True])
def test_an_observation_needs_a_positive_learning_rate(lr):
    from attacks.api import observation_from_gradient
    from fedsim.typing import Observation
    f, p = _model("mlp")
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        observation_from_gradient(p, p, f, input_shape=(16, 16, 1), num_classes=10, lr=lr)
    obs = Observation(update=p, params=p, apply_fn=f, algorithm="fedsgd", lr=lr, local_steps=1,
                      batch_size=1, num_examples=1, labels=None, input_shape=(16, 16, 1),
                      num_classes=10)
    with pytest.raises(ValueError, match="learning rate lr must be a finite number > 0"):
        L.observed_gradient(obs)
