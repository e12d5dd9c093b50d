import re
from typing import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedsim.client import LocalTraining, make_client_update
from fedsim.config import ConfigError
from fedsim.hooks import Defense
from fedsim.server import aggregate, server_update
from fedsim.simulation import NonFiniteError, Simulation

from .helpers import small_config, small_dataset


def test_fedavg_weighting_two_clients_by_hand():
    # Two clients with 1 and 3 examples; FedSGD, lr 1, a linear "model" whose
    # per-client update we can write down: Δ_c = -∇L_c.
    updates = {"w": jnp.array([[1.0, 2.0], [5.0, -2.0]])}
    weights = jnp.array([1.0, 3.0])
    mean = aggregate(updates, weights)
    np.testing.assert_allclose(mean["w"], [(1 * 1 + 3 * 5) / 4, (1 * 2 + 3 * -2) / 4])
    params = {"w": jnp.array([10.0, 10.0])}
    tx = optax.sgd(1.0)
    new, _ = server_update(tx, params, tx.init(params), mean)
    np.testing.assert_allclose(new["w"], [14.0, 9.0])


def test_fedavg_weighting_end_to_end_matches_hand_computation():
    # Full engine on 2 clients of sizes 1 and 3 (synthetic), FedSGD, server SGD lr 1.
    ds = small_dataset(n=4)
    cfg = small_config(**{"data.num_clients": 2, "data.partition": "iid", "training.rounds": 1,
                          "training.clients_per_round": 2, "training.algorithm": "fedsgd",
                          "training.lr": 0.1})
    sim = Simulation(cfg, dataset=ds)
    # Force sizes 1 and 3 by hand-building the index matrix.
    sim.partitions = [np.array([0]), np.array([1, 2, 3])]
    sim._idx = jnp.array([[0, -1, -1], [1, 2, 3]], jnp.int32)
    sim.client_counts = np.array([1, 3])
    sim.n_max = 3
    sim.settings = LocalTraining("fedsgd", 1, 16, 3)
    sim.client_update = make_client_update(sim.apply_fn, optax.sgd(0.1), sim.settings)
    sim._compile()
    state = sim.init_state()
    p0 = state.params
    new_state, _ = sim.run_round(state, 0)

    def grad(idx):
        x, y = jnp.asarray(ds.x_train[idx]), jnp.asarray(ds.y_train[idx])
        return jax.grad(lambda p: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
            sim.apply_fn(p, x), y)))(p0)

    g1, g2 = grad([0]), grad([1, 2, 3])
    expected = jax.tree_util.tree_map(lambda p, a, b: p - 0.1 * (1 * a + 3 * b) / 4, p0, g1, g2)
    chex.assert_trees_all_close(new_state.params, expected, atol=1e-6)


@pytest.mark.parametrize("model", ["mlp", "lenet", "lenet5"])
def test_strategies_agree(model):
    ds = small_dataset()
    results = {}
    for strategy in ("loop", "vmap", "map", "chunked"):
        cfg = small_config(**{"model.name": model, "training.client_parallelism": strategy,
                              "training.chunk_size": 2})
        sim = Simulation(cfg, dataset=ds)
        state = sim.init_state()
        for r in range(2):
            state, res = sim.run_round(state, r)
        results[strategy] = (state.params, res.train_loss)
    for s in ("vmap", "map", "chunked"):
        chex.assert_trees_all_close(results[s][0], results["loop"][0], atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(results[s][1], results["loop"][1], rtol=1e-4)


def test_clients_vmapped_in_groups_trace_their_convolutions_as_vmapped_instances(monkeypatch):
    """vmap and chunked (chunk > 1) trace the cohort's convolutions inside
    models.vmapped_instances() (im2col on CPU); loop and map (one client at a time)
    outside it. test_strategies_agree checks that the numbers agree."""
    from fedsim import models
    seen = []
    rule = models.uses_im2col

    def recording(*args):
        seen.append(models._VMAPPED_DEPTH > 0)
        return rule(*args)

    monkeypatch.setattr(models, "uses_im2col", recording)
    ds = small_dataset()
    for strategy, vmapped in (("loop", False), ("map", False), ("vmap", True),
                              ("chunked", True)):
        seen.clear()
        cfg = small_config(**{"model.name": "lenet", "training.client_parallelism": strategy,
                              "training.chunk_size": 2})
        sim = Simulation(cfg, dataset=ds)
        sim.run_round(sim.init_state(), 0)
        assert seen and any(seen) == vmapped, strategy
    assert models._VMAPPED_DEPTH == 0


def test_defenses_given_by_hand_and_in_the_config_are_refused_by_name():
    """The config's defenses would not run beside hand-built ones, yet the config
    (and the run directory's config.yaml) would describe them: refused, naming both."""
    ds = small_dataset()
    hand = {"upload": _nan_upload()}
    cfg = small_config(defenses="[{name: parameter_channel, kappa: 100.0}]")
    with pytest.raises(ConfigError, match=r"'defenses' names parameter_channel.*defenses=\.\.\."):
        Simulation(cfg, dataset=ds, defenses=hand)
    # Either one alone is fine; the hand-built run runs no channel, so it has no ledger.
    sim = Simulation(small_config(), dataset=ds, defenses=hand)
    assert sim.defenses == hand and sim.defense_specs == [] and sim.round_callbacks == []
    assert len(Simulation(cfg, dataset=ds).round_callbacks) == 1  # the channel's ledger


def test_same_seed_same_numbers_other_seed_other_numbers():
    ds = small_dataset()

    def final(seed):
        sim = Simulation(small_config(seed=seed), dataset=ds)
        state = sim.init_state()
        for r in range(2):
            state, _ = sim.run_round(state, r)
        return sim.evaluate(state.params), jax.tree_util.tree_leaves(state.params)[0]

    (a_eval, a_p), (b_eval, b_p), (_, c_p) = final(3), final(3), final(4)
    assert a_eval == b_eval
    np.testing.assert_array_equal(a_p, b_p)
    assert not np.allclose(a_p, c_p)


def test_training_improves_accuracy():
    ds = small_dataset(n=1200)
    sim = Simulation(small_config(**{"training.rounds": 8, "training.lr": 2.0}), dataset=ds)
    state = sim.init_state()
    acc0, _ = sim.evaluate(state.params)
    for r in range(8):
        state, _ = sim.run_round(state, r)
    acc1, _ = sim.evaluate(state.params)
    assert acc1 > max(acc0 + 0.3, 0.6)


def _nan_upload():
    def apply(delta, state, *, key, context):
        return jax.tree_util.tree_map(lambda d: d * jnp.nan, delta), state
    return Defense(init=lambda p: (), apply=apply, stage="upload", name="nan")


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_nonfinite_update_stops_with_round_and_client(strategy):
    cfg = small_config(**{"training.client_parallelism": strategy})
    sim = Simulation(cfg, dataset=small_dataset(), defenses={"upload": _nan_upload()})
    # The defense is named as a suspect next to the lr (before: the lr alone).
    with pytest.raises(NonFiniteError, match=r"round 0: client \d+ .*lower training.lr or "
                                             r"check the defenses' settings \(nan \(upload\)\)"):
        sim.run_round(sim.init_state(), 0)


def test_nonfinite_clients_can_be_skipped():
    cfg = small_config(**{"training.on_nonfinite": "skip_client"})
    sim = Simulation(cfg, dataset=small_dataset(), defenses={"upload": _nan_upload()})
    state = sim.init_state()
    p0 = state.params
    state, res = sim.run_round(state, 0)
    assert len(res.skipped_clients) == 3
    chex.assert_tree_all_finite(state.params)
    chex.assert_trees_all_close(state.params, p0)  # nothing aggregated
    assert np.isnan(res.train_loss)  # no client counted: no loss (it read 0.0, a perfect round)


@pytest.mark.parametrize("strategy,per_call,on_nonfinite", [
    ("loop", 1, "stop"), ("loop", 3, "skip_client"), ("vmap", 1, "stop"),
    ("map", 1, "skip_client"), ("chunked", 1, "stop"), ("sharded", 1, "skip_client")])
def test_a_nonfinite_server_step_stops_the_round_that_made_it(strategy, per_call, on_nonfinite):
    """Finite uploads times a server_lr that is inf in float32: NaN/Inf params.

    Nothing noticed: the run ended with exit 0 and ``test_loss: Infinity``;
    under ``skip_client`` every later round skipped every client of a dead
    model; under ``stop`` the next round blamed a client and training.lr.
    Skipping clients cannot mend the global model, so either setting stops.
    """
    cfg = small_config(**{"training.client_parallelism": strategy, "training.chunk_size": 2,
                          "training.loop_clients_per_call": per_call,
                          "training.on_nonfinite": on_nonfinite,
                          "training.server_optimizer": "sgd", "training.server_lr": 1e39})
    sim = Simulation(cfg, dataset=small_dataset(), donate=strategy == "vmap")
    with pytest.raises(NonFiniteError, match=r"round 0: the server step .*global params"
                                             r".*training.server_lr") as e:
        sim.run_round(sim.init_state(), 0)
    # Not blamed on a client and its training.lr, as the next round's check did.
    assert not re.search(r"client \d|training\.lr\b", str(e.value)), str(e.value)


@pytest.mark.parametrize("server,named", [
    ({"training.server_optimizer": "fedadagrad", "training.server_lr": 1.0}, True),
    ({"training.server_optimizer": "sgd", "training.server_lr": 3.0}, True),
    ({"training.server_optimizer": "sgd", "training.server_lr": 1.0}, False)])
def test_a_client_that_diverges_after_an_adaptive_server_step_names_the_server_lr(server, named):
    # One client of three fails in round 1 (fedadagrad at server_lr 1 broke one of
    # ten on Fashion-MNIST); the message blamed training.lr alone. FedAvg's own
    # average (sgd at 1) cannot move the model past the clients, so it is not named.
    sim = Simulation(small_config(**server), dataset=small_dataset())
    with pytest.raises(NonFiniteError) as e:
        sim._raise_if_nonfinite(1, np.array([0, 1, 2]), np.array([True, False, True]), True)
    message = str(e.value)
    assert message.startswith("round 1: client 1 produced a NaN/Inf loss or update")
    assert ("last server step's model" in message) is named, message
    if named:
        assert f"training.server_optimizer {server['training.server_optimizer']} at " \
               f"server_lr {server['training.server_lr']}" in message
    assert "lower training.lr" in message  # the client's own lr stays a suspect
    with pytest.raises(NonFiniteError) as e0:  # round 0 starts from the initial model
        sim._raise_if_nonfinite(0, np.array([0, 1, 2]), np.array([True, False, True]), True)
    assert "server" not in str(e0.value)


def test_clients_that_all_diverge_on_a_huge_global_model_point_at_the_server_step():
    # server_lr 1e38 leaves finite weights near 1e37: round 0's server-step check
    # passes, and round 1's clients all overflow. The message named only a
    # client and training.lr.
    cfg = small_config(**{"training.server_optimizer": "sgd", "training.server_lr": 1e38})
    sim = Simulation(cfg, dataset=small_dataset())
    state, _ = sim.run_round(sim.init_state(), 0)
    with pytest.raises(NonFiniteError, match=r"round 1: client \d+ .*every client of the "
                                             r"round.*training.server_lr"):
        sim.run_round(state, 1)


def test_a_nonfinite_server_optimizer_state_stops_the_round_that_made_it():
    # |pseudo-gradient| 1e20 is finite, its square (Adam's second moment) is not:
    # Adam's step is then 1e20 / inf = 0, finite params that never move again.
    def huge_upload():
        def apply(delta, state, *, key, context):
            return jax.tree_util.tree_map(lambda d: jnp.sign(d) * 1e20, delta), state
        return Defense(init=lambda p: (), apply=apply, stage="upload", name="huge")

    cfg = small_config(**{"training.server_optimizer": "adam", "training.server_lr": 0.1})
    sim = Simulation(cfg, dataset=small_dataset(), defenses={"upload": huge_upload()})
    with pytest.raises(NonFiniteError, match=r"round 0: the server step .*server optimizer state"):
        sim.run_round(sim.init_state(), 0)


def _first_leaf_is(first, context):
    """Whether the round's global params still begin with ``first`` (round 0's model)."""
    return jnp.all(jax.tree_util.tree_leaves(context.global_params)[0] == first)


def _memory_upload(poison: Callable) -> Defense:
    """A stateful upload defense whose stored state feeds every later upload.

    Its per-client state counts the rounds the client took part in and keeps
    its last upload, which the next upload adds times 0: like Pseudo-Pruning's
    withheld weights composed into the start model, a NaN stored once makes
    every later upload of that client NaN. ``poison(context)`` (traced) makes
    this round's upload NaN.
    """
    def init(params):
        return {"rounds": jnp.zeros((), jnp.int32),
                "last": jax.tree_util.tree_map(jnp.zeros_like, params)}

    def apply(delta, state, *, key, context):
        out = jax.tree_util.tree_map(lambda d, m: d + 0.0 * m, delta, state["last"])
        out = jax.tree_util.tree_map(lambda d: jnp.where(poison(context), jnp.nan, d), out)
        return out, {"rounds": state["rounds"] + 1, "last": out}

    return Defense(init=init, apply=apply, stage="upload", name="memory")


@pytest.mark.parametrize("strategy,per_call", [("loop", 1), ("loop", 3), ("vmap", 4),
                                               ("map", 4), ("chunked", 4), ("sharded", 4)])
def test_a_skipped_client_keeps_its_defense_state_and_comes_back(strategy, per_call):
    """A client skipped for a NaN leaves the round with the state it came with.

    Its new defense state came out of the same diverged training; stored, it
    made the client NaN (and skipped) in every later round it was sampled in.
    ``per_call`` 3 runs the loop's cohort in one call (all of it), 1 one client
    a call; chunk_size 2 pads the chunked cohort of 3.
    """
    ds = small_dataset()
    rounds = 6
    cfg = small_config(**{"training.on_nonfinite": "skip_client",
                          "training.client_parallelism": strategy, "training.chunk_size": 2,
                          "training.loop_clients_per_call": per_call,
                          "training.rounds": rounds})
    plain = Simulation(cfg, dataset=ds)
    first = jax.tree_util.tree_leaves(plain.init_state().params)[0]
    cohorts = [set(map(int, plain.cohort(r))) for r in range(rounds)]
    counts = list(plain.client_counts)
    # A client of round 0 that is sampled again later, told apart by its size.
    target, back = next((c, r) for c in sorted(cohorts[0]) for r in range(1, rounds)
                        if c in cohorts[r] and counts.count(counts[c]) == 1)
    n_target = int(counts[target])

    def once(context):  # NaN for the target, in round 0 only
        return (context.num_examples == n_target) & _first_leaf_is(first, context)

    sim = Simulation(cfg, dataset=ds, defenses={"upload": _memory_upload(once)})
    state = sim.init_state()
    own = lambda states, c: jax.tree_util.tree_map(lambda s: np.array(s[c]), states)
    before = own(state.client_states, target)
    state, res = sim.run_round(state, 0)
    assert res.skipped_clients == [target]
    chex.assert_trees_all_equal(own(state.client_states, target), before)
    for c in cohorts[0] - {target}:  # the clients that counted keep their new state
        assert int(state.client_states["upload"]["rounds"][c]) == 1
    for r in range(1, back + 1):
        state, res = sim.run_round(state, r)
        assert res.skipped_clients == [], r
    assert target in res.cohort
    assert int(state.client_states["upload"]["rounds"][target]) == 1
    chex.assert_tree_all_finite(own(state.client_states, target))
    chex.assert_tree_all_finite(state.params)


@pytest.mark.parametrize("server_optimizer,aggregation,strategy", [
    ("momentum", "mean", "loop"), ("momentum", "mean", "vmap"), ("adam", "mean", "loop"),
    ("adam", "mean", "vmap"), ("adam", "sender_mean", "loop"), ("yogi", "mean", "loop")])
def test_a_round_without_an_accepted_client_leaves_the_server_state_as_it_was(
        server_optimizer, aggregation, strategy):
    """No upload counted: params and server optimizer state stay exactly as they were.

    A zero pseudo-gradient is not "no step" for a server optimizer with state:
    momentum, Adam and Yogi moved the model (by up to 0.07 with Adam) and
    advanced their state from round 0's moments.
    """
    ds = small_dataset()
    cfg = small_config(**{"training.on_nonfinite": "skip_client",
                          "training.server_optimizer": server_optimizer,
                          "training.server_lr": 0.1, "training.aggregation": aggregation,
                          "training.client_parallelism": strategy})
    first = jax.tree_util.tree_leaves(Simulation(cfg, dataset=ds).init_state().params)[0]

    def after_round_0(context):  # every client NaN from round 1 on
        return ~_first_leaf_is(first, context)

    sim = Simulation(cfg, dataset=ds, donate=strategy == "vmap",
                     defenses={"upload": _memory_upload(after_round_0)})
    state = sim.init_state()
    state, res0 = sim.run_round(state, 0)
    assert res0.skipped_clients == []  # round 0 gives the server optimizer its state
    before = jax.tree_util.tree_map(np.array, (state.params, state.opt_state))
    state, res1 = sim.run_round(state, 1)
    assert res1.skipped_clients == sorted(map(int, res1.cohort))
    chex.assert_trees_all_equal((state.params, state.opt_state), before)
    assert int(state.round) == 2  # the round still counts


def test_a_round_whose_clients_were_all_skipped_logs_no_train_loss(tmp_path):
    import json

    from fedsim.run import run_simulation

    cfg = small_config(**{"training.on_nonfinite": "skip_client", "training.rounds": 1,
                          "output.dir": str(tmp_path)})
    sim = Simulation(cfg, dataset=small_dataset(), defenses={"upload": _nan_upload()})
    summary = run_simulation(cfg, sim=sim, quiet=True)
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert row["train_loss"] is None and summary["final_train_loss"] is None


def test_observer_sees_the_upload_of_chosen_clients():
    cfg = small_config(**{"observer.clients": [4], "observer.rounds": [1],
                          "training.client_parallelism": "vmap"})
    sim = Simulation(cfg, dataset=small_dataset())
    state = sim.init_state()
    state, res0 = sim.run_round(state, 0)
    assert res0.observed == []
    params_round1 = state.params
    state, res1 = sim.run_round(state, 1)
    assert 4 in res1.cohort
    (obs,) = res1.observed
    assert obs.observation.client_id == 4 and obs.observation.round == 1
    chex.assert_trees_all_close(obs.observation.params, params_round1)
    # The recorded upload is what client 4 computes from the round's inputs.
    _, ckey = sim.round_keys(1)
    out = sim.client_update(params_round1, sim.client_data(4), {}, jax.random.fold_in(ckey, 4))
    chex.assert_trees_all_close(obs.observation.update, out.update, atol=1e-6)
    assert len(obs.y) == sim.client_counts[4]


@pytest.mark.parametrize("strategy", ["vmap", "chunked"])
def test_observing_a_round_leaves_its_numbers_as_they_are_unobserved(strategy):
    """Observed rounds train on the strategy's own path: bitwise the same state.

    They used to run the whole cohort through the loop instead, whose float
    rounding differs from vmap's on LeNet-5's convolutions (the MLP happened to
    agree bitwise). With ``donate=True`` the observation must also keep global
    params that the round step has not taken.
    """
    ds = small_dataset()
    base = {"training.client_parallelism": strategy, "training.rounds": 2, "model.name": "lenet5"}
    # A client the round samples anyway: forcing in another would change the cohort.
    member = int(Simulation(small_config(**base), dataset=ds).cohort(1)[0])
    runs = []
    for observer in ({}, {"observer.clients": [member], "observer.rounds": [1]}):
        cfg = small_config(**base, **observer)
        sim = Simulation(cfg, dataset=ds, donate=True)
        state = sim.init_state()
        observed = []
        for rnd in range(2):
            state, res = sim.run_round(state, rnd)
            observed += res.observed
        runs.append((jax.tree_util.tree_map(np.asarray, state.params), observed))
    (plain, none), (watched, seen) = runs
    assert none == [] and len(seen) == 1
    for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(watched)):
        np.testing.assert_array_equal(a, b)
    # Readable after the round, although the round step took the state's buffers.
    assert all(np.isfinite(np.asarray(leaf)).all() for o in seen
               for leaf in jax.tree_util.tree_leaves(o.observation.params))


def _counting_upload():
    """An upload defense whose per-client state counts the client's rounds."""
    def apply(delta, count, *, key, context):
        return delta, count + 1
    return Defense(init=lambda p: jnp.zeros((), jnp.int32), apply=apply, stage="upload",
                   name="count")


def test_loop_clients_per_call_changes_nothing_but_speed():
    """k clients per jitted call == one per call: params, losses, client states, observer."""
    ds = small_dataset()
    results = {}
    for per_call in (1, 3):
        cfg = small_config(**{"data.num_clients": 8, "training.clients_per_round": 7,
                              "training.loop_clients_per_call": per_call,
                              "observer.clients": [3], "observer.rounds": [1]})
        sim = Simulation(cfg, dataset=ds, defenses={"upload": _counting_upload()})
        state = sim.init_state()
        losses, observed = [], []
        for r in range(3):
            state, res = sim.run_round(state, r)
            losses.append(res.train_loss)
            observed += [o.observation.update for o in res.observed]
        results[per_call] = (state, losses, observed, [sim.cohort(r) for r in range(3)])
    ref_state, ref_losses, ref_obs, cohorts = results[1]
    counts = np.bincount(np.concatenate(cohorts), minlength=8)
    np.testing.assert_array_equal(ref_state.client_states["upload"], counts)
    assert len(ref_obs) == 1
    for per_call in (3,):
        state, losses, obs, _ = results[per_call]
        chex.assert_trees_all_close(state.params, ref_state.params, atol=1e-6)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
        np.testing.assert_array_equal(state.client_states["upload"],
                                      ref_state.client_states["upload"])
        chex.assert_trees_all_close(obs, ref_obs, atol=1e-6)


def _precision_recorder(seen):
    """An upload defense that records, while it is traced, XLA's matmul precision."""
    def apply(delta, state, *, key, context=None):
        seen.append(jax.config.jax_default_matmul_precision)
        return delta, state
    return Defense(init=lambda params: (), apply=apply, stage="upload", name="precision_recorder")


@pytest.mark.parametrize("parallelism", ["loop", "vmap", "auto"])
@pytest.mark.parametrize("precision", ["highest", "default"])
def test_rounds_evaluation_and_calibration_run_under_the_configured_precision(
        precision, parallelism, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSIM_CACHE_DIR", str(tmp_path))
    # Around the simulation, the other setting: only the engine's own context
    # can make the traced code see the configured one.
    outside = "default" if precision == "highest" else "highest"
    with jax.default_matmul_precision(outside):
        seen = []
        cfg = small_config(**{"training.matmul_precision": precision,
                              "training.client_parallelism": parallelism})
        sim = Simulation(cfg, dataset=small_dataset(),
                         defenses={"upload": _precision_recorder(seen)})
        traced_in_calibration = len(seen)
        assert (traced_in_calibration > 0) == (parallelism == "auto")
        state, _ = sim.run_round(sim.init_state(), 0)
        assert seen and set(seen) == {precision}
        if parallelism == "auto":  # the run reuses what calibration traced
            assert len(seen) == traced_in_calibration
        at_eval = []
        sim._evaluate = lambda p, x, y: (at_eval.append(jax.config.jax_default_matmul_precision),
                                         (1.0, 0.0))[1]
        sim.evaluate(state.params)
        assert at_eval == [precision]
        assert jax.config.jax_default_matmul_precision == outside  # restored


def test_bad_matmul_precision_names_the_key():
    from fedsim.config import ConfigError
    with pytest.raises(ConfigError, match="training.matmul_precision"):
        small_config(**{"training.matmul_precision": "tf32"})


def test_an_observed_round_fills_its_cohort_uniformly_from_the_other_clients():
    """With observed clients forced in, the rest of the cohort must be a uniform
    sample of the others (cutting the sorted draw kept low ids: clients 90-99 were in
    3.7 % of observed rounds instead of 9/99, chi-square p ~ 1e-143); rounds nobody
    observes keep the plain uniform draw."""
    from scipy.stats import chisquare

    from fedsim.server import sample_cohort

    rounds = 2000
    cfg = small_config(**{"data.num_clients": 100, "data.partition": "iid",
                          "training.clients_per_round": 10, "training.rounds": rounds + 1,
                          "observer.clients": [0], "observer.rounds": list(range(rounds))})
    sim = Simulation(cfg, dataset=small_dataset(n=1000))
    counts = np.zeros(100)
    for r in range(rounds):
        ids = sim.cohort(r)
        assert len(set(ids.tolist())) == 10 and 0 in ids
        counts[ids] += 1
    assert chisquare(counts[1:]).pvalue > 1e-3
    unobserved = sim.cohort(rounds)
    np.testing.assert_array_equal(unobserved, sample_cohort(sim.round_keys(rounds)[0], 100, 10))


def test_an_observed_client_named_twice_is_refused():
    with pytest.raises(ConfigError, match=r"observer.clients.*more than once"):
        small_config(**{"observer.clients": [3, 3], "observer.rounds": [0]})


def test_the_sorted_cut_fill_replays_the_cohorts_of_runs_recorded_before_it():
    """``observer.fill: sorted_cut`` keeps the observed clients and the lowest other
    ids of the round's sorted draw, as every observed round did before the option."""
    from fedsim.server import sample_cohort

    sims = {fill: Simulation(small_config(**{
        "data.num_clients": 20, "training.clients_per_round": 10, "training.rounds": 40,
        "observer.clients": [0, 1], "observer.rounds": list(range(40)),
        "observer.fill": fill}), dataset=small_dataset(n=1000))
        for fill in ("sorted_cut", "uniform")}
    differs = 0
    for r in range(40):
        draw = [int(c) for c in sample_cohort(sims["uniform"].round_keys(r)[0], 20, 10)]
        expected = sorted([0, 1] + [c for c in draw if c not in (0, 1)][:8])
        np.testing.assert_array_equal(sims["sorted_cut"].cohort(r), expected)
        differs += not np.array_equal(sims["uniform"].cohort(r), expected)
    assert differs > 0
