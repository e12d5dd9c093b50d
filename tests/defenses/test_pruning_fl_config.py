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
