"""FedAvg inversion's model of local training against fedsim's own FedAvg client."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from attacks import fedavg_inversion
from attacks import gradient_inversion as GI
from attacks.metrics import multiset_label_accuracy
from fedsim.client import LocalTraining, epoch_order, make_client_update
from fedsim.models import build_model, init_params, make_apply_fn
from fedsim.typing import CohortData, Observation


def _client_upload(apply_fn, params, x, y, batch, lr, key):
    n = x.shape[0]
    update = make_client_update(apply_fn, optax.sgd(lr), LocalTraining("fedavg", 1, batch, n))
    # jitted, as the engine runs it (run eagerly, each op of the unrolled local steps compiled alone)
    return jax.jit(update)(params, CohortData(x, y, jnp.ones(n), jnp.int32(n)), {}, key).update


@pytest.mark.parametrize("n,batch", [(4, 2), (5, 2), (3, 2), (9, 4)])
def test_the_simulated_update_of_the_true_data_is_the_clients_upload(n, batch):
    """At the true data, in the client's own order, the attack's simulator must give
    the upload itself: a partial last batch is the mean over its real rows (the
    wrapped-around rows once counted with full weight, 59-77 % off for n % B != 0)."""
    model = build_model("mlp", 10)
    apply_fn = make_apply_fn(model)
    shape = (8, 8, 1)
    params = init_params(model, shape, jax.random.key(0))
    rng = np.random.default_rng(n * 100 + batch)
    x = jnp.asarray(rng.uniform(size=(n, *shape)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, n), jnp.int32)
    key = jax.random.key(7)
    upload = _client_upload(apply_fn, params, x, y, batch, 0.5, key)
    # The client's first-epoch order (fedsim.client splits its key in four).
    order = np.asarray(epoch_order(jax.random.fold_in(jax.random.split(key, 4)[1], 0),
                                   jnp.ones(n)))
    cfg = GI.InversionConfig(simulate="fedavg", local_steps=-(-n // batch), local_batch=batch,
                             local_lr=0.5)
    simulated = GI.make_simulate(apply_fn, cfg)(params, x[order], jax.nn.one_hot(y[order], 10))
    for got, want in zip(jax.tree_util.tree_leaves(simulated), jax.tree_util.tree_leaves(upload)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


def test_labels_are_inferred_with_the_configured_number_of_local_steps():
    """S set in attack.config (not granted) must scale the observed gradient as a
    granted S does: count-based label inference is not scale-free (with S = 1
    assumed, 12 of 16 labels were right here; with S, all 16)."""
    model = build_model("lenet5", 10)
    apply_fn = make_apply_fn(model)
    shape = (16, 16, 1)
    params = init_params(model, shape, jax.random.key(0))
    rng = np.random.default_rng(0)
    n, batch, lr = 16, 2, 0.05
    x = jnp.asarray(rng.uniform(size=(n, *shape)), jnp.float32)
    y = jnp.asarray(np.sort(rng.choice(10, n)), jnp.int32)
    upload = _client_upload(apply_fn, params, x, y, batch, lr, jax.random.key(0))
    seen = dict(update=upload, params=params, apply_fn=apply_fn, algorithm="fedavg", lr=lr,
                batch_size=batch, num_examples=n, labels=None, input_shape=shape, num_classes=10)
    steps = n // batch
    configured = fedavg_inversion.run(Observation(local_steps=None, **seen),
                                      {"local_steps": steps, "iterations": 1}, jax.random.key(0))
    granted = fedavg_inversion.run(Observation(local_steps=steps, **seen), {"iterations": 1},
                                   jax.random.key(0))
    np.testing.assert_array_equal(configured.labels, granted.labels)
    assert multiset_label_accuracy(np.asarray(granted.labels), np.asarray(y)) == 1.0
