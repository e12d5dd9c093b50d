import chex
import pytest

from fedsim.checkpoint import Checkpointer, CheckpointError, config_fingerprint, make_meta
from fedsim.run import run_simulation
from fedsim.simulation import Simulation

from .helpers import ENGINE_UNROLL, drop_later_config_keys, small_config, small_dataset


def _trained_state(cfg):
    sim = Simulation(cfg, dataset=small_dataset())
    state, _ = sim.run_round(sim.init_state(), 0)
    return sim, state


@pytest.mark.parametrize("server_optimizer", ["adam", "fedyogi"])  # optax's state, Alg 2's own
def test_save_restore_round_trip_with_optimizer_and_client_states(tmp_path, server_optimizer):
    cfg = small_config(**{"training.server_optimizer": server_optimizer})
    sim, state = _trained_state(cfg)
    ck = Checkpointer(tmp_path / "ck")
    ck.save(1, state, make_meta(cfg, sim, state))
    restored, meta = Checkpointer(tmp_path / "ck").restore(sim.init_state(), config_fingerprint(cfg))
    chex.assert_trees_all_equal(restored, state)
    assert meta["strategy"] == sim.strategy and int(restored.round) == 1


def test_checkpoint_of_other_config_is_rejected_clearly(tmp_path):
    cfg = small_config()
    sim, state = _trained_state(cfg)
    Checkpointer(tmp_path).save(1, state, make_meta(cfg, sim, state))
    other = small_config(**{"training.lr": 0.1})
    with pytest.raises(CheckpointError, match="different config"):
        Checkpointer(tmp_path).restore(sim.init_state(), config_fingerprint(other))


def test_corrupted_checkpoint_gives_clear_error(tmp_path):
    cfg = small_config()
    sim, state = _trained_state(cfg)
    Checkpointer(tmp_path).save(1, state, make_meta(cfg, sim, state))
    for f in (tmp_path / "1").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=str(tmp_path / "1")):
        Checkpointer(tmp_path).restore(sim.init_state())


def test_run_resumes_from_checkpoint_in_process(tmp_path):
    # Run 2 rounds, then extend to 4 (rounds is not part of the fingerprint):
    # equals an uninterrupted 4-round run.
    ds = small_dataset()
    base = {"output.checkpoint_every": 1, "training.rounds": 4}
    cfg_a = small_config(**base, **{"output.dir": str(tmp_path / "a")})
    a = run_simulation(cfg_a, sim=Simulation(cfg_a, dataset=ds, donate=True), quiet=True)
    cfg_b2 = small_config(**{**base, "training.rounds": 2, "output.dir": str(tmp_path / "b")})
    run_simulation(cfg_b2, sim=Simulation(cfg_b2, dataset=ds, donate=True), quiet=True)
    cfg_b = small_config(**base, **{"output.dir": str(tmp_path / "b")})
    b = run_simulation(cfg_b, sim=Simulation(cfg_b, dataset=ds, donate=True), quiet=True)
    assert "resumed from" in (tmp_path / "b" / "run.log").read_text()
    chex.assert_trees_all_equal(a["final_state"].params, b["final_state"].params)
    assert a["test_accuracy"] == b["test_accuracy"] and a["final_train_loss"] == b["final_train_loss"]


def test_the_fingerprint_leaves_out_name_and_attack_and_old_checkpoints_still_resume(tmp_path):
    import hashlib
    import json

    from fedsim.config import load_config

    base = ["model.name=mlp", "observer.clients=[0]", "observer.rounds=[0]"]
    attacked = load_config(None, base + ["attack.name=dlg", "attack.config={iterations: 5}"])
    # Re-attacking a finished run with other attack settings, or a sweep cell of
    # another name, resumes the same simulation.
    assert config_fingerprint(attacked) == config_fingerprint(
        load_config(None, base + ["attack.name=inverting_gradients", "name=other"]))
    assert config_fingerprint(attacked) != config_fingerprint(
        load_config(None, base + ["attack.name=dlg", "training.lr=0.5"]))
    # A checkpoint written with the fingerprint of before (every field but output
    # and training.rounds, name and attack included) resumes.
    cfg = small_config(**{"training.rounds": 1, "output.checkpoint_every": 1,
                          "output.dir": str(tmp_path / "run"), **ENGINE_UNROLL})
    d = cfg.to_dict()
    # Configs had no pruning section then (2026-11-27), nor the keys that came later.
    del d["output"], d["training"]["rounds"], d["pruning"]
    drop_later_config_keys(d)
    old = hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert old != config_fingerprint(cfg)
    sim, state = _trained_state(cfg)
    Checkpointer(tmp_path / "run" / "checkpoints").save(
        1, state, {**make_meta(cfg, sim, state), "config_fingerprint": old})
    # ... beside the row of the round it did (a resume refuses to leave it out).
    (tmp_path / "run" / "metrics.jsonl").write_text('{"round": 0, "train_loss": 1.0}\n')
    longer = small_config(**{"training.rounds": 2, "output.checkpoint_every": 1,
                             "output.dir": str(tmp_path / "run"), **ENGINE_UNROLL})
    run_simulation(longer, sim=Simulation(longer, dataset=small_dataset()), quiet=True)
    assert "resumed from" in (tmp_path / "run" / "run.log").read_text()
    # ... and its next checkpoint carries the current fingerprint.
    restored, meta = Checkpointer(tmp_path / "run" / "checkpoints").restore(sim.init_state())
    assert int(restored.round) == 2
    assert meta["config_fingerprint"] == config_fingerprint(cfg)


def test_observer_fill_is_hashed_only_where_it_is_not_the_rule_of_earlier_runs():
    """Runs before ``observer.fill`` existed completed observed cohorts by the
    sorted cut: their checkpoints keep their fingerprints under ``sorted_cut``
    (the fill left out of the hash), and ``uniform``, another federation where
    clients are observed, is hashed. Without an observer the fill changes
    nothing and is never hashed."""
    import hashlib
    import json

    from fedsim.config import load_config

    base = ["model.name=mlp", "observer.clients=[0]", "observer.rounds=[0]"]
    uniform = load_config(None, base)
    d = uniform.to_dict()
    del d["output"], d["name"], d["attack"], d["training"]["rounds"], d["pruning"]
    drop_later_config_keys(d)
    before = hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert config_fingerprint(load_config(None, base + ["observer.fill=sorted_cut"])) == before
    assert config_fingerprint(uniform) != before
    plain = ["model.name=mlp"]
    assert config_fingerprint(load_config(None, plain)) == config_fingerprint(
        load_config(None, plain + ["observer.fill=sorted_cut"]))



def test_a_defenses_whole_numbers_hash_alike_as_int_or_float_and_older_checkpoints_resume(
        tmp_path):
    import hashlib
    import json

    from fedsim.checkpoint import accepted_fingerprints
    from fedsim.config import load_config

    spec = "defenses=[{name: dp_gaussian, noise_multiplier: %s, clip_norm: %s}]"
    cfg = lambda *a: load_config(None, ["model.name=mlp", spec % a])
    assert config_fingerprint(cfg("1", "2")) == config_fingerprint(cfg("1.0", "2.0"))
    assert config_fingerprint(cfg("1", "2")) != config_fingerprint(cfg("1", "3"))
    assert config_fingerprint(cfg("1.5", "2")) != config_fingerprint(cfg("1.5", "2.5"))
    # A flag is not its number.
    flags = lambda v: load_config(None, ["model.name=mlp",
                                         f"defenses=[{{name: prune_largest, p: 0.5, pseudo: {v}}}]"])
    assert config_fingerprint(flags("true")) != config_fingerprint(flags("1"))
    # Checkpoints written from 2026-11-26 to 2026-11-28 hashed the numbers as written.
    run = small_config(**{"training.rounds": 1, "output.checkpoint_every": 1,
                          "output.dir": str(tmp_path / "run"),
                          "defenses": [{"name": "dp_gaussian", "noise_multiplier": 1.0}], **ENGINE_UNROLL})
    d = run.to_dict()
    for key in ("output", "name", "attack"):
        del d[key]
    del d["training"]["rounds"], d["pruning"]
    drop_later_config_keys(d)
    as_written = hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert as_written != config_fingerprint(run) and as_written in accepted_fingerprints(run)
    sim, state = _trained_state(run)
    Checkpointer(tmp_path / "run" / "checkpoints").save(
        1, state, {**make_meta(run, sim, state), "config_fingerprint": as_written})
    (tmp_path / "run" / "metrics.jsonl").write_text('{"round": 0, "train_loss": 1.0}\n')
    longer = small_config(**{"training.rounds": 2, "output.checkpoint_every": 1,
                             "output.dir": str(tmp_path / "run"),
                             "defenses": [{"name": "dp_gaussian", "noise_multiplier": 1.0}], **ENGINE_UNROLL})
    run_simulation(longer, sim=Simulation(longer, dataset=small_dataset()), quiet=True)
    assert "resumed from" in (tmp_path / "run" / "run.log").read_text()


def test_a_simulation_of_another_config_is_refused_naming_the_keys(tmp_path):
    ds = small_dataset()
    cfg = small_config(**{"output.dir": str(tmp_path / "r")})
    other = small_config(**{"output.dir": str(tmp_path / "r"), "training.lr": 0.1, "seed": 3})
    with pytest.raises(ValueError, match=r"another config than cfg \(they differ in seed, "
                                         r"training\.lr\)"):
        run_simulation(cfg, sim=Simulation(other, dataset=ds), quiet=True)
    assert not (tmp_path / "r").exists()  # refused before anything is written
    # Keys the fingerprint leaves out change no number, so they may differ.
    elsewhere = small_config(**{"output.dir": str(tmp_path / "s"), "name": "x"})
    assert run_simulation(cfg, sim=Simulation(elsewhere, dataset=ds), quiet=True)["rounds"] == 2


def _gc(p):
    from defenses.pruning import gc

    return {"upload": gc(p)}


def test_a_checkpoint_resumes_only_under_the_hand_given_defenses_it_was_written_with(tmp_path):
    """The config fingerprint cannot see defenses passed as Simulation(defenses=...);
    their specs, recorded in the checkpoint, stand for them."""
    ds = small_dataset()
    base = {"output.checkpoint_every": 1, "output.dir": str(tmp_path / "r")}
    cfg2 = small_config(**base, **{"training.rounds": 2})
    run_simulation(cfg2, sim=Simulation(cfg2, dataset=ds, defenses=_gc(0.3)), quiet=True)
    cfg3 = small_config(**base, **{"training.rounds": 3})
    for defenses, shown in ((_gc(0.5), r"gc\(p=0\.5\)"), (None, "none")):
        with pytest.raises(CheckpointError, match=r"other defenses given by hand than this "
                                                  r"simulation has \(upload: gc\(p=0\.3\) then, "
                                                  rf"{shown} now\)"):
            run_simulation(cfg3, sim=Simulation(cfg3, dataset=ds, defenses=defenses), quiet=True)
    summary = run_simulation(cfg3, sim=Simulation(cfg3, dataset=ds, defenses=_gc(0.3)),
                             quiet=True)
    assert summary["rounds_trained"] == 1  # resumed after round 2
    # A config's run records none, so it resumes as a config run and not under hand ones.
    cfg_c = small_config(**{**base, "output.dir": str(tmp_path / "c"), "training.rounds": 2})
    run_simulation(cfg_c, sim=Simulation(cfg_c, dataset=ds), quiet=True)
    cfg_c3 = small_config(**{**base, "output.dir": str(tmp_path / "c"), "training.rounds": 3})
    with pytest.raises(CheckpointError, match=r"\(upload: none then, gc\(p=0\.3\) now\)"):
        run_simulation(cfg_c3, sim=Simulation(cfg_c3, dataset=ds, defenses=_gc(0.3)), quiet=True)


def test_a_run_with_hand_given_defenses_records_them_where_its_config_cannot(tmp_path):
    """config.yaml holds no hand-given defenses, so it warns in a comment; the
    summary and run.log name them. A config run's files carry none of this."""
    import json

    from fedsim.checkpoint import hand_defense_specs
    from fedsim.config import load_config

    ds = small_dataset()
    cfg = small_config(**{"output.dir": str(tmp_path / "h")})
    sim = Simulation(cfg, dataset=ds, defenses=_gc(0.3))
    run_simulation(cfg, sim=sim, quiet=True)
    text = (tmp_path / "h" / "config.yaml").read_text()
    assert text.startswith("# This run's defenses were given by hand")
    assert "#   upload: gc(p=0.3)\n" in text
    assert config_fingerprint(load_config(tmp_path / "h" / "config.yaml")) == \
        config_fingerprint(cfg)  # the comment changes nothing the file configures
    summary = json.loads((tmp_path / "h" / "summary.json").read_text())
    assert summary["hand_defenses"] == {"upload": "gc(p=0.3)"}
    assert summary["hand_defense_specs"] == hand_defense_specs(sim) == {"upload": "gc(p=0.3)"}
    assert "defenses given by hand, not in config.yaml: upload: gc(p=0.3)" in \
        (tmp_path / "h" / "run.log").read_text()
    plain = small_config(**{"output.dir": str(tmp_path / "c")})
    run_simulation(plain, sim=Simulation(plain, dataset=ds), quiet=True)
    assert not (tmp_path / "c" / "config.yaml").read_text().startswith("#")
    assert "hand_defenses" not in json.loads((tmp_path / "c" / "summary.json").read_text())
    assert "by hand" not in (tmp_path / "c" / "run.log").read_text()


def test_a_checkpoint_from_before_the_hand_defense_names_still_resumes(tmp_path):
    from fedsim.checkpoint import check_hand_defenses

    cfg = small_config()
    sim = Simulation(cfg, dataset=small_dataset(), defenses=_gc(0.3))
    check_hand_defenses({"config_fingerprint": "x"}, sim, tmp_path)  # no names: as before
    with pytest.raises(CheckpointError, match=str(tmp_path)):
        check_hand_defenses({"hand_defenses": {}}, sim, tmp_path)


def test_hand_given_channels_of_another_kappa_have_other_names():
    """The checkpoint tells hand-given defenses apart by name: a channel's carries κ."""
    from defenses.channels import parameter_channel

    from fedsim.checkpoint import hand_defense_names

    ds = small_dataset()
    names = [hand_defense_names(Simulation(small_config(), dataset=ds,
                                           defenses={"layer": parameter_channel(k)}))
             for k in (10.0, 100.0)]
    assert names == [{"layer": "parameter_channel(kappa=10)"},
                     {"layer": "parameter_channel(kappa=100)"}]


@pytest.mark.parametrize("meta,said", [
    ([1], "is a list, not a JSON object"),
    ({"strategy": "warp"}, "names the strategy 'warp', which is none of loop, vmap"),
    ({"callbacks": 5}, "has callbacks 5, not a list"),
])
def test_checkpoint_metadata_of_the_wrong_shape_is_named_as_corrupted(tmp_path, meta, said):
    # Before: an AttributeError or TypeError traceback, or a resumed run whose log
    # and summary named the strategy "warp".
    from fedsim.checkpoint import read_meta

    cfg = small_config()
    sim, state = _trained_state(cfg)
    good = make_meta(cfg, sim, state)
    Checkpointer(tmp_path).save(1, state, meta if isinstance(meta, list) else {**good, **meta})
    for read in (lambda: read_meta(tmp_path),
                 lambda: Checkpointer(tmp_path).restore(sim.init_state())):
        with pytest.raises(CheckpointError, match=rf"{tmp_path / '1'} is corrupted: its "
                                                  rf"metadata {said}"):
            read()
