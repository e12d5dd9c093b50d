"""PriPrune from a config (`defenses: [{name: priprune, ...}]`, paper 002 Alg 3).

The registered defense brings its own local training (`Defense.local_training`),
so a config run trains α with the weights exactly as the library form
(`Simulation(..., client_update_factory=priprune_client_update(hp))`) that
benchmarks/reproduce_chu2023.py uses; on top of a base scheme (`pruning:`) it
is the paper's "PriPrune on PruneFL". What the server receives holds neither a
pruned nor a withheld weight.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from defenses.pruning import flatten
from defenses.pruning.global_mask import masked_gradient
from defenses.pruning.priprune import PriPruneConfig, priprune_client_update, priprune_defense
from fedsim.cli import main
from fedsim.config import ConfigError
from fedsim.hooks import identity
from fedsim.simulation import Simulation
from tests.fedsim.helpers import small_config, small_dataset

# Large λ_pri and α_lr so that α crosses ½ for some coordinates within 2 rounds.
HP = {"lambda_pri": 50.0, "alpha_lr": 0.5, "alpha_init": 0.3}
OBSERVED = {"observer.clients": "[1, 2]", "observer.rounds": "[0, 1]",
            "training.clients_per_round": 3}


def _defenses(**hp) -> str:
    return json.dumps([{"name": "priprune", **HP, **hp}])


def _rounds(sim, state, rounds=2):
    observed = []
    for r in range(rounds):
        state, res = sim.run_round(state, r)
        observed.extend(res.observed)
    return state, observed


@pytest.mark.parametrize("upload", ["update", "weights"])
def test_a_config_run_is_the_library_run_and_uploads_neither_pruned_nor_withheld_weights(upload):
    ds = small_dataset()
    cfg = small_config(**OBSERVED, **{"defenses": _defenses(upload=upload),
                                      "pruning.scheme": "random", "pruning.p": 0.3})
    sim = Simulation(cfg, dataset=ds)
    assert sim.defenses["upload"].local_training is not None
    state, observed = _rounds(sim, sim.init_state())

    # The library form, as the reproduction builds it, on the same mask.
    hp = PriPruneConfig(upload=upload, **HP)
    lib = Simulation(small_config(**OBSERVED), dataset=ds,
                     defenses={"layer": masked_gradient(sim.global_mask),
                               "upload": priprune_defense(hp)},
                     client_update_factory=priprune_client_update(hp))
    s0 = lib.init_state()
    s0 = s0._replace(params=jax.tree_util.tree_map(jnp.multiply, s0.params, sim.global_mask))
    lib_state, _ = _rounds(lib, s0)
    for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(lib_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    base = np.asarray(flatten(sim.global_mask))
    withheld_any = False
    assert len(observed) == 4
    for o in observed:
        obs = o.observation
        u = np.asarray(flatten(obs.update))
        if upload == "weights":  # the server receives ŵ = w_g + u
            u = u + np.asarray(flatten(obs.params))
        assert np.all(u[base == 0] == 0)
        if int(obs.round) == 1:  # the client state after the last round holds its cut
            cs = jax.tree_util.tree_map(lambda s: s[int(obs.client_id)],
                                        state.client_states)["upload"]
            wh = np.asarray(flatten(cs["withheld"]))
            assert np.all(u[wh > 0] == 0)
            withheld_any |= bool(np.any((wh > 0) & (base == 1)))
    assert withheld_any  # α moved: the check above is not vacuous
    # The per-round log of p̂ (Fig 5b): the last round's cohort's mean withheld share.
    (report,) = sim.round_callbacks
    cohort = sim.cohort(1)
    expected = np.mean([np.mean(np.asarray(flatten(jax.tree_util.tree_map(
        lambda w, c=c: w[c], state.client_states["upload"]["withheld"])))) for c in cohort])
    assert 0 < expected < 1
    assert report(1, {}, state=state)["priprune_rate"] == pytest.approx(expected, rel=1e-6)
    assert np.all(np.asarray(flatten(state.params))[base == 0] == 0)


@pytest.mark.parametrize("extra,match", [
    ([{"name": "update_gaussian", "sigma": 0.1}],
     r"config key 'defenses': defense 'priprune' brings its own local training, .* cannot be "
     r"chained with other 'upload' defenses"),
    ([{"name": "dp_clip", "clip_norm": 1.0}],
     r"config key 'defenses': PriPrune training supports only 'layer' and 'upload' defenses, "
     r"got \['example'\]"),
])
def test_what_priprune_cannot_run_with_is_named(extra, match):
    cfg = small_config(defenses=json.dumps([{"name": "priprune"}] + extra))
    with pytest.raises(ConfigError, match=match):
        Simulation(cfg, dataset=small_dataset())


@pytest.mark.parametrize("hp,match", [
    ("tau: .nan", "priprune tau must be a finite number, got nan"),
    ("tau: NaN", "priprune tau must be a finite number, got 'NaN'"),
    ("alpha_init: 1.0", r"alpha_init must be in \(0, 1\)"),
    ("lambda_pri: true", "priprune lambda_pri must be a finite number, got True"),
    ("upload: grads", "upload must be one of"),
    ("lambda_privacy: 1.0", "bad arguments"),
    ("reference_size: 0", "reference_size must be a positive integer"),
    ("reference_size: 1.5e6", "reference_size must be a positive integer"),
    # Once accepted, then an OverflowError in the jitted step.
    ("lambda_pri: 3000000000", r"lambda_pri: the integer 3000000000 does not fit in 32 bits"),
])
def test_bad_priprune_settings_are_named(hp, match):
    cfg = small_config(defenses=f"[{{name: priprune, {hp}}}]")
    with pytest.raises(ConfigError, match=r"config key 'defenses\[0\]': .*" + match):
        Simulation(cfg, dataset=small_dataset())


def test_fedsim_run_and_attack_take_priprune_on_prunefl_from_a_config_file(tmp_path, capsys):
    cfg = {"name": "priprune", "seed": 0,
           "data": {"dataset": "synthetic", "num_clients": 6, "image_size": 8,
                    "examples_per_client": 4, "max_train": 60, "max_test": 30},
           "model": {"name": "mlp"},
           "training": {"algorithm": "fedavg", "rounds": 2, "clients_per_round": 3, "lr": 0.1,
                        "batch_size": 2, "client_parallelism": "loop"},
           "pruning": {"scheme": "prunefl", "p": 0.3},
           "defenses": [{"name": "priprune", "upload": "weights", **HP}],
           "observer": {"clients": [0, 1], "rounds": [1]},
           "attack": {"name": "sgi", "grants": {"num_examples": True},
                      "config": {"iterations": 5}},
           "eval": {"every": 1}, "output": {"progress": False, "plots": False}}
    path = tmp_path / "priprune.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path), "--quiet", "--set", f"output.dir={tmp_path / 'run'}"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert np.isfinite(summary["test_accuracy"]) and summary["mask_density"] < 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(rows) == 2 and all(0 <= r["priprune_rate"] <= 1 for r in rows)
    assert main(["attack", str(path), "--quiet", "--set", f"output.dir={tmp_path / 'atk'}"]) == 0
    attacked = json.loads((tmp_path / "atk" / "attack_summary.json").read_text())
    assert attacked["attack"] == "sgi" and len(attacked["victims"]) == 2
    capsys.readouterr()
    assert main(["run", str(path), "--quiet", "--set",
                 "defenses=[{name: priprune, tau: 0}, {name: update_gaussian, sigma: 1}]"]) == 2
    assert "config key 'defenses[0]': priprune tau and alpha_lr must be > 0" \
        in capsys.readouterr().err


def test_the_priprune_on_prunefl_config_is_part_bs_setting():
    """configs/chu2023_priprune_prunefl.yaml: valid, attackable, and its λ_sha
    is part B's scaling (2e-5 · N_PAPER / N) for the model it names."""
    from attacks.cli import validate_attack_section
    from benchmarks.reproduce_chu2023 import N_PAPER
    from fedsim.config import load_config
    from fedsim.models import build_model, init_params

    cfg = load_config("configs/chu2023_priprune_prunefl.yaml")
    validate_attack_section(cfg)
    params = jax.eval_shape(lambda k: init_params(build_model(cfg.model.name, 10),
                                                  (cfg.data.image_size,) * 2 + (1,), k),
                            jax.random.key(0))
    n = sum(int(np.prod(l.shape)) for l in jax.tree_util.tree_leaves(params))
    (spec,) = cfg.defenses
    assert spec["name"] == "priprune"
    assert spec["lambda_sha"] == 2e-5 and spec["reference_size"] == N_PAPER
    assert n != N_PAPER  # the scaling matters here
    assert (cfg.pruning.scheme, cfg.pruning.reconfigurations * cfg.pruning.reconfigure_every) \
        == ("prunefl", cfg.training.rounds)


def test_reference_size_scales_lambda_sha_by_the_models_size_as_the_reproduction_does():
    """λ_sha with reference_size R trains as λ_sha·R/N given outright (the
    reproduction's λ_sha·N_PAPER/N, the same float), N the model's size."""
    ds = small_dataset()
    base = small_config(**OBSERVED, **{"pruning.scheme": "random", "pruning.p": 0.3})
    params = Simulation(base, dataset=ds).init_state().params
    n = sum(int(np.prod(l.shape)) for l in jax.tree_util.tree_leaves(params))
    hp = {**HP, "lambda_pri": 1.0}
    finals = []
    for spec in ({"lambda_sha": 0.05, "reference_size": 3 * n},
                 {"lambda_sha": 0.05 * (3 * n) / n},
                 {"lambda_sha": 0.05}):
        cfg = small_config(**OBSERVED, **{"pruning.scheme": "random", "pruning.p": 0.3,
                                          "defenses": _defenses(**hp, **spec)})
        sim = Simulation(cfg, dataset=ds)
        finals.append(_rounds(sim, sim.init_state())[0].client_states["upload"]["theta"])
    same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(
        jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))
    assert same(finals[0], finals[1]) and not same(finals[0], finals[2])


def test_priprune_is_found_by_what_it_is_not_by_its_name():
    """A renamed PriPrune still trains α and reports p̂; a foreign or mismatched upload is named."""
    ds = small_dataset()
    hp = PriPruneConfig(**HP)
    renamed = priprune_defense(hp)._replace(name="learnt_mask")
    sim = Simulation(small_config(**OBSERVED), dataset=ds, defenses={"upload": renamed},
                     client_update_factory=priprune_client_update(hp))
    (report,) = sim.round_callbacks
    state, _ = sim.run_round(sim.init_state(), 0)
    withheld = state.client_states["upload"]["withheld"]
    expected = np.mean([np.mean(np.asarray(flatten(jax.tree_util.tree_map(
        lambda w, c=c: w[c], withheld)))) for c in sim.cohort(0)])
    assert report(0, {}, state=state)["priprune_rate"] == pytest.approx(expected, rel=1e-6)

    factory = priprune_client_update(hp)
    with pytest.raises(ValueError, match=r"needs defenses\['upload'\] = priprune_defense\(hp\), "
                                         r"got 'priprune_lookalike'"):
        factory(None, None, None,
                {"upload": identity("upload")._replace(name="priprune_lookalike")})
    other = PriPruneConfig(**{**HP, "upload": "weights"})
    with pytest.raises(ValueError, match="built with .*upload='weights'.* but its client update "
                                         "with .*upload='update'"):
        factory(None, None, None, {"upload": priprune_defense(other)})
