"""A config run of pruned FL is part B of the chu2023 reproduction, number for number.

Part B (`benchmarks/reproduce_chu2023.train_b`) builds its federation from
Python: PruneFL re-pruned at `reconfigs` rounds (a new Simulation around each
mask), the defense on the uploads, the global mask applied after every round.
The same federation written as a config (`pruning: {scheme: prunefl,
reconfigurations: K, reconfigure_every: R/K}` and the defense in `defenses`)
must end in the same global model, server optimizer state and defense state.
"""

import argparse

import jax
import numpy as np
import pytest

from benchmarks.reproduce_chu2023 import N_PAPER, fl_config, train_b, upload_state
from fedsim.config import load_config
from fedsim.simulation import Simulation
from fedsim.data import synthetic_dataset

ROUNDS, RECONFIGS = 4, 2


def _args(upload: str) -> argparse.Namespace:
    return argparse.Namespace(
        dataset="synthetic", partition="dirichlet", image_size=8, b_model="conv2",
        clients=6, clients_per_round=3, local_batch=4, lr=0.1, rounds=ROUNDS,
        reconfigs=RECONFIGS, upload=upload, defense_rate=0.3, lambda_acc=1.0,
        # α starts near ½ so that PriPrune withholds within these few rounds.
        lambda_pri=10.0, lambda_sha=2e-5, tau=0.5, alpha_lr=0.5, alpha_init=0.45,
        pseudo_start="masked",  # the engine's: a pruned weight is in no start model
        observer_fill="uniform")  # the engine's: an observed round's cohort filled uniformly


def _config_defenses(name: str, upload: str, n_params: int) -> str:
    if name == "none":
        return "[]"
    if name == "largest_pseudo":
        return f"[{{name: prune_largest, p: 0.3, pseudo: true, upload: {upload}}}]"
    del n_params  # PriPrune scales λ_sha by N_PAPER / N itself (reference_size)
    return (f"[{{name: priprune, lambda_acc: 1.0, lambda_pri: 10.0, lambda_sha: 2.0e-5, "
            f"reference_size: {N_PAPER}, tau: 0.5, alpha_lr: 0.5, alpha_init: 0.45, "
            f"upload: {upload}}}]")


# 40-100 s each on 2 cores (two federations, each compiled twice): slow. The fast
# suite covers the pieces: test_priprune_config (a config run is the library
# run) and test_pruning_fl_config (PruneFL's masks follow prunefl_reprune).
@pytest.mark.slow
@pytest.mark.parametrize("name,upload", [
    ("none", "weights"), ("largest_pseudo", "weights"),
    ("priprune", "weights"),  # the paper's headline: PriPrune on PruneFL, weight uploads
    ("priprune", "update"),
])
def test_a_pruned_config_run_ends_where_part_b_ends(name, upload):
    ds = synthetic_dataset(seed=0, image_size=8, num_train=200, num_test=50)
    args = _args(upload)
    cfg = fl_config(args, 0, ROUNDS, [0])
    ref = train_b(args, ds, cfg, name)

    cfg_run = load_config(None, [f"{k}={v}" for k, v in {
        **{f"data.{k}": v for k, v in cfg.to_dict()["data"].items() if v is not None},
        **{f"training.{k}": v for k, v in cfg.to_dict()["training"].items()},
        "model.name": "conv2", "seed": 0, "observer.clients": "[0, 1]",
        "observer.rounds": "[0]", "output.progress": False, "output.plots": False,
        "pruning.scheme": "prunefl", "pruning.p": 0.3,
        "pruning.reconfigurations": RECONFIGS,
        "pruning.reconfigure_every": ROUNDS // RECONFIGS,
        "defenses": _config_defenses(name, upload, ref["n_params"])}.items()])
    sim = Simulation(cfg_run, dataset=ds)
    state = sim.init_state()
    for r in range(ROUNDS):
        state, _ = sim.run_round(state, r)

    def same(a, b):
        la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
        assert len(la) == len(lb)
        for x, y in zip(la, lb):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

    same(sim.global_mask, ref["mask"])
    same(state.params, ref["state"].params)
    same(state.opt_state, ref["state"].opt_state)
    if name != "none":
        same(state.client_states["upload"], upload_state(ref["state"].client_states, name))
        withheld = jax.tree_util.tree_leaves(state.client_states["upload"]["withheld"])
        assert any(np.any(np.asarray(w) > 0) for w in withheld)  # the defense did withhold
