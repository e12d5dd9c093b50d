"""Model inversion moves the auxiliary mean towards the class centres of a trained model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attacks import run_attack
from attacks.gradient_inversion import AttackConfigError
from attacks.model_inversion import class_centre_mse, class_centres
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
