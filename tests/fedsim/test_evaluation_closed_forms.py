"""Test metrics and the round's training loss against numpy computed from logits."""

import jax.numpy as jnp
import numpy as np

from fedsim.data import synthetic_dataset
from fedsim.simulation import Simulation
from tests.fedsim.helpers import small_config


def _np_cross_entropy(logits, y):
    """Per-example softmax cross-entropy in float64 numpy (log-sum-exp written out)."""
    z = np.asarray(logits, np.float64)
    zmax = z.max(axis=1, keepdims=True)
    lse = zmax[:, 0] + np.log(np.sum(np.exp(z - zmax), axis=1))
    return lse - z[np.arange(len(y)), y]


def test_evaluate_with_a_padded_last_batch_matches_one_forward_pass_in_numpy():
    # Independent computation: 203 test examples in eval batches of 50 (the last
    # batch carries 47 padding rows). Accuracy = #(argmax logits == y) / 203 and
    # loss = mean cross-entropy over the 203, both in numpy from ONE forward pass
    # over all of x_test. The last layer's columns 0 and k are swapped so that the
    # model predicts class 0 for an all-zero image: the padding rows (x = 0, y = 0)
    # would then count as correct if they were not masked out.
    ds = synthetic_dataset(seed=1, image_size=8, num_train=40, num_test=203)
    cfg = small_config(**{"data.image_size": 8, "data.num_clients": 2, "data.partition": "iid",
                          "training.clients_per_round": 2, "eval.batch_size": 50})
    sim = Simulation(cfg, dataset=ds)
    params = sim.init_state().params
    k = int(np.argmax(np.asarray(sim.eval_fn(params, jnp.zeros((1, 8, 8, 1))))[0]))
    last = sorted(params)[-1]  # the output Dense (no bias in the MLP)
    w = np.array(params[last]["kernel"])
    w[:, [0, k]] = w[:, [k, 0]]
    params = {**params, last: {**params[last], "kernel": jnp.asarray(w)}}
    assert int(np.argmax(np.asarray(sim.eval_fn(params, jnp.zeros((1, 8, 8, 1))))[0])) == 0

    logits = np.asarray(sim.eval_fn(params, jnp.asarray(ds.x_test)))
    y = np.asarray(ds.y_test)
    correct = int(np.sum(np.argmax(logits, axis=1) == y))
    assert 0 < correct < 203
    acc, loss = sim.evaluate(params)
    np.testing.assert_allclose(acc, correct / 203, rtol=1e-6)
    np.testing.assert_allclose(loss, np.mean(_np_cross_entropy(logits, y)), rtol=1e-5)


def test_round_train_loss_is_the_example_weighted_mean_of_the_clients_losses():
    # Independent computation: FedSGD, 2 clients of 3 and 2 examples (iid split of 5),
    # both in the round. A FedSGD client's loss is the mean cross-entropy over its
    # examples at the global params (numpy, from logits); the round's train_loss is
    # Σ n_c L_c / Σ n_c, not the plain mean of the L_c.
    ds = synthetic_dataset(seed=2, image_size=8, num_train=5, num_test=10)
    cfg = small_config(**{"data.image_size": 8, "data.num_clients": 2, "data.partition": "iid",
                          "training.clients_per_round": 2, "training.algorithm": "fedsgd",
                          "training.lr": 0.1, "training.rounds": 1})
    sim = Simulation(cfg, dataset=ds)
    state = sim.init_state()
    losses, counts = [], []
    for part in sim.partitions:
        logits = np.asarray(sim.apply_fn(state.params, jnp.asarray(ds.x_train[part])))
        losses.append(np.mean(_np_cross_entropy(logits, np.asarray(ds.y_train[part]))))
        counts.append(len(part))
    assert sorted(counts) == [2, 3]
    weighted = np.dot(counts, losses) / np.sum(counts)
    # The weighted and the plain mean must differ well beyond float32 noise.
    assert abs(weighted - np.mean(losses)) > 1e-4
    _, res = sim.run_round(state, 0)
    np.testing.assert_allclose(res.train_loss, weighted, rtol=1e-5)
