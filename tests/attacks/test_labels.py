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
    rng = np.random.default_rng(0)
    for label in range(10):
        x = jnp.asarray(rng.random((1, 16, 16, 1)), jnp.float32)
        g = _grad(f, p, x, jnp.array([label]))
        assert int(L.idlg_label(g, 10)) == label


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
