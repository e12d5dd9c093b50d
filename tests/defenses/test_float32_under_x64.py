"""A float32 run gives the same numbers whether or not jax_enable_x64 is on.

Same config + same seed → same numbers: a user who turns on 64-bit JAX for
something else in the process must not get another run. A random draw
without a dtype follows the default float (float64 under x64, other bits), and
a ``lax.cond`` whose branches build their zero without one stops tracing; the
defenses' draws and PriPrune's skipped step name float32. optax's Adam and Yogi
compute their bias correction in the default float; the engine's optimizers
trace as without x64 (``fedsim.x64``).
"""

import jax
import numpy as np
import pytest

from fedsim.config import Config, from_dict
from fedsim.simulation import Simulation

RUNS = {
    # Random pruning draws the global mask; Mix withholds a random share of the
    # update (defense_prune.py's draw). The local steps are a lax.scan: its
    # skipped-step count was a Python float, float64 under x64, so the train loss
    # was divided in float64 (its 8th digit moved; 3 steps, so not by a power of 2).
    "prune_mix_on_random": {
        "pruning": {"scheme": "random", "p": 0.4},
        "defenses": [{"name": "prune_mix", "p_largest": 0.2, "p_random": 0.2}],
        "training": {"unroll_steps": 0, "batch_size": 6}},
    # FedDST regrows at random when it reconfigures (round 1); PriPrune's local
    # steps are a lax.cond between a step and a skipped one.
    "priprune_on_feddst": {
        "pruning": {"scheme": "feddst", "p": 0.4, "reconfigurations": 2, "reconfigure_every": 1},
        "defenses": [{"name": "priprune"}]},
    # Adam / AdamW at the clients, Adam / Yogi at the server: the bias correction
    # 1 - b**count was float64 under x64 (fails without fedsim.x64).
    "adam_clients_yogi_server": {"training": {"optimizer": "adam", "lr": 0.01,
                                              "server_optimizer": "yogi", "server_lr": 0.1}},
    "adamw_clients_adam_server": {"training": {"optimizer": "adamw", "lr": 0.01,
                                               "weight_decay": 0.01,
                                               "server_optimizer": "adam", "server_lr": 0.1}},
}


def _final_params(extra: dict) -> tuple[np.ndarray, set]:
    extra = dict(extra)
    training = {"rounds": 2, "clients_per_round": 2, "batch_size": 8,
                "client_parallelism": "loop", "loop_clients_per_call": 1,
                **extra.pop("training", {})}
    cfg = from_dict(Config, {
        "seed": 1,
        "data": {"dataset": "synthetic", "num_clients": 8, "image_size": 8, "max_train": 128},
        "model": {"name": "mlp"},
        "training": training,
        **extra})
    sim = Simulation(cfg)
    state = sim.init_state()
    losses = []
    for r in range(2):
        state, res = sim.run_round(state, r)
        losses.append(res.train_loss)
    leaves = jax.tree_util.tree_leaves(state.params)
    return (np.concatenate([np.asarray(leaf).ravel() for leaf in leaves]),
            {str(leaf.dtype) for leaf in leaves}, losses)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_float32_run_is_the_same_under_x64(name):
    assert not jax.config.jax_enable_x64
    plain, dtypes, losses = _final_params(RUNS[name])
    with jax.enable_x64(True):
        wide, wide_dtypes, wide_losses = _final_params(RUNS[name])
    assert dtypes == wide_dtypes == {"float32"}
    np.testing.assert_array_equal(wide, plain)
    assert wide_losses == losses
