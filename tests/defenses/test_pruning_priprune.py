"""Gumbel-softmax sampler and PriPrune (Alg 3) in a simulation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedsim.simulation import Simulation
from defenses.pruning import flatten
from defenses.pruning.global_mask import masked_gradient
from defenses.pruning.gumbel import gumbel_not_shared
from defenses.pruning.masks import random_mask
from defenses.pruning.priprune import (PriPruneConfig, defense_rate, priprune_client_update,
                                       priprune_defense, privacy_loss)
from tests.fedsim.helpers import small_config, small_dataset


def test_gumbel_hard_limit_frequency_matches_alpha():
    alpha = jnp.array([0.05, 0.3, 0.5, 0.8])
    theta = jnp.log(alpha) - jnp.log1p(-alpha)
    n = 20000
    v = jax.vmap(lambda k: gumbel_not_shared(k, theta, tau=1e-3))(
        jax.random.split(jax.random.key(0), n))
    freq = np.asarray(jnp.mean(v > 0.5, axis=0))
    se = np.sqrt(np.asarray(alpha) * (1 - np.asarray(alpha)) / n)
    assert np.all(np.abs(freq - np.asarray(alpha)) < 4 * se)
    saturated = (np.asarray(v) < 1e-3) | (np.asarray(v) > 1 - 1e-3)
    assert saturated.mean() > 0.99  # hard limit: samples are ~{0,1} (near-ties excepted)
    # A wrong α (0.8 × true) is rejected by the same test.
    assert np.any(np.abs(freq - 0.8 * np.asarray(alpha)) > 4 * se)


def test_gumbel_soft_limit_has_gradient():
    theta = jnp.array([-1.0, 0.0, 2.0])
    g = jax.grad(lambda t: jnp.sum(gumbel_not_shared(jax.random.key(1), t, tau=1.0)))(theta)
    assert np.all(np.isfinite(np.asarray(g))) and np.all(np.asarray(g) > 0)
    g_hard = jax.grad(lambda t: jnp.sum(gumbel_not_shared(jax.random.key(1), t, 1.0, hard=True)))(theta)
    np.testing.assert_allclose(np.asarray(g_hard), np.asarray(g))  # straight-through
    for bad in (0.0, float("nan"), float("inf")):  # NaN used to return NaN masks
        with pytest.raises(ValueError, match="tau"):
            gumbel_not_shared(jax.random.key(0), theta, bad)


def test_privacy_loss_pushes_large_gradients_hardest():
    theta = {"a": jnp.zeros(4), "b": jnp.zeros(4)}
    grad = {"a": jnp.array([4.0, 1.0, 0.0, 0.0]), "b": jnp.ones(4)}
    d = jax.grad(privacy_loss)(theta, grad)
    da, db = np.asarray(d["a"]), np.asarray(d["b"])
    assert da[0] < da[1] < da[2] == 0.0 and np.all(db < 0)  # descent raises α on large |g|


@pytest.mark.slow
@pytest.mark.parametrize("upload", ["update", "weights"])
def test_priprune_simulation_withheld_never_uploaded(upload):
    cfg = small_config(**{"observer.clients": "[1]", "observer.rounds": "[0,1,2]",
                          "training.rounds": 3, "training.algorithm": "fedsgd"})
    ds = small_dataset()
    params = Simulation(cfg, dataset=ds).init_state().params
    base = random_mask(jax.random.key(3), params, 0.3)
    hp = PriPruneConfig(lambda_pri=50.0, alpha_lr=0.5, alpha_init=0.3, upload=upload)
    sim = Simulation(cfg, dataset=ds,
                     defenses={"layer": masked_gradient(base), "upload": priprune_defense(hp)},
                     client_update_factory=priprune_client_update(hp))
    state = sim.init_state()
    state = state._replace(params=jax.tree_util.tree_map(jnp.multiply, state.params, base))
    b = np.asarray(flatten(base))
    rates = []
    for r in range(3):
        state, res = sim.run_round(state, r)
        (obs,) = res.observed
        u = np.asarray(flatten(obs.observation.update))
        if upload == "weights":  # the server receives ŵ = w_g + u
            u = u + np.asarray(flatten(obs.observation.params))
        cs = jax.tree_util.tree_map(lambda s: s[1], state.client_states)["upload"]
        wh = np.asarray(flatten(cs["withheld"]))
        assert np.all(u[wh > 0] == 0) and np.all(u[b == 0] == 0)
        # θ's Adam state persists across the client's rounds (one local step each).
        assert int(jax.tree_util.tree_leaves(cs["alpha_opt"])[0]) == r + 1
        assert np.array_equal(wh, (np.asarray(flatten(cs["theta"])) > 0).astype(np.float32))
        rates.append(float(defense_rate(cs["withheld"])))
    assert 0.0 < rates[-1] < 1.0, rates  # α moved: some, not all, coordinates withheld


def test_priprune_weight_upload_zeroes_the_withheld_weights():
    """upload='weights': w_g + upload is the local model with α > ½ coordinates at 0."""
    from fedsim.hooks import DefenseContext
    g = {"w": jax.random.normal(jax.random.key(0), (5, 4))}
    local = {"w": g["w"] + 0.1 * jax.random.normal(jax.random.key(1), (5, 4))}
    delta = {"w": local["w"] - g["w"]}
    d = priprune_defense(PriPruneConfig(upload="weights"))
    st = d.init(g)
    theta = {"w": jnp.where(jnp.arange(20).reshape(5, 4) % 3 == 0, 2.0, -2.0)}
    out, st = d.apply(delta, {**st, "theta": theta}, context=DefenseContext(
        params=local, global_params=g))
    w_hat = np.asarray(g["w"] + out["w"])
    wh = np.asarray(st["withheld"]["w"]) > 0
    assert wh.sum() == 7 and np.all(w_hat[wh] == 0)
    np.testing.assert_allclose(w_hat[~wh], np.asarray(local["w"])[~wh], atol=1e-6)
    with pytest.raises(ValueError, match="upload must be one of"):
        PriPruneConfig(upload="grads")


@pytest.mark.parametrize("upload", ["update", "weights"])
def test_priprune_that_withholds_nothing_trains_like_plain_fedavg(upload):
    """With α pinned near 0 (nothing ever withheld) PriPrune's client update is the
    engine's: same global model after two rounds (weight step, data order, keys)."""
    cfg = small_config(**{"training.rounds": 2})
    ds = small_dataset()
    params = Simulation(cfg, dataset=ds).init_state().params
    base = random_mask(jax.random.key(3), params, 0.3)
    hp = PriPruneConfig(lambda_pri=0.0, alpha_lr=1e-6, alpha_init=1e-4, upload=upload)
    runs = {
        "plain": Simulation(cfg, dataset=ds, defenses={"layer": masked_gradient(base)}),
        "priprune": Simulation(cfg, dataset=ds, defenses={"layer": masked_gradient(base),
                                                          "upload": priprune_defense(hp)},
                               client_update_factory=priprune_client_update(hp))}
    final = {}
    for name, sim in runs.items():
        state = sim.init_state()
        state = state._replace(params=jax.tree_util.tree_map(jnp.multiply, state.params, base))
        for r in range(2):
            state, _ = sim.run_round(state, r)
        final[name] = np.asarray(flatten(state.params))
        if name == "priprune":
            wh = jax.tree_util.tree_leaves(state.client_states["upload"]["withheld"])
            assert all(float(jnp.sum(w)) == 0 for w in wh)
    np.testing.assert_allclose(final["priprune"], final["plain"], rtol=1e-5, atol=1e-6)
