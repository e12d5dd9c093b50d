"""Model inversion moves the auxiliary mean towards the class centres of a trained model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attacks import run_attack
from attacks.gradient_inversion import AttackConfigError
from attacks import model_inversion
from attacks.model_inversion import class_centre_mse, class_centres
from fedsim import models
from fedsim.data import synthetic_dataset
from fedsim.models import build_model, init_params, make_apply_fn
from fedsim.typing import Observation
from tests.attacks.helpers import train_full_batch


def test_model_inversion_approaches_class_centres():
    ds = synthetic_dataset(seed=0, image_size=16, num_train=600, num_test=100)
    model = build_model("mlp")
    f = make_apply_fn(model)
    p = init_params(model, ds.input_shape, jax.random.key(0))
    x, y = jnp.asarray(ds.x_train[:500]), jnp.asarray(ds.y_train[:500])
    trained = train_full_batch(f, p, x, y, steps=300)
    zero = jax.tree_util.tree_map(jnp.zeros_like, trained)
    obs = Observation(zero, trained, f, "fedsgd", 0.1, 1, None, None, None, ds.input_shape, 10)
    aux = ds.x_train[500:600]
    rec = run_attack("model_inversion", obs, {"aux_images": aux, "iterations": 200, "lr": 1e-2},
                     jax.random.key(0))
    centres = class_centres(ds.x_train[:500], ds.y_train[:500], 10)
    before = class_centre_mse(np.repeat(aux.mean(0)[None], 10, 0), np.arange(10), centres)
    after = class_centre_mse(rec.x, rec.labels, centres)
    assert after < before, (before, after)
    probs = jax.nn.softmax(f(trained, rec.x))
    assert float(jnp.mean(probs[jnp.arange(10), rec.labels])) > 0.5


def test_model_inversion_requires_aux():
    obs = Observation(None, None, None, "fedsgd", 0.1, 1, None, None, None, (4, 4, 1), 10)
    with pytest.raises(AttackConfigError, match="aux_images"):
        run_attack("model_inversion", obs, {}, jax.random.key(0))


def test_class_centre_mse_names_classes_without_a_centre():
    # A client holding 2 of 10 classes: the other 8 centres are NaN, and the
    # median over all 10 classes was NaN without a word.
    rng = np.random.default_rng(0)
    centres = class_centres(rng.uniform(size=(40, 4, 4, 1)), np.repeat([0, 1], 20), 10)
    x_inv = rng.uniform(size=(10, 4, 4, 1))
    with pytest.raises(ValueError, match=r"class\(es\) \[2, 3, 4, 5, 6, 7, 8, 9\] have no centre"):
        class_centre_mse(x_inv, np.arange(10), centres)
    with pytest.raises(ValueError, match=r"class\(es\) \[10\] have no centre"):
        class_centre_mse(x_inv[:2], [0, 10], centres)
    present = np.flatnonzero(np.all(np.isfinite(centres.reshape(10, -1)), axis=1))
    expected = np.median([np.mean((x_inv[c] - centres[c]) ** 2) for c in present])
    assert class_centre_mse(x_inv[present], present, centres) == pytest.approx(expected)


def test_inversion_traces_again_inside_a_conv_implementation_block():
    # Jitted once per model, it reused the executable traced under the default
    # convolution rule inside models.conv_implementation("xla").
    model = build_model("lenet5")
    f = make_apply_fn(model)
    p = init_params(model, (16, 16, 1), jax.random.key(0))
    obs = Observation(p, jax.tree_util.tree_map(jnp.zeros_like, p), f, "fedsgd", 0.1, 1, None,
                      None, None, (16, 16, 1), 10)
    config = {"aux_images": np.full((16, 16, 1), 0.5, np.float32), "classes": [0, 1],
              "iterations": 2}
    run_attack("model_inversion", obs, config, jax.random.key(0))
    before = model_inversion._invert._cache_size()
    with models.conv_implementation("xla"):
        run_attack("model_inversion", obs, config, jax.random.key(0))
    assert model_inversion._invert._cache_size() == before + 1


def test_model_inversion_is_the_same_under_x64():
    # optax's Adam computed its bias correction in float64 under
    # jax_enable_x64 (fedsim.x64): the same model gave other inputs.
    model = build_model("mlp")
    f = make_apply_fn(model)
    p = init_params(model, (8, 8, 1), jax.random.key(0))
    zero = jax.tree_util.tree_map(jnp.zeros_like, p)
    obs = Observation(zero, p, f, "fedsgd", 0.1, 1, None, None, None, (8, 8, 1), 10)
    aux = np.random.default_rng(0).random((4, 8, 8, 1)).astype(np.float32)
    config = {"aux_images": aux, "iterations": 20, "classes": [1, 5]}
    plain = run_attack("model_inversion", obs, config, jax.random.key(0))
    with jax.enable_x64(True):
        wide = run_attack("model_inversion", obs, config, jax.random.key(0))
    assert wide.x.dtype == plain.x.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(wide.x), np.asarray(plain.x))


def test_class_centres_refuse_labels_that_are_not_one_integer_per_image():
    x = np.random.default_rng(0).random((6, 4, 4, 1))
    y = np.array([0, 1, 2, 0, 1, 2])
    np.testing.assert_allclose(class_centres(x, y, 3)[1], x[[1, 4]].mean(0))
    for bad in (np.eye(3)[y], y[:4], y.astype(np.float32)):  # one-hot: an IndexError before
        with pytest.raises(ValueError, match=r"class_centres: y must be one integer label per "
                                             r"image, shape \(6,\)"):
            class_centres(x, bad, 3)
