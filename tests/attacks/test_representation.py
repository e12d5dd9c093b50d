"""Representation inference (paper 003 App. A) on a 2-class client of LeNet-5."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attacks import representation as R
from fedsim.client import masked_mean_loss
from fedsim.data import synthetic_dataset
from fedsim.models import build_model, init_params, make_apply_fn

FC = ["Dense_0", "Dense_1", "Dense_2"]


def _dense_inputs(model, params, x):
    """The inputs of every Dense layer, per example (captured by interception)."""
    seen = {}

    def grab(next_fun, args, kwargs, context):
        if isinstance(context.module, nn.Dense) and context.method_name == "__call__":
            seen[context.module.name] = args[0]
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(grab):
        model.apply({"params": params}, x)
    return [np.asarray(seen[n]) for n in FC]


def test_two_class_client_classes_and_cor():
    ds = synthetic_dataset(seed=0, image_size=16, num_train=400, num_test=10)
    model = build_model("lenet5")
    params = init_params(model, ds.input_shape, jax.random.key(0))
    f = make_apply_fn(model)
    sel = np.concatenate([np.flatnonzero(ds.y_train == c)[:16] for c in (2, 7)])
    x, y = jnp.asarray(ds.x_train[sel]), jnp.asarray(ds.y_train[sel])
    g = jax.grad(masked_mean_loss, argnums=1)(f, params, x, y, jnp.ones(len(y)))
    update = jax.tree_util.tree_map(lambda a: -0.01 * a, g)
    reps = R.infer_representations(R.fc_kernels(update, FC), num_top=10)
    assert sorted(reps) == [2, 7]
    inputs = _dense_inputs(model, params, x)
    cors = np.array([[R.representation_correlation(inputs[l][np.asarray(y) == c].mean(0), reps[c][l])
                      for l in range(3)] for c in (2, 7)])
    print("cor per class x layer", cors.round(3))
    # The last layer's row is exactly γ·(class-mean-weighted) representation.
    assert cors[:, 2].min() > 0.9, cors
    assert cors.mean() > 0.5, cors


def test_correlation_known_values_and_errors():
    a = np.arange(5.0)
    assert R.representation_correlation(a, 3 * a + 1) == pytest.approx(1.0)
    assert R.representation_correlation(a, -a) == pytest.approx(1.0)
    assert R.representation_correlation([1, -1, 1, -1], [1, 1, -1, -1]) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="chain"):
        R.infer_representations([np.zeros((4, 3)), np.zeros((4, 2))])


def test_gap_rule_and_signed_correlation():
    from attacks.representation import infer_classes, representation_correlation

    k = np.full((4, 10), 0.01)  # background rows: small, not exactly zero
    k[:, 3], k[:, 7], k[:, 1] = 5.0, 4.0, 0.1
    np.testing.assert_array_equal(infer_classes(k, rule="gap"), [3, 7])
    a = np.arange(5.0)
    assert representation_correlation(a, -a, absolute=False) == pytest.approx(-1.0)
    assert representation_correlation(a, -a) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="rule"):
        infer_classes(k, rule="nope")
