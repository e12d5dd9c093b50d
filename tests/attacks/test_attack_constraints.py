"""Constraints the attacks must keep: the [0, 1] box of gradient matching and of
model inversion (each step checked against a hand-written projected loop), and
the membership features' label column being the *true* label."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from attacks import membership as MIA
from attacks import gradient_inversion as GI
from attacks import run_attack
from attacks.api import observation_from_gradient
from fedsim.typing import Observation

SHAPE = (4, 4, 1)
K = 3


def linear(params, x):
    """A one-layer softmax-regression model (a top-level Dense: attacks.labels finds it)."""
    d = params["dense"]
    return x.reshape(x.shape[0], -1) @ d["kernel"] + d["bias"]


def _params(seed, bias=None):
    rng = np.random.default_rng(seed)
    kernel = jnp.asarray(rng.normal(0, 1, (int(np.prod(SHAPE)), K)), jnp.float32)
    bias = jnp.zeros(K, jnp.float32) if bias is None else jnp.asarray(bias, jnp.float32)
    return {"dense": {"kernel": kernel, "bias": bias}}


def _victim_gradient(params, x, y):
    return jax.grad(lambda p: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
        linear(p, x), y)))(params)


# --- A5: the box constraint of first-order gradient matching ---------------------------

def _projected_adam_reference(params, target, labels, x0, lr, steps):
    """Independent computation: the l2 gradient-matching loss written out by hand
    (Σ‖∇θ CE(x̂, onehot(y)) − g‖², DLG Eq. 4), plain optax.adam on x̂ alone (the
    labels are fixed), and x̂ ← clip(x̂, 0, 1) after every step."""
    y1 = jax.nn.one_hot(labels, K, dtype=jnp.float32)

    def loss(x):
        sim = jax.grad(lambda p: jnp.mean(optax.softmax_cross_entropy(linear(p, x), y1)))(params)
        return sum(jnp.sum((a - b) ** 2) for a, b in
                   zip(jax.tree_util.tree_leaves(sim), jax.tree_util.tree_leaves(target)))

    grad = jax.jit(jax.grad(loss))
    opt = optax.adam(lr)
    x, s = x0, opt.init(x0)
    unclipped_left_box = False
    for _ in range(steps):
        u, s = opt.update(grad(x), s, x)
        x = optax.apply_updates(x, u)
        unclipped_left_box |= bool(jnp.any((x < 0) | (x > 1)))
        x = jnp.clip(x, 0.0, 1.0)
    return np.asarray(x), unclipped_left_box


def test_first_order_inversion_projects_onto_the_box_every_step():
    params = _params(0)
    rng = np.random.default_rng(1)
    x_true = jnp.asarray(rng.random((2, *SHAPE)), jnp.float32)
    labels = jnp.asarray([0, 2], jnp.int32)
    target = _victim_gradient(params, x_true, labels)
    lr, steps = 2.0, 3  # Adam's first step moves each pixel by ≈ lr: far outside [0, 1]
    cfg = GI.InversionConfig(loss="l2", tv=0.0, optimizer="adam", lr=lr, iterations=steps,
                             restarts=1, signed=False, decay=False, box=True)
    invert = jax.jit(GI.make_inverter(linear, cfg, 2, SHAPE, K))
    key = jax.random.key(3)
    x_all, _, _ = invert(params, target, labels, key)
    got = np.asarray(x_all[0])
    # The attack's start (its one restart's key), then the hand-written projected loop.
    x0 = GI.initial_dummy(jax.random.split(key, 1)[0], cfg, 2, SHAPE, K)["x"]
    want, left = _projected_adam_reference(params, target, labels, x0, lr, steps)
    assert left, "the test is vacuous: the unprojected steps never left [0, 1]"
    assert got.min() >= 0.0 and got.max() <= 1.0, (got.min(), got.max())
    assert np.any(got == 0.0) and np.any(got == 1.0), "the projection never acted"
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_inverting_gradients_run_keeps_pixels_in_the_box():
    # Through the public attack: signed Adam at lr 2 moves every pixel by 2 on its
    # first step, so only the projection onto [0, 1] keeps the result in the box.
    params = _params(4)
    rng = np.random.default_rng(5)
    x_true = jnp.asarray(rng.random((1, *SHAPE)), jnp.float32)
    y = jnp.asarray([1], jnp.int32)
    obs = observation_from_gradient(_victim_gradient(params, x_true, y), params, linear,
                                    input_shape=SHAPE, num_classes=K, lr=0.1, labels=y,
                                    batch_size=1)
    rec = run_attack("inverting_gradients", obs,
                     {"lr": 2.0, "iterations": 3, "tv": 0.0, "box": True, "decay": False},
                     jax.random.key(0))
    x = np.asarray(rec.x)
    assert x.min() >= 0.0 and x.max() <= 1.0, (x.min(), x.max())
    assert np.any(x == 0.0) and np.any(x == 1.0), "the projection never acted"


# --- A6: model inversion's projection onto the image domain ------------------------------

def test_model_inversion_is_projected_adam():
    params = _params(6)
    rng = np.random.default_rng(7)
    aux = rng.uniform(0.3, 0.7, (5, *SHAPE)).astype(np.float32)
    lr, steps = 0.5, 4
    obs = Observation(jax.tree_util.tree_map(jnp.zeros_like, params), params, linear, "fedsgd",
                      0.1, 1, None, None, None, SHAPE, K)
    rec = run_attack("model_inversion", obs,
                     {"aux_images": aux, "iterations": steps, "lr": lr, "model": "global"},
                     jax.random.key(0))
    got = np.asarray(rec.x)
    assert got.min() >= 0.0 and got.max() <= 1.0, (got.min(), got.max())
    # Independent computation: Fredrikson et al.'s MI-Face cost 1 − softmax_c(x)
    # from the auxiliary mean, optax.adam(lr) and x ← clip(x, 0, 1) after every
    # step (the projection onto the image domain), one class at a time.
    left = False
    for c in range(K):
        cost = lambda x: 1.0 - jax.nn.softmax(linear(params, x[None]))[0, c]
        opt = optax.adam(lr)
        x = jnp.asarray(aux.mean(0))
        s = opt.init(x)
        for _ in range(steps):
            u, s = opt.update(jax.grad(cost)(x), s, x)
            x = optax.apply_updates(x, u)
            left |= bool(jnp.any((x < 0) | (x > 1)))
            x = jnp.clip(x, 0.0, 1.0)
        np.testing.assert_allclose(got[c], np.asarray(x), atol=1e-5, err_msg=f"class {c}")
    assert left, "the test is vacuous: the unprojected steps never left [0, 1]"
    assert np.any(got == 0.0) and np.any(got == 1.0), "the projection never acted"


# --- A10: the membership features' label column --------------------------------------------

def test_membership_label_feature_is_the_true_label_of_misclassified_examples():
    # A bias of +20 on class 0 makes the model predict 0 for every input, so the
    # examples labelled 1 and 2 are misclassified: their label feature must be
    # one_hot(y) (Nasr et al.'s "one-hot true label"), not one_hot(prediction).
    params = _params(8, bias=[20.0, 0.0, 0.0])
    rng = np.random.default_rng(9)
    x = jnp.asarray(rng.random((6, *SHAPE)), jnp.float32)
    y = np.array([1, 2, 0, 2, 1, 1], np.int32)
    pred = np.argmax(np.asarray(linear(params, x)), -1)
    assert np.sum(pred != y) == 5, pred
    f = MIA.features(linear, params, x, jnp.asarray(y), K)
    # Independent computation: numpy's identity rows indexed by the true labels.
    np.testing.assert_array_equal(np.asarray(f.label_onehot), np.eye(K, dtype=np.float32)[y])
