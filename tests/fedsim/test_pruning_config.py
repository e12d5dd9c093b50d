"""Pruned FL from a config (`pruning:`, paper 002 Alg 1): the engine's side.

A scheme registered here (every second kernel entry pruned) stands in for the
real ones, which tests/defenses/test_pruning_fl_config.py runs; these tests
check what the engine does with a mask: the model starts masked, a pruned
weight is 0 in every upload the server receives and in the global model after
every round, for every cohort strategy alike, and ahead of the config's own
upload defenses.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedsim import hooks
from fedsim.checkpoint import _hash, config_fingerprint
from fedsim.config import ConfigError
from fedsim.simulation import Simulation
from tests.fedsim.helpers import (ENGINE_UNROLL, drop_later_config_keys, random_zeroing_upload,
                                  small_config, small_dataset)

OBSERVED = {"observer.clients": "[0, 1, 2, 3, 4, 5]", "observer.rounds": "[0, 1]",
            "training.clients_per_round": 6}


@pytest.fixture
def alternate(monkeypatch):
    """A scheme pruning every second entry of each kernel (``p`` is recorded)."""
    seen = []

    def scheme(params, p, *, key, apply_fn, x, y, input_shape, synflow_iterations):
        seen.append({"p": p, "x": np.asarray(x).shape, "key": key})
        return jax.tree_util.tree_map(
            lambda l: (jnp.arange(l.size).reshape(l.shape) % 2).astype(jnp.float32)
            if l.ndim >= 2 else jnp.ones(l.shape, jnp.float32), params)

    monkeypatch.setitem(hooks.MASK_SCHEMES, "alternate", scheme)
    return seen


def _zero_where_pruned(tree, mask) -> bool:
    return all(bool(np.all(np.asarray(v)[np.asarray(m) == 0] == 0))
               for v, m in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(mask)))


def _run(cfg, rounds=2, **kw):
    sim = Simulation(cfg, dataset=small_dataset(), **kw)
    state = sim.init_state()
    observed = []
    for r in range(rounds):
        state, res = sim.run_round(state, r)
        observed.extend(res.observed)
    return sim, state, observed


@pytest.mark.parametrize("strategy", ["loop", "vmap", "map", "chunked"])
def test_a_pruned_weight_is_zero_in_every_upload_and_in_the_global_model(alternate, strategy):
    cfg = small_config(**OBSERVED, **{"pruning.scheme": "alternate", "pruning.p": 0.3,
                                      "pruning.examples": 5,
                                      "training.client_parallelism": strategy})
    sim, state, observed = _run(cfg)
    mask = sim.global_mask
    assert alternate[0]["p"] == 0.3 and alternate[0]["x"][0] == 5
    assert _zero_where_pruned(sim.init_state().params, mask)
    assert len(observed) == 12
    for o in observed:  # the observer's view: what the server receives
        assert _zero_where_pruned(o.observation.update, mask)
        assert _zero_where_pruned(o.observation.params, mask)
    assert _zero_where_pruned(state.params, mask)
    # The kept weights did train: the mask is not a frozen model.
    kept_moved = [np.any(np.asarray(w)[np.asarray(m) == 1] != np.asarray(w0)[np.asarray(m) == 1])
                  for w, w0, m in zip(jax.tree_util.tree_leaves(state.params),
                                      jax.tree_util.tree_leaves(sim.init_state().params),
                                      jax.tree_util.tree_leaves(mask))]
    assert all(kept_moved)


def test_strategies_agree_on_a_pruned_run(alternate):
    runs = {s: _run(small_config(**{"pruning.scheme": "alternate",
                                    "training.client_parallelism": s}))[1].params
            for s in ("loop", "vmap")}
    for a, b in zip(*(jax.tree_util.tree_leaves(p) for p in runs.values())):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _noise(stage):
    """A test defense adding N(0, 0.01²) to every coordinate at ``stage``."""
    def apply(value, state, *, key, context=None):
        leaves, tree = jax.tree_util.tree_flatten(value)
        ks = jax.random.split(key, len(leaves))
        noisy = [l + 0.01 * jax.random.normal(k, l.shape, l.dtype) for k, l in zip(ks, leaves)]
        return jax.tree_util.tree_unflatten(tree, noisy), state

    return hooks.Defense(init=lambda params: (), apply=apply, stage=stage, name="noise")


@pytest.mark.parametrize("defenses", [
    {"upload": random_zeroing_upload(0.5)},  # sees the masked update and keeps it so
    {"upload": _noise("upload")},  # would fill the pruned coordinates: taken off again
    {"layer": _noise("layer")},  # the same for every local step's gradient
])
def test_the_mask_holds_around_the_configs_own_defenses(alternate, defenses):
    cfg = small_config(**OBSERVED, **{"pruning.scheme": "alternate"})
    sim, state, observed = _run(cfg, defenses=dict(defenses))
    (stage,) = defenses
    assert sim.defenses[stage].name.endswith("+global_mask")  # the defense between two masks
    for o in observed:
        assert _zero_where_pruned(o.observation.update, sim.global_mask)
    assert _zero_where_pruned(state.params, sim.global_mask)


def test_the_mask_keeps_the_defenses_state_and_local_training(alternate):
    """A defense that brings its own local training reads its own state: the
    mask around it must neither nest that state nor drop the training."""
    def factory(apply_fn, tx, settings, defenses):
        from fedsim.client import make_client_update
        seen.append(defenses["upload"].name)
        return make_client_update(apply_fn, tx, settings, defenses)

    seen = []
    own = hooks.Defense(init=lambda params: {"count": jnp.zeros((), jnp.int32)},
                        apply=lambda v, s, *, key, context=None: (v, {"count": s["count"] + 1}),
                        stage="upload", name="counting", local_training=factory)
    sim, state, _ = _run(small_config(**{"pruning.scheme": "alternate"}),
                         defenses={"upload": own})
    # Built once outside the compiled step and again while it traces (around the
    # mask it takes as an input): the mask goes around the defense every time.
    assert seen and set(seen) == {"counting+global_mask"}
    assert set(state.client_states["upload"]) == {"count"}
    assert int(np.sum(np.asarray(state.client_states["upload"]["count"]))) == 6  # 2 rounds × 3


def test_a_defense_with_its_own_local_training_is_not_chained():
    own = hooks.Defense(init=lambda p: (), apply=lambda v, s, **k: (v, s), stage="upload",
                        name="own", local_training=lambda *a: None)
    with pytest.raises(ValueError, match="'own' brings its own local training"):
        hooks.chain(own, hooks.identity("upload"))
    assert hooks.chain(own) is own  # alone it keeps its state layout and its training


def test_without_pruning_nothing_changes_and_old_checkpoints_keep_their_fingerprint(alternate):
    cfg = small_config(**ENGINE_UNROLL)  # as configs were before the key
    assert cfg.pruning.scheme is None
    sim = Simulation(cfg, dataset=small_dataset())
    assert sim.global_mask is None and "layer" not in sim.defenses and not alternate
    # Configs gained the section on 2026-11-27: a dense one hashes as before it.
    d = cfg.to_dict()
    d.pop("pruning")
    drop_later_config_keys(d)  # came later; their defaults hash as before them
    for key in ("output", "name", "attack"):
        d.pop(key)
    d["training"].pop("rounds")
    assert config_fingerprint(cfg) == _hash(d)
    pruned = small_config(**{"pruning.scheme": "alternate"})
    assert config_fingerprint(pruned) != config_fingerprint(cfg)


@pytest.mark.parametrize("override,match", [
    ({"pruning.scheme": "nope"}, r"'pruning.scheme': 'nope' is not allowed; allowed values: "),
    ({"pruning.scheme": "alternate", "pruning.p": 1.0}, r"'pruning.p': 1.0 is out of range"),
    ({"pruning.scheme": "alternate", "pruning.examples": 0}, r"'pruning.examples'"),
])
def test_bad_pruning_settings_are_named(alternate, override, match):
    with pytest.raises(ConfigError, match=match):
        small_config(**override)


def test_a_scheme_that_cannot_build_its_mask_is_named(monkeypatch):
    def failing(params, p, **kw):
        raise ValueError("needs data it was not given")

    monkeypatch.setitem(hooks.MASK_SCHEMES, "failing", failing)
    cfg = small_config(**{"pruning.scheme": "failing"})
    with pytest.raises(ConfigError, match=r"config key 'pruning' \(failing\): needs data"):
        Simulation(cfg, dataset=small_dataset())


def test_a_pruned_run_resumes_to_the_numbers_of_an_uninterrupted_one(alternate, tmp_path):
    # The mask is not in the checkpoint: the resumed simulation builds it again
    # from the seed, and must get the same one. Pseudo-Pruning's per-client
    # state rides along in the checkpoint.
    from fedsim.run import run_simulation

    ds = small_dataset()
    base = {"output.checkpoint_every": 1, "training.rounds": 3, "pruning.scheme": "alternate",
            "defenses": "[{name: prune_largest, p: 0.2, pseudo: true}]"}
    cfg_a = small_config(**base, **{"output.dir": str(tmp_path / "a")})
    a = run_simulation(cfg_a, sim=Simulation(cfg_a, dataset=ds), quiet=True)
    cfg_b1 = small_config(**{**base, "training.rounds": 1, "output.dir": str(tmp_path / "b")})
    run_simulation(cfg_b1, sim=Simulation(cfg_b1, dataset=ds), quiet=True)
    cfg_b = small_config(**base, **{"output.dir": str(tmp_path / "b")})
    b = run_simulation(cfg_b, sim=Simulation(cfg_b, dataset=ds), quiet=True)
    assert "resumed from" in (tmp_path / "b" / "run.log").read_text()
    for x, y in zip(jax.tree_util.tree_leaves(a["final_state"]),
                    jax.tree_util.tree_leaves(b["final_state"])):
        np.testing.assert_array_equal(x, y)
    assert a["mask_density"] == b["mask_density"] == 0.5


# --- reconfigurations: a mask the server re-makes during training ------------

@pytest.fixture
def shrinking(monkeypatch, alternate):
    """An iterative stand-in: the alternate mask first, then reconfiguration k
    also prunes every entry whose index is a multiple of 2k + 1 (the calls are
    recorded, with the global model they were given)."""
    calls = []

    def reconfigure(params, mask, p, *, k, num, key):
        calls.append({"k": k, "num": num, "params": params, "mask": mask, "key": key})
        return jax.tree_util.tree_map(
            lambda m: m * (jnp.arange(m.size).reshape(m.shape) % (2 * k + 1) != 0) if m.ndim >= 2
            else m, mask)

    def build(params, p, *, reconfigurations, **kw):
        calls.append({"k": 0, "num": reconfigurations})
        return hooks.MASK_SCHEMES["alternate"](params, p, **kw)

    monkeypatch.setitem(hooks.MASK_SCHEMES, "shrinking", build)
    monkeypatch.setitem(hooks.MASK_RECONFIGURATIONS, "shrinking", reconfigure)
    return calls


RECONF = {"pruning.scheme": "shrinking", "pruning.reconfigurations": 3,
          "pruning.reconfigure_every": 2, "training.rounds": 6}


def _density(mask) -> float:
    leaves = jax.tree_util.tree_leaves(mask)
    return float(sum(np.sum(np.asarray(m)) for m in leaves) / sum(m.size for m in leaves))


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_the_server_remakes_the_mask_at_its_rounds_and_every_upload_follows_it(shrinking,
                                                                               strategy):
    cfg = small_config(**{**OBSERVED, **RECONF, "observer.rounds": "[0, 1, 2, 3, 4, 5]",
                          "training.client_parallelism": strategy})
    # donate: as `fedsim run` builds it; the round step takes the state's buffers,
    # the mask's included, which the compiled step's own copy must outlive.
    sim = Simulation(cfg, dataset=small_dataset(), donate=True)
    assert [sim.reconfiguration_at(r) for r in range(7)] == [None, None, 1, None, 2, None, None]
    state = sim.init_state()
    masks = []
    for r in range(6):
        state, res = sim.run_round(state, r)
        masks.append(sim.global_mask)
        for a, b in zip(jax.tree_util.tree_leaves(state.mask),
                        jax.tree_util.tree_leaves(sim.global_mask)):
            np.testing.assert_array_equal(a, b)  # the state carries the current mask
        for o in res.observed:
            assert _zero_where_pruned(o.observation.update, sim.global_mask)
            assert _zero_where_pruned(o.observation.params, sim.global_mask)
        assert _zero_where_pruned(state.params, sim.global_mask)
    assert [c["k"] for c in shrinking] == [0, 1, 2] and {c["num"] for c in shrinking} == {3}
    assert _density(masks[0]) > _density(masks[2]) > _density(masks[4]) == _density(masks[5])
    assert _density(masks[0]) == _density(masks[1])
    # Reconfiguration k is made on the global model after round 2k − 1, with its own key.
    assert not jax.random.key_data(shrinking[1]["key"]).tolist() == \
        jax.random.key_data(shrinking[2]["key"]).tolist()


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_the_mask_is_an_input_of_the_compiled_step_not_a_constant(shrinking, strategy):
    """A reconfiguration changes an input of the round step: nothing compiles
    again, and the mask is not written into the program (where a large model's
    mask is tens of MB of HLO)."""
    cfg = small_config(**{**RECONF, "training.client_parallelism": strategy})
    sim = Simulation(cfg, dataset=small_dataset(), donate=True)
    step = sim._run_and_accumulate if strategy == "loop" else sim._cohort_step
    state = sim.init_state()
    for r in range(5):  # reconfigurations 1 and 2 at rounds 2 and 4
        state, _ = sim.run_round(state, r)
    now = sim._run_and_accumulate if strategy == "loop" else sim._cohort_step
    assert now is step and step._cache_size() == 1

    dense = Simulation(small_config(), dataset=small_dataset())

    def program(s):
        st = s.init_state()
        cs = jax.tree_util.tree_map(lambda a: a[0], st.client_states)
        return s._run_client.lower(st.params, s._mask_arg(), s._x, s._y, s._idx, jnp.int32(0),
                                   cs, jax.random.key(0)).as_text()

    entries = sum(m.size for m in jax.tree_util.tree_leaves(sim.global_mask))
    # An embedded float mask takes ≥ 1 character per entry; the masking ops a few lines.
    assert len(program(sim)) - len(program(dense)) < entries / 4


def test_the_server_step_keeps_a_newly_pruned_weight_at_zero(shrinking):
    """Server momentum remembers a weight's past updates: without masking the
    model after the server step, a weight pruned at a reconfiguration would
    move off 0 again in the rounds after it (Alg 1 line 11)."""
    cfg = small_config(**RECONF, **{"training.server_optimizer": "momentum",
                                    "training.server_lr": 1.0})
    sim = Simulation(cfg, dataset=small_dataset())
    state = sim.init_state()
    for r in range(4):
        state, _ = sim.run_round(state, r)
        assert _zero_where_pruned(state.params, sim.global_mask)
    momentum = [l for l in jax.tree_util.tree_leaves(state.opt_state) if np.ndim(l) >= 2]
    pruned_late = [(np.asarray(m0) == 1) & (np.asarray(m) == 0) for m0, m in zip(
        jax.tree_util.tree_leaves(shrinking[1]["mask"]), jax.tree_util.tree_leaves(
            sim.global_mask)) if np.ndim(m) >= 2]
    # The test can fail: the server momentum is not 0 where the mask changed.
    assert any(np.any(np.asarray(t)[p] != 0) for t, p in zip(momentum, pruned_late))


def test_a_weight_withheld_before_it_was_pruned_does_not_come_back(shrinking):
    """Pseudo-Pruning keeps withheld weights on the client and puts them back
    into its next start model. A weight the client withheld and the server then
    pruned must not come back: its gradient is masked, so it would sit at its
    old value in the client's forward pass from then on."""
    cfg = small_config(**{**RECONF, "training.clients_per_round": 6, "training.rounds": 3})
    upload = hooks.build_defense("prune_largest", p=0.5, pseudo=True)
    sim = Simulation(cfg, dataset=small_dataset(), defenses={"upload": upload}, donate=True)
    state = sim.init_state()
    for r in range(3):
        state, _ = sim.run_round(state, r)
    local = state.client_states["upload"]["local"]
    withheld = state.client_states["upload"]["withheld"]
    newly = [(np.asarray(m0) == 1) & (np.asarray(m) == 0) for m0, m in zip(
        jax.tree_util.tree_leaves(shrinking[1]["mask"]),
        jax.tree_util.tree_leaves(sim.global_mask))]
    assert any(np.any(p) for p in newly)
    for leaf, m in zip(jax.tree_util.tree_leaves(local), jax.tree_util.tree_leaves(
            sim.global_mask)):  # every client's local model after the round
        assert np.all(np.asarray(leaf)[:, np.asarray(m) == 0] == 0)
    assert any(np.any(np.asarray(w) == 1) for w in jax.tree_util.tree_leaves(withheld))


def test_a_run_resumed_after_a_reconfiguration_goes_on_with_that_mask(shrinking, tmp_path):
    from fedsim.run import run_simulation

    ds = small_dataset()
    base = {**RECONF, "output.checkpoint_every": 1, "training.rounds": 5}
    cfg_a = small_config(**base, **{"output.dir": str(tmp_path / "a")})
    a = run_simulation(cfg_a, sim=Simulation(cfg_a, dataset=ds, donate=True), quiet=True)
    cfg_b1 = small_config(**{**base, "training.rounds": 3, "output.dir": str(tmp_path / "b")})
    run_simulation(cfg_b1, sim=Simulation(cfg_b1, dataset=ds, donate=True), quiet=True)
    cfg_b = small_config(**base, **{"output.dir": str(tmp_path / "b")})
    sim_b = Simulation(cfg_b, dataset=ds, donate=True)
    b = run_simulation(cfg_b, sim=sim_b, quiet=True)
    assert "resumed from" in (tmp_path / "b" / "run.log").read_text()
    for x, y in zip(jax.tree_util.tree_leaves(a["final_state"]),
                    jax.tree_util.tree_leaves(b["final_state"])):
        np.testing.assert_array_equal(x, y)
    assert a["mask_density"] == b["mask_density"] < 0.5
    # Three simulations built their first mask (k = 0); the resumed one (at round
    # 3) read reconfiguration 1 from the checkpoint and made only reconfiguration 2.
    assert [c["k"] for c in shrinking] == [0, 1, 2, 0, 1, 0, 2]


def test_a_fixed_mask_keeps_its_state_layout_and_fingerprint(alternate):
    cfg = small_config(**{"pruning.scheme": "alternate", **ENGINE_UNROLL})
    sim = Simulation(cfg, dataset=small_dataset())
    assert sim.init_state().mask == () and sim.reconfiguration_at(10) is None
    d = cfg.to_dict()
    d["pruning"] = {k: v for k, v in d["pruning"].items()
                    if k not in ("reconfigurations", "reconfigure_every")}
    drop_later_config_keys(d)  # came later; their defaults hash as before them
    for key in ("output", "name", "attack"):
        d.pop(key)
    d["training"].pop("rounds")
    assert config_fingerprint(cfg) == _hash(d)  # as a pruned config hashed before the keys


def test_only_an_iterative_scheme_is_reconfigured(alternate, shrinking):
    with pytest.raises(ConfigError, match=r"config key 'pruning.reconfigurations': 3 needs an "
                                          r"iterative scheme \(.*shrinking.*\); 'alternate' "
                                          r"makes its mask once"):
        small_config(**{**RECONF, "pruning.scheme": "alternate"})
    with pytest.raises(ConfigError, match=r"'pruning.reconfigure_every'"):
        small_config(**{**RECONF, "pruning.reconfigure_every": 0})


def test_a_run_too_short_for_its_mask_schedule_says_so(shrinking, tmp_path):
    from fedsim.run import pruning_schedule_note, run_simulation

    cfg = small_config(**{**RECONF, "training.rounds": 3, "output.dir": str(tmp_path)})
    run_simulation(cfg, sim=Simulation(cfg, dataset=small_dataset()), quiet=True)
    assert ("warning: pruning: 3 rounds make 2 of the 3 masks pruning.reconfigurations asks "
            "for (one every 2 rounds, the last at round 4); shrinking stops short of its "
            "schedule") in (tmp_path / "run.log").read_text()
    assert pruning_schedule_note(small_config(**{**RECONF, "training.rounds": 5})) is None
    assert pruning_schedule_note(small_config(**{"pruning.scheme": "alternate"})) is None


# --- pruned FL from Python: Simulation.use_global_mask -----------------------


def _python_masks(sim, shrinking_calls, state, r, every=2, num=3):
    """The mask the config run would use from round ``r`` on, made by the same
    stand-in scheme (k = 0 at round 0, k at round k * every), or None."""
    scheme, reconfigure = hooks.MASK_SCHEMES["shrinking"], hooks.MASK_RECONFIGURATIONS["shrinking"]
    if r == 0:
        return scheme(state.params, 0.3, reconfigurations=num, key=None, apply_fn=None, x=None,
                      y=None, input_shape=None, synflow_iterations=None)
    k, rest = divmod(r, every)
    if rest or k >= num:
        return None
    return reconfigure(state.params, sim.global_mask, 0.3, k=k, num=num, key=None)


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_a_python_run_with_use_global_mask_is_the_config_run(shrinking, strategy):
    """Masks set from Python at the config's rounds give the config run's
    uploads, global models and client states, to the bit, and a new mask
    compiles nothing again."""
    over = {**OBSERVED, **RECONF, "observer.rounds": "[0, 1, 2, 3, 4, 5]",
            "training.client_parallelism": strategy}
    upload = lambda: {"upload": hooks.build_defense("prune_largest", p=0.5, pseudo=True)}
    config_sim = Simulation(small_config(**over), dataset=small_dataset(), defenses=upload())
    py_sim = Simulation(small_config(**{k: v for k, v in over.items()
                                        if not k.startswith("pruning.")}),
                        dataset=small_dataset(), defenses=upload())
    a, b = config_sim.init_state(), py_sim.init_state()
    for r in range(6):
        mask = _python_masks(py_sim, shrinking, b, r)
        if mask is not None:
            b = py_sim.use_global_mask(mask, b)
        if r == 1:
            step = py_sim._run_and_accumulate if strategy == "loop" else py_sim._cohort_step
            compiled = step._cache_size()
        a, res_a = config_sim.run_round(a, r)
        b, res_b = py_sim.run_round(b, r)
        for x, y in zip(jax.tree_util.tree_leaves((a.params, a.client_states, a.mask)),
                        jax.tree_util.tree_leaves((b.params, b.client_states, b.mask))):
            np.testing.assert_array_equal(x, y)
        assert len(res_a.observed) == len(res_b.observed) > 0
        for oa, ob in zip(res_a.observed, res_b.observed):
            for x, y in zip(jax.tree_util.tree_leaves(oa.observation.update),
                            jax.tree_util.tree_leaves(ob.observation.update)):
                np.testing.assert_array_equal(x, y)
    assert _density(py_sim.global_mask) < _density(_python_masks(py_sim, shrinking, b, 0))
    now = py_sim._run_and_accumulate if strategy == "loop" else py_sim._cohort_step
    assert now is step and step._cache_size() == compiled  # two new masks, no new program


def test_use_global_mask_names_a_bad_mask(alternate):
    sim = Simulation(small_config(), dataset=small_dataset())
    state = sim.init_state()
    ones = jax.tree_util.tree_map(jnp.ones_like, state.params)
    leaves, tree = jax.tree_util.tree_flatten(ones)
    with pytest.raises(ValueError, match=r"global mask: its tree structure differs"):
        sim.use_global_mask(leaves, state)
    bad = jax.tree_util.tree_unflatten(tree, [leaves[0][..., :1]] + leaves[1:])
    with pytest.raises(ValueError, match=r"global mask\[.*\]: shape .* the params' is"):
        sim.use_global_mask(bad, state)
    for value in (0.5, np.nan):
        bad = jax.tree_util.tree_unflatten(tree, [leaves[0].at[0].set(value)] + leaves[1:])
        with pytest.raises(ValueError, match=r"global mask\[.*\]: values must be 0 or 1, found"):
            sim.use_global_mask(bad, state)
    pruned = Simulation(small_config(**{"pruning.scheme": "alternate"}), dataset=small_dataset())
    with pytest.raises(ConfigError, match=r"config key 'pruning.scheme' \(alternate\): the "
                                          r"config makes the global masks"):
        pruned.use_global_mask(ones, pruned.init_state())
