"""Largest / Random / Mix defense pruning and Pseudo-Pruning, incl. the observer's view."""

import chex
import jax
import numpy as np
import pytest

from fedsim.hooks import DefenseContext, build_defense, chain
from fedsim.simulation import Simulation
from defenses.pruning import flatten
from defenses.pruning.global_mask import masked_gradient, masked_upload
from defenses.pruning.masks import random_mask
from tests.fedsim.helpers import small_config, small_dataset


def _tree(key):
    k1, k2 = jax.random.split(key)
    return {"w": jax.random.normal(k1, (12, 9)), "b": jax.random.normal(k2, (9,))}


def test_largest_withholds_exactly_the_largest():
    tree = _tree(jax.random.key(0))
    d = build_defense("prune_largest", p=0.25)
    out, _ = d.apply(tree, d.init(tree), key=jax.random.key(1))
    v, o = np.asarray(flatten(tree)), np.asarray(flatten(out))
    k = round(0.25 * v.size)
    top = np.argsort(-np.abs(v))[:k]
    assert np.all(o[top] == 0)
    np.testing.assert_array_equal(np.delete(o, top), np.delete(v, top))


@pytest.mark.parametrize("name,kw", [("prune_random", {"p": 0.4}),
                                     ("prune_mix", {"p_largest": 0.2, "p_random": 0.3})])
def test_random_and_mix_contract(name, kw):
    tree = _tree(jax.random.key(0))
    d = build_defense(name, **kw)
    st = d.init(tree)
    a, _ = d.apply(tree, st, key=jax.random.key(1))
    b, _ = d.apply(tree, st, key=jax.random.key(1))
    c, _ = d.apply(tree, st, key=jax.random.key(2))
    j, _ = jax.jit(lambda t, k: d.apply(t, st, key=k))(tree, jax.random.key(1))
    chex.assert_trees_all_close(a, b)
    chex.assert_trees_all_close(a, j)
    chex.assert_trees_all_equal_shapes_and_dtypes(a, tree)
    assert not np.array_equal(np.asarray(flatten(a)), np.asarray(flatten(c)))
    total = sum(kw.values())
    zeros = int(np.sum(np.asarray(flatten(a)) == 0))
    assert zeros == round(kw.get("p_largest", 0) * 117) + round(kw.get("p_random", kw.get("p", 0)) * 117)
    assert abs(zeros / 117 - total) < 0.02
    if name == "prune_mix":  # the largest 20 % are all withheld
        v = np.asarray(flatten(tree))
        assert np.all(np.asarray(flatten(a))[np.argsort(-np.abs(v))[: round(0.2 * 117)]] == 0)


def test_rates_are_of_the_shared_coordinates():
    """After base pruning, p̂ is a fraction of the nonzero coordinates, never of d."""
    tree = _tree(jax.random.key(0))
    tree = {**tree, "w": tree["w"].at[:6].set(0.0)}  # 54 of 117 pruned by the base
    for name, kw, expect in (("prune_largest", {"p": 0.3}, round(0.3 * 63)),
                             ("prune_mix", {"p_largest": 0.2, "p_random": 0.2},
                              round(0.2 * 63) + round(0.2 * 63))):
        d = build_defense(name, **kw)
        out, _ = d.apply(tree, d.init(tree), key=jax.random.key(1))
        o = np.asarray(flatten(out))
        assert int(np.sum(o == 0)) == 54 + expect
        assert np.all(o[np.asarray(flatten(tree)) == 0] == 0)


def test_bad_rates_are_clear_errors():
    with pytest.raises(ValueError, match="p_largest"):
        build_defense("prune_largest", p=2.0)
    with pytest.raises(ValueError, match="<= 1"):
        build_defense("prune_mix", p_largest=0.6, p_random=0.6)
    # A quoted "false" in a config would otherwise switch Pseudo-Pruning on.
    with pytest.raises(ValueError, match="pseudo must be true or false, got 'false'"):
        build_defense("prune_largest", p=0.3, pseudo="false")


def test_pseudo_pruning_state_and_begin_round():
    g = _tree(jax.random.key(0))
    local = _tree(jax.random.key(1))
    delta = jax.tree_util.tree_map(lambda a, b: a - b, local, g)
    d = build_defense("prune_largest", p=0.3, pseudo=True)
    st = d.init(g)
    start, st = d.begin_round(g, st, key=jax.random.key(2))
    chex.assert_trees_all_close(start, g)  # nothing withheld before the first upload
    out, st = d.apply(delta, st, key=jax.random.key(3), context=DefenseContext(params=local))
    wh = np.asarray(flatten(st["withheld"]))
    assert wh.sum() == round(0.3 * 117)
    assert np.all(np.asarray(flatten(out))[wh > 0] == 0)
    g2 = _tree(jax.random.key(4))
    start, _ = d.begin_round(g2, st, key=jax.random.key(5))
    expect = np.where(wh > 0, np.asarray(flatten(local)), np.asarray(flatten(g2)))
    np.testing.assert_allclose(np.asarray(flatten(start)), expect)


@pytest.mark.parametrize("upload", ["update", "weights"])
def test_observer_never_sees_withheld_or_pruned_weights(upload):
    """End to end: base mask + Largest (Pseudo) in a simulation, on the observer's view
    (for weight uploads the server receives ŵ = w_g + upload)."""
    cfg = small_config(**{"observer.clients": "[1]", "observer.rounds": "[0,1]",
                          "training.rounds": 2})
    sim0 = Simulation(cfg, dataset=small_dataset())
    params = sim0.init_state().params
    base = random_mask(jax.random.key(7), params, 0.3)
    defense = chain(masked_upload(base), build_defense("prune_largest", p=0.2, pseudo=True,
                                                       upload=upload))
    sim = Simulation(cfg, dataset=small_dataset(),
                     defenses={"layer": masked_gradient(base), "upload": defense})
    state = sim.init_state()
    state = state._replace(params=jax.tree_util.tree_map(lambda p, m: p * m, state.params, base))
    b = np.asarray(flatten(base))
    for r in range(2):
        prev_cs = jax.tree_util.tree_map(lambda s: s[1], state.client_states)
        state, res = sim.run_round(state, r)
        (obs,) = res.observed
        u = np.asarray(flatten(obs.observation.update))
        if upload == "weights":
            u = u + np.asarray(flatten(obs.observation.params))
        withheld = np.asarray(flatten(
            jax.tree_util.tree_map(lambda s: s[1], state.client_states)["upload"][1]["withheld"]))
        assert np.all(u[b == 0] == 0), "a pruned weight reached the server"
        assert np.all(u[withheld > 0] == 0), "a withheld weight reached the server"
        # The rate is of what the client would share: the nonzero base-pruned update.
        assert withheld.sum() == round(0.2 * (np.sum(u != 0) + withheld.sum()))
        # Pruned weights stay zero in the global model (Alg 1 line 11 holds by construction).
        assert np.all(np.asarray(flatten(state.params))[b == 0] == 0)
        del prev_cs


def test_weight_upload_is_the_masked_weights_as_an_update():
    """upload='weights': w_g + upload = (w_g + Δ) ⊙ m̂, withheld weights exactly 0."""
    g = _tree(jax.random.key(0))
    local = _tree(jax.random.key(1))
    delta = jax.tree_util.tree_map(lambda a, b: a - b, local, g)
    d = build_defense("prune_largest", p=0.3, upload="weights")
    out, _ = d.apply(delta, d.init(g), key=jax.random.key(2),
                     context=DefenseContext(params=local, global_params=g))
    ref, _ = build_defense("prune_largest", p=0.3).apply(delta, (), key=jax.random.key(2))
    kept = np.asarray(flatten(ref)) != 0
    w_hat = np.asarray(flatten(g)) + np.asarray(flatten(out))
    np.testing.assert_allclose(w_hat[kept], np.asarray(flatten(local))[kept], atol=1e-6)
    assert np.all(w_hat[~kept] == 0) and (~kept).sum() == round(0.3 * 117)
    with pytest.raises(ValueError, match="global params"):
        d.apply(delta, d.init(g), key=jax.random.key(2))
    with pytest.raises(ValueError, match="upload must be one of"):
        build_defense("prune_largest", p=0.3, upload="grads")


def test_weight_uploads_aggregate_as_alg1_line11():
    """FedAvg of weight uploads = Σ_i p_i ŵ_i: a weight withheld by every client becomes 0,
    while with update uploads it keeps its global value (the two semantics, end to end)."""
    cfg = small_config(**{"training.rounds": 1, "training.clients_per_round": 4,
                          "data.num_clients": 4, "observer.clients": "[0,1,2,3]",
                          "observer.rounds": "[0]"})
    finals = {}
    for upload in ("weights", "update"):
        sim = Simulation(cfg, dataset=small_dataset(),
                         defenses={"upload": build_defense("prune_largest", p=0.2,
                                                           upload=upload)})
        state = sim.init_state()
        w0 = np.asarray(flatten(state.params))
        new, res = sim.run_round(state, 0)
        ups = [np.asarray(flatten(o.observation.update)) for o in res.observed]
        n = np.asarray([float(o.observation.num_examples or 1) for o in res.observed])
        w_hat = [w0 + u for u in ups]
        if upload == "weights":
            expect = sum(p * w for p, w in zip(n / n.sum(), w_hat))
            np.testing.assert_allclose(np.asarray(flatten(new.params)), expect, atol=1e-6)
            every = np.all([w == 0 for w in w_hat], axis=0) & (w0 != 0)
            assert every.sum() > 0  # some weight withheld by all four clients ...
            # ... is 0 globally (up to the float32 rounding of Σ p_i (−w_g), ~1e-8)
            np.testing.assert_allclose(np.asarray(flatten(new.params))[every], 0.0, atol=1e-6)
        finals[upload] = (np.asarray(flatten(new.params)), w0, every)
    p_upd, w0, every = finals["update"]
    np.testing.assert_allclose(p_upd[every], w0[every], atol=1e-6)  # update: unchanged
