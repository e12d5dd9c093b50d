"""Local training: per-step randomness, padding in the scan path, the reported loss.

Each test checks ``make_client_update`` against a property its module
docstring states or a hand computation, never a value the code produced.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedsim.client import LocalTraining, init_client_state, make_client_update
from fedsim.hooks import Defense
from fedsim.models import build_model, init_params, make_apply_fn
from fedsim.typing import CohortData


@pytest.fixture(scope="module")
def setup():
    model = build_model("mlp")
    params = init_params(model, (8, 8, 1), jax.random.key(0))
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(13, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, 13).astype(np.int32)
    return make_apply_fn(model), params, x, y


def _data(x, y, n_max):
    n, pad = len(y), n_max - len(y)
    return CohortData(jnp.concatenate([x, np.zeros((pad,) + x.shape[1:], np.float32)]),
                      jnp.concatenate([y, np.zeros(pad, np.int32)]),
                      jnp.concatenate([jnp.ones(n), jnp.zeros(pad)]), jnp.int32(n))


def _noise_layer_defense() -> Defense:
    """A 'layer' defense that replaces the batch gradient by N(0, 1) noise from its key."""

    def apply(g, state, *, key, context=None):
        leaves, treedef = jax.tree_util.tree_flatten(g)
        keys = jax.random.split(key, len(leaves))
        return jax.tree_util.tree_unflatten(
            treedef, [jax.random.normal(k, l.shape, l.dtype) for k, l in zip(keys, leaves)]), state

    return Defense(init=lambda p: (), apply=apply, stage="layer", name="noise")


def test_each_local_step_draws_its_own_defense_noise(setup):
    """Kills ``fold_in(k_steps, 0)`` (one key for every local step's defenses).

    Reference: a step's defense randomness must be fresh (DP-SGD, Abadi et al.
    2016, Alg 1: noise drawn anew at each step). With the gradient replaced by
    N(0, 1) noise and SGD(lr = 1), Δ = −Σ_s n_s over S = 4 steps: each coordinate
    has variance S = 4 when the steps' draws are independent, S² = 16 when all
    steps reuse one draw. The MLP has 4,100 coordinates, so the sample variance
    is 4 ± 0.09 (one sd; the bounds are ±5.7 sd). The steps run in the scan
    (``unroll_steps=0``, faster to compile); the unrolled steps share ``do_step``.
    """
    apply_fn, params, x, y = setup
    x, y = x[:12], y[:12]
    defenses = {"layer": _noise_layer_defense()}
    fn = make_client_update(apply_fn, optax.sgd(1.0),
                            LocalTraining("fedavg", 1, 3, 12, unroll_steps=0), defenses)
    out = jax.jit(fn)(params, _data(x, y, 12), init_client_state(defenses, params),
                      jax.random.key(5))
    delta = np.concatenate([np.ravel(l) for l in jax.tree_util.tree_leaves(out.update)])
    assert delta.size > 4000
    assert 3.5 < delta.var() < 4.5, delta.var()


def test_a_padded_client_takes_the_same_steps_in_the_scan(setup):
    """Kills ``has_data = jnp.any(idx >= 0)`` in ``scan_step`` (padding-only batches run).

    Reference: the module docstring: a padded client takes exactly the same
    optimizer steps as the unpadded one, since a batch holding only padding is
    skipped (``lax.cond`` inside the scan) and changes neither the parameters
    nor the optimizer state. With momentum a padding-only step would still move
    the parameters (zero gradient, non-zero velocity), and its loss 0 would be
    averaged into the reported loss. 13 examples, B = 4: 4 batches unpadded, 8
    padded to 32, 4 of them padding only (the scan path: ``unroll_steps=0``).
    """
    apply_fn, params, x, y = setup
    tx = optax.sgd(0.2, momentum=0.9)
    outs = []
    for n_max in (13, 32):
        fn = make_client_update(apply_fn, tx, LocalTraining("fedavg", 2, 4, n_max, unroll_steps=0))
        outs.append(jax.jit(fn)(params, _data(x, y, n_max), {}, jax.random.key(3)))
    for a, b in zip(jax.tree_util.tree_leaves(outs[0].update),
                    jax.tree_util.tree_leaves(outs[1].update)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    np.testing.assert_allclose(float(outs[0].loss), float(outs[1].loss), rtol=1e-5)


def _mean_of_real_examples() -> Defense:
    """An 'example' defense reducing per-example gradients to their mean over real examples."""

    def apply(per_ex, state, *, key=None, context=None):
        m = jnp.sum(context.mask)
        return jax.tree_util.tree_map(lambda g: jnp.sum(g, axis=0) / m, per_ex), state

    return Defense(init=lambda p: (), apply=apply, stage="example", name="mean")


@pytest.mark.parametrize("n_max", [13, 20])
def test_the_loss_under_an_example_defense_is_the_mean_over_real_examples(setup, n_max):
    """Kills ``loss = jnp.mean(losses)`` in the example-stage gradient (padding averaged in).

    Reference: the module docstring: the loss is a masked mean over the real
    examples. FedSGD is one step on the start parameters, so the reported loss
    is the mean cross-entropy of the 13 real examples there, written out here
    with a numpy log-softmax, whatever the padding (n_max 13 or 20).
    """
    apply_fn, params, x, y = setup
    defenses = {"example": _mean_of_real_examples()}
    fn = make_client_update(apply_fn, optax.sgd(0.1), LocalTraining("fedsgd", 1, 13, n_max),
                            defenses)
    out = jax.jit(fn)(params, _data(x, y, n_max), init_client_state(defenses, params),
                      jax.random.key(0))
    logits = np.asarray(apply_fn(params, jnp.asarray(x)), np.float64)
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    expected = -logp[np.arange(13), y].mean()
    np.testing.assert_allclose(float(out.loss), expected, rtol=1e-5)
