"""Server aggregation rules: FedAvg's mean and the sparse sender_mean."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedsim.config import ConfigError
from fedsim.server import aggregate
from fedsim.simulation import Simulation

from .helpers import random_zeroing_upload, small_config, small_dataset


def test_sender_mean_by_hand():
    # Three clients, weights 1, 2, 3. Coordinate 0: all send; coordinate 1:
    # client 1 sends 0 (withheld); coordinate 2: nobody sends.
    updates = {"w": jnp.array([[1.0, 4.0, 0.0],
                               [2.0, 0.0, 0.0],
                               [3.0, -2.0, 0.0]])}
    weights = jnp.array([1.0, 2.0, 3.0])
    sender = aggregate(updates, weights, "sender_mean")["w"]
    np.testing.assert_allclose(sender, [(1 + 4 + 9) / 6, (1 * 4 + 3 * -2) / 4, 0.0], rtol=1e-6)
    mean = aggregate(updates, weights)["w"]
    np.testing.assert_allclose(mean, [(1 + 4 + 9) / 6, (1 * 4 + 3 * -2) / 6, 0.0], rtol=1e-6)


def test_sender_mean_equals_mean_when_every_client_sends_everything():
    u = jax.random.normal(jax.random.key(0), (4, 3, 5)) + 10.0  # no exact zeros
    w = jnp.array([1.0, 2.0, 0.5, 4.0])
    chex.assert_trees_all_close(aggregate({"a": u}, w, "sender_mean"), aggregate({"a": u}, w),
                                rtol=1e-6)


def test_unknown_aggregation_is_named():
    with pytest.raises(ValueError, match="unknown aggregation 'median'.*sender_mean"):
        aggregate({"a": jnp.ones((2, 3))}, jnp.ones(2), "median")
    with pytest.raises(ConfigError, match="aggregation"):
        small_config(**{"training.aggregation": "median"})


def _round(strategy, aggregation, ds, **extra):
    cfg = small_config(**{"training.client_parallelism": strategy, "training.chunk_size": 2,
                          "training.aggregation": aggregation, "training.clients_per_round": 3,
                          **extra})
    sim = Simulation(cfg, dataset=ds, defenses={"upload": random_zeroing_upload(0.5)})
    state = sim.init_state()
    return sim, state, sim.run_round(state, 0)[0]


def test_engine_sender_mean_matches_hand_aggregation_of_the_uploads():
    ds = small_dataset()
    sim, state, new = _round("loop", "sender_mean", ds)
    # Recompute every client's upload with the round's keys and aggregate by hand.
    ids = sim.cohort(0)
    _, ckey = sim.round_keys(0)
    ups, ws = [], []
    for cid in ids:
        cs = jax.tree_util.tree_map(lambda s: s[cid], state.client_states)
        out, _ = sim._run_client(state.params, sim._mask_arg(), sim._x, sim._y, sim._idx,
                                 jnp.int32(cid), cs, ckey)
        ups.append(out.update)
        ws.append(out.num_examples)
    stack = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *ups)
    w = jnp.stack(ws)
    expected = aggregate(stack, w, "sender_mean")
    got = jax.tree_util.tree_map(lambda a, b: a - b, new.params, state.params)
    chex.assert_trees_all_close(got, expected, atol=1e-6)
    # And it differs from FedAvg's mean of the same uploads (half the coordinates are 0).
    plain = aggregate(stack, w)
    diffs = [float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree_util.tree_leaves(got),
                                                            jax.tree_util.tree_leaves(plain))]
    assert max(diffs) > 1e-3


def test_strategies_agree_under_sender_mean():
    ds = small_dataset()
    sim, _, new = _round("loop", "sender_mean", ds)
    ref, member = new.params, int(sim.cohort(0)[0])
    variants = [("vmap", {}), ("map", {}), ("chunked", {}),
                ("loop", {"training.loop_clients_per_call": 3}),  # several clients per call
                # the observed client's upload is accumulated on its own path
                ("vmap", {"observer.clients": [member], "observer.rounds": [0]})]
    for strategy, extra in variants:
        got = _round(strategy, "sender_mean", ds, **extra)[2].params
        chex.assert_trees_all_close(got, ref, atol=2e-5, rtol=1e-4)
