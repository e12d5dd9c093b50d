"""FedAvg local epochs each draw their own example order."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedsim.client import LocalTraining, epoch_order, make_client_update
from fedsim.data import synthetic_dataset
from fedsim.models import build_model, init_params, make_apply_fn
from fedsim.typing import CohortData


@pytest.mark.parametrize("unroll_steps", [0, 32])
def test_two_local_epochs_match_a_hand_loop_with_one_order_per_epoch(unroll_steps):
    # Independent computation: a hand loop of plain SGD steps, each on the mean
    # cross-entropy (log-softmax written out) of the next B examples of the
    # epoch's order; epoch e's order is epoch_order(fold_in(k_order, e), mask),
    # k_order the second of the four keys split from the client key. 7 real
    # examples padded to 8, B = 3: batches of 3, 3, 1 per epoch, 2 epochs.
    ds = synthetic_dataset(seed=4, image_size=8, num_train=7, num_test=1)
    n, n_max, B, lr, epochs = 7, 8, 3, 0.5, 2
    mask = jnp.asarray([1.0] * n + [0.0] * (n_max - n))
    x = jnp.concatenate([jnp.asarray(ds.x_train), jnp.zeros((1, 8, 8, 1))])
    y = jnp.concatenate([jnp.asarray(ds.y_train), jnp.zeros((1,), jnp.int32)])
    data = CohortData(x, y, mask, jnp.int32(n))
    model = build_model("mlp", 10)
    apply_fn = make_apply_fn(model)
    params0 = init_params(model, (8, 8, 1), jax.random.key(0))
    key = jax.random.key(11)

    update = make_client_update(apply_fn, optax.sgd(lr),
                                LocalTraining("fedavg", epochs, B, n_max, unroll_steps))
    out = jax.jit(update)(params0, data, {}, key)

    def mean_ce(p, xb, yb):
        logits = apply_fn(p, xb)
        logp = logits - jax.scipy.special.logsumexp(logits, axis=-1, keepdims=True)
        return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=1))

    grad = jax.jit(jax.grad(mean_ce))
    k_order = jax.random.split(key, 4)[1]
    orders = [np.asarray(epoch_order(jax.random.fold_in(k_order, e), mask))[:n]
              for e in range(epochs)]
    assert sorted(orders[0].tolist()) == list(range(n))
    assert orders[0].tolist() != orders[1].tolist()  # the epochs' orders differ
    params = params0
    for order in orders:
        for start in range(0, n, B):
            idx = order[start:start + B]
            g = grad(params, x[idx], y[idx])
            params = jax.tree_util.tree_map(lambda p, gi: p - lr * gi, params, g)
    expected = jax.tree_util.tree_map(lambda a, b: a - b, params, params0)

    # The same hand loop with ONE order for both epochs must differ, else the
    # test could not tell the epochs' orders apart.
    same = params0
    for _ in range(epochs):
        for start in range(0, n, B):
            idx = orders[0][start:start + B]
            same = jax.tree_util.tree_map(lambda p, gi: p - lr * gi, same,
                                          grad(same, x[idx], y[idx]))
    gap = max(float(jnp.max(jnp.abs(a - b))) for a, b in
              zip(jax.tree_util.tree_leaves(same), jax.tree_util.tree_leaves(params)))
    assert gap > 1e-4

    for got, want in zip(jax.tree_util.tree_leaves(out.update),
                         jax.tree_util.tree_leaves(expected)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5)
