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


def test_gap_rule_returns_every_class_when_no_gap_stands_out():
    """A client holding every class (IID) has no small rows: the gap rule returns all C
    classes when no consecutive ratio of the sorted row norms reaches min_gap (default 2),
    and still cuts at the gap of a 2-class update."""
    k = np.random.default_rng(0).uniform(0.9, 1.1, (84, 10))  # every row a peak
    np.testing.assert_array_equal(R.infer_classes(k, rule="gap"), np.arange(10))
    assert R.largest_gap_ratio(k) < 2.0
    two = np.full((4, 10), 0.01)
    two[:, 3], two[:, 7], two[:, 1] = 5.0, 4.0, 0.1
    np.testing.assert_array_equal(R.infer_classes(two, rule="gap"), [3, 7])
    np.testing.assert_array_equal(R.infer_classes(two, rule="gap", min_gap=100.0), np.arange(10))
    assert len(R.infer_classes(k, rule="gap", min_gap=1.0)) < 10  # 1: always cuts
    with pytest.raises(ValueError, match="min_gap"):
        R.infer_classes(k, rule="gap", min_gap=0.5)


def test_gap_rule_on_lenet5_updates_of_two_and_of_all_classes():
    """On LeNet-5 updates (16 examples per class): a 2-class client and a client holding
    all 10 classes both get their exact class set from the gap rule."""
    ds = synthetic_dataset(seed=0, image_size=16, num_train=400, num_test=10)
    model = build_model("lenet5")
    params = init_params(model, ds.input_shape, jax.random.key(0))
    f = make_apply_fn(model)
    for classes in [(2, 7), tuple(range(10))]:
        sel = np.concatenate([np.flatnonzero(ds.y_train == c)[:16] for c in classes])
        x, y = jnp.asarray(ds.x_train[sel]), jnp.asarray(ds.y_train[sel])
        g = jax.grad(masked_mean_loss, argnums=1)(f, params, x, y, jnp.ones(len(y)))
        last = -0.01 * np.asarray(g["Dense_2"]["kernel"])
        np.testing.assert_array_equal(R.infer_classes(last, rule="gap"), classes)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_update_or_representation_is_refused_by_name(bad):
    # Before: a NaN row norm dropped out of every comparison (the ratio rule
    # returned no class, the gap rule silently left that class out), and the
    # correlation of a NaN vector was NaN, though documented NaN-free.
    k = np.random.default_rng(0).normal(size=(6, 4))
    k[2, 1] = bad
    for rule in ("ratio", "gap"):
        with pytest.raises(ValueError, match=r"FC kernel update \[in, out\] = \[6, 4\] is "
                                             r"NaN/inf at 1 entries"):
            R.infer_classes(k, rule=rule)
    with pytest.raises(ValueError, match="NaN/inf"):
        R.largest_gap_ratio(k)
    with pytest.raises(ValueError, match=r"the inferred representation is NaN/inf at 1 of 3"):
        R.representation_correlation([1.0, 2.0, 3.0], [1.0, bad, 3.0])
