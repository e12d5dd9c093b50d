"""Pruned FL from a config with the real base schemes (`pruning.scheme`, paper 002).

The engine's handling of a mask is tested in tests/fedsim/test_pruning_config.py;
here: every scheme of defenses.pruning is registered and builds the mask the
docs promise (:func:`one_shot_mask` on the initial model, with the run's own
key and examples), and `fedsim run` / `fedsim attack` take it from a YAML file,
SGI included.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from defenses.pruning import flatten
from defenses.pruning.schemes import SCHEMES, one_shot_mask, prunable
from fedsim.cli import main
from fedsim.hooks import mask_schemes
from fedsim.keys import experiment_key, numpy_generator
from fedsim.simulation import Simulation
from tests.fedsim.helpers import small_config, small_dataset


def test_every_base_scheme_is_registered_for_configs():
    assert set(SCHEMES) <= set(mask_schemes())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_configs_mask_is_the_schemes_one_shot_mask_on_the_initial_model(scheme):
    cfg = small_config(**{"pruning.scheme": scheme, "pruning.p": 0.4, "pruning.examples": 12,
                          "pruning.synflow_iterations": 3})
    ds = small_dataset()
    sim = Simulation(cfg, dataset=ds)
    # What the docs say the server does: the initial model, the run's
    # pruning/mask key, pruning.examples training examples of its own stream.
    pick = np.sort(numpy_generator(cfg.seed, "pruning/examples").choice(
        len(ds.y_train), 12, replace=False))
    params = sim._initial_params()
    expected = one_shot_mask(scheme, experiment_key(cfg.seed, "pruning/mask"), params, 0.4,
                             apply_fn=sim.apply_fn, x=jnp.asarray(ds.x_train[pick]),
                             y=jnp.asarray(ds.y_train[pick]), input_shape=ds.input_shape,
                             synflow_iterations=3)
    for a, b in zip(jax.tree_util.tree_leaves(sim.global_mask),
                    jax.tree_util.tree_leaves(expected)):
        np.testing.assert_array_equal(a, b)
    m, e = np.asarray(flatten(sim.global_mask)), np.asarray(flatten(prunable(params)))
    assert np.all(m[e == 0] == 1)  # biases are never pruned
    assert (1 - m[e > 0]).sum() == round(0.4 * e.sum())  # p of the kernels, every scheme


def _synthetic(tmp_path, **extra):
    cfg = {"name": "pruned", "seed": 0,
           "data": {"dataset": "synthetic", "num_clients": 6, "image_size": 8,
                    "examples_per_client": 2, "max_train": 60, "max_test": 30},
           "model": {"name": "mlp"},
           "training": {"algorithm": "fedsgd", "rounds": 2, "clients_per_round": 3, "lr": 0.1,
                        "client_parallelism": "loop"},
           "pruning": {"scheme": "snip", "p": 0.5, "examples": 16},
           "eval": {"every": 1}, "output": {"progress": False, "plots": False}, **extra}
    path = tmp_path / "pruned.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_fedsim_run_and_attack_take_pruning_from_a_config_file(tmp_path, capsys):
    path = _synthetic(tmp_path, observer={"clients": [0, 1, 2], "rounds": [1]},
                      attack={"name": "sgi", "grants": {"batch_size": True},
                              "config": {"iterations": 5}})
    assert main(["run", str(path), "--quiet", "--set", f"output.dir={tmp_path / 'run'}"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # 50 % of the kernels; paper 001's MLP has no biases, so half the model is kept.
    assert summary["mask_density"] == pytest.approx(0.5, abs=1e-9)
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["pruning"]["scheme"] \
        == "snip"
    assert main(["attack", str(path), "--quiet", "--set", f"output.dir={tmp_path / 'atk'}"]) == 0
    attacked = json.loads((tmp_path / "atk" / "attack_summary.json").read_text())
    assert attacked["attack"] == "sgi" and len(attacked["victims"]) == 3
    capsys.readouterr()
    # A scheme that is not one is named before anything runs.
    assert main(["run", str(path), "--quiet", "--set", "pruning.scheme=snipp"]) == 2
    assert "config key 'pruning.scheme': 'snipp' is not allowed; allowed values: feddst, " \
           "grasp, prunefl, random, snip, synflow" in capsys.readouterr().err


def _kernel_pruned_share(mask, params) -> float:
    m, e = np.asarray(flatten(mask)), np.asarray(flatten(prunable(params)))
    return float(np.sum((m == 0) & (e == 1)) / np.sum(e == 1))


def test_prunefl_reconfigured_in_a_run_follows_part_bs_schedule():
    """K = 3 reconfigurations every round: rate p/3, then 2p/3 and p, each a
    magnitude re-pruning of the global model the server holds before the round
    (``prunefl_reprune``, as part B of the reproduction runs it)."""
    from defenses.pruning.schemes import prunefl_reprune

    cfg = small_config(**{"pruning.scheme": "prunefl", "pruning.p": 0.6,
                          "pruning.reconfigurations": 3, "pruning.reconfigure_every": 1,
                          "training.rounds": 4})
    sim = Simulation(cfg, dataset=small_dataset())
    state = sim.init_state()
    params0 = sim._initial_params()
    shares = [_kernel_pruned_share(sim.global_mask, params0)]
    expected = prunefl_reprune(params0, jax.tree_util.tree_map(jnp.ones_like, prunable(params0)),
                               0.6, 1, 3)
    masks_equal = [all(np.array_equal(a, b) for a, b in zip(
        jax.tree_util.tree_leaves(sim.global_mask), jax.tree_util.tree_leaves(expected)))]
    for r in range(4):
        before = state.params
        k = sim.reconfiguration_at(r)
        state, _ = sim.run_round(state, r)
        if k is not None:
            expected = prunefl_reprune(before, expected, 0.6, k + 1, 3)
            masks_equal.append(all(np.array_equal(a, b) for a, b in zip(
                jax.tree_util.tree_leaves(sim.global_mask), jax.tree_util.tree_leaves(expected))))
            shares.append(_kernel_pruned_share(sim.global_mask, params0))
    assert masks_equal == [True, True, True]
    np.testing.assert_allclose(shares, [0.2, 0.4, 0.6], atol=1e-3)


def test_feddst_reconfigured_in_a_run_moves_its_mask_at_constant_density():
    cfg = small_config(**{"pruning.scheme": "feddst", "pruning.p": 0.5,
                          "pruning.reconfigurations": 3, "pruning.reconfigure_every": 1,
                          "training.rounds": 3})
    sim = Simulation(cfg, dataset=small_dataset())
    state, params0 = sim.init_state(), sim._initial_params()
    masks = [sim.global_mask]
    for r in range(3):
        state, _ = sim.run_round(state, r)
        masks.append(sim.global_mask)
    shares = [_kernel_pruned_share(m, params0) for m in masks]
    np.testing.assert_allclose(shares, 0.5, atol=1e-3)
    moved = [not np.array_equal(np.asarray(flatten(a)), np.asarray(flatten(b)))
             for a, b in zip(masks, masks[1:])]
    assert moved == [False, True, True]  # reconfigurations before rounds 1 and 2 only
