"""Checks of attacks/labels.py, each against an independent computation.

* ``observed_gradient`` of a FedSGD upload is −Δ/lr whatever ``local_steps`` says
  (module docstring: "For FedSGD, Δ = −lr·∇L exactly, so ∇L = −Δ/lr").
* count-based inference on a handmade signal (closed form of the docstring:
  n_c = B·(s_c − b_c)/(a_c − b_c), largest remainder), in the case where more
  classes carry a negative signal than the batch has examples.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attacks import labels as L
from fedsim.typing import Observation


def test_fedsgd_gradient_ignores_local_steps():
    """Kills L4 (labels.py ``scale``: ``(steps if algorithm != "fedsgd" else 1)`` → ``steps``).

    Reference: labels.py docstring of :func:`observed_gradient`: for FedSGD
    Δ = −lr·∇L exactly, so ∇L = −Δ/lr; the S of FedAvg's −Δ/(lr·S) does not
    apply. An observation saying ``local_steps=4`` (a FedSGD client that was
    granted a step count) must still give −Δ/lr, and a FedAvg one −Δ/(lr·4).
    """
    g = np.array([0.5, -1.25, 2.0], np.float32)
    lr = 0.2
    common = dict(update={"a": jnp.asarray(-lr * g)}, params=None, apply_fn=None, lr=lr,
                  local_steps=4, batch_size=None, num_examples=None, labels=None,
                  input_shape=(1,), num_classes=3)
    sgd = L.observed_gradient(Observation(algorithm="fedsgd", **common))
    np.testing.assert_allclose(np.asarray(sgd["a"]), g, rtol=1e-6)
    avg = L.observed_gradient(Observation(algorithm="fedavg", **common))
    np.testing.assert_allclose(np.asarray(avg["a"]), g / 4, rtol=1e-6)


def _zero_last_layer(num_in=16, hidden=12, num_classes=6, seed=3):
    """A ReLU MLP whose bias-free last layer is 0: p = 1/K for every input, h ≥ 0."""
    rng = np.random.default_rng(seed)
    params = {"hidden": {"kernel": jnp.asarray(rng.standard_normal((num_in, hidden)), jnp.float32),
                         "bias": jnp.asarray(0.1 * rng.standard_normal(hidden), jnp.float32)},
              "out": {"kernel": jnp.zeros((hidden, num_classes), jnp.float32)}}

    def apply_fn(p, x):
        h = jax.nn.relu(x.reshape(x.shape[0], -1) @ p["hidden"]["kernel"] + p["hidden"]["bias"])
        return h @ p["out"]["kernel"]

    return apply_fn, params


@pytest.mark.parametrize("e,want", [((0.9, 0.7, 0.4), [1, 1, 0]), ((0.4, 0.7, 0.9), [0, 1, 1])])
def test_more_negative_classes_than_examples_keeps_the_largest_estimates(e, want):
    """More classes with a negative signal than B: the B largest estimates, one example each.

    Reference, by hand from the labels.py docstring: with p = 1/K for every
    input (zero, bias-free last layer) a_c = h̄(1/K − 1), b_c = h̄/K, so a
    signal s_c = h̄(1/K − e_c/B) has the estimate n_c = e_c exactly. With
    B = 2 and three estimates e > 0 (a noisy upload), three classes have a
    negative signal; they cannot all get an example, and the batch holds the
    two estimated most numerous. Before the fix, every present estimate was
    floored at 1, so all three tied and the rounding kept the lowest class ids
    whatever the estimates (the second case gave [1, 1, 0]); with the donor
    rule ``counts[donor] > 1`` → ``>= 1`` the first case emptied class 0.
    """
    K, B = 6, 2
    apply_fn, params = _zero_last_layer(num_classes=K)
    key = jax.random.key(5)
    a, b = (np.asarray(v, np.float64) for v in
            L._impacts(apply_fn, params, (4, 4, 1), K, key, 32, None))
    hbar = float(b.sum())  # Σ_c ‖h‖ p_c = mean ‖h‖ (Σ_c p_c = 1)
    np.testing.assert_allclose(b, hbar / K, rtol=1e-5)          # closed form b_c
    np.testing.assert_allclose(a, hbar * (1 / K - 1), rtol=1e-5)  # closed form a_c
    e = np.array([*e, 0.0, 0.0, 0.0])
    s = hbar * (1 / K - e / B)
    assert np.sum(s < 0) == 3 > B
    grad = {"hidden": {"kernel": jnp.zeros((16, 12))},
            "out": {"kernel": jnp.asarray(np.outer(np.full(12, 1 / 12), s), jnp.float32)}}
    counts = L.infer_label_counts(grad, apply_fn, params, B, (4, 4, 1), K, key, num_dummy=32)
    np.testing.assert_array_equal(counts, [*want, 0, 0, 0])


def test_largest_remainder_of_all_zero_estimates_still_sums_to_the_total():
    """Kills L5 (labels.py ``largest_remainder``: the all-zero fallback ``if est.sum() <= 0``
    skipped).

    Reference: the function's contract ("Round non-negative reals to integers
    summing to ``total``") holds for the all-zero vector too (every class's
    estimate clipped at 0, e.g. a noisy upload with no negative signal): the
    result must be non-negative integers summing to ``total``, and with equal
    (zero) estimates no class gets more than ⌈total / K⌉.
    """
    for total, k in ((3, 5), (4, 4), (7, 3)):
        counts = L.largest_remainder(np.zeros(k), total)
        assert counts.sum() == total, (total, k, counts)
        assert counts.min() >= 0 and counts.max() <= -(-total // k), (total, k, counts)
