"""``training.unroll_steps``: unrolled local steps or a scan, from the config."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedsim.checkpoint import config_fingerprint
from fedsim.config import UNROLL_STEPS, ConfigError, load_config
from fedsim.simulation import Simulation
from fedsim.typing import CohortData

from .helpers import ENGINE_UNROLL, small_config, small_dataset

# 6 clients of 600 examples, batch 16: each client takes several local steps.
STEPS_CONFIG = {"training.batch_size": 16}
#: small_config runs a scan (unroll_steps 0) for its compile time; here the default is set back.
DEFAULT = ENGINE_UNROLL


def _one_client_jaxpr(sim) -> str:
    n = sim.n_max
    data = CohortData(jnp.zeros((n, *sim.dataset.input_shape)), jnp.zeros((n,), jnp.int32),
                      jnp.ones((n,)), jnp.int32(n))
    state = sim.init_state()
    cs = jax.tree_util.tree_map(lambda a: a[0], state.client_states)
    return str(jax.make_jaxpr(sim.client_update)(state.params, data, cs, jax.random.key(0)))


def test_the_default_unrolls_and_zero_runs_a_scan():
    ds = small_dataset()
    assert load_config(None, []).training.unroll_steps == UNROLL_STEPS == 32
    unrolled = Simulation(small_config(**STEPS_CONFIG, **DEFAULT), dataset=ds)
    scanned = Simulation(small_config(**STEPS_CONFIG, unroll_steps=0), dataset=ds)
    assert unrolled.settings.unroll_steps == UNROLL_STEPS
    assert scanned.settings.unroll_steps == 0
    assert 1 < unrolled.settings.num_steps <= UNROLL_STEPS
    assert " scan[" not in _one_client_jaxpr(unrolled)
    assert " scan[" in _one_client_jaxpr(scanned)


def test_both_train_the_same_model_up_to_rounding():
    ds = small_dataset()

    def params(unroll):
        sim = Simulation(small_config(**STEPS_CONFIG, unroll_steps=unroll), dataset=ds)
        state = sim.init_state()
        for r in range(2):
            state, _ = sim.run_round(state, r)
        return jax.tree_util.tree_leaves(state.params)

    for a, b in zip(params(32), params(0)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_a_non_default_value_is_in_the_fingerprint_and_the_default_is_not():
    def fingerprint(*overrides):
        return config_fingerprint(load_config(None, ["data.dataset=synthetic", *overrides]))

    base = fingerprint()  # the key not given
    assert fingerprint(f"training.unroll_steps={UNROLL_STEPS}") == base
    assert fingerprint("training.unroll_steps=0") != base


def test_the_calibration_key_has_it_only_where_it_is_set():
    from fedsim.calibrate import calibration_key

    ds = small_dataset()
    assert "unroll_steps" not in calibration_key(Simulation(small_config(**DEFAULT), dataset=ds))
    assert '"unroll_steps": 4' in calibration_key(
        Simulation(small_config(unroll_steps=4), dataset=ds))


@pytest.mark.parametrize("value", ["-1", "2.5", "many"])
def test_a_bad_value_is_named(value):
    with pytest.raises(ConfigError, match="'training.unroll_steps'"):
        load_config(None, [f"training.unroll_steps={value}"])


def test_a_defense_that_asks_for_a_scan_gets_one_and_the_others_unroll():
    # dp_vmf's rejection sampler compiled again in every unrolled step (LeNet-5: an
    # 11× longer first round, paid back after 1,245 rounds;
    # benchmarks/results/unroll_steps_vmf_lenet5_cpu.md).
    from fedsim.hooks import build_defense, chain, identity

    ds = small_dataset()
    cfg = small_config(**STEPS_CONFIG, **DEFAULT)
    vmf = build_defense("dp_vmf", kappa=1000.0)
    gaussian = build_defense("dp_gaussian", noise_multiplier=1.0)
    assert vmf.scan_local_steps and not gaussian.scan_local_steps
    upload = build_defense("gc", p=0.5)
    assert chain(upload, identity("upload")._replace(scan_local_steps=True)).scan_local_steps
    assert not chain(upload, identity("upload")).scan_local_steps  # a chain keeps a part's hint
    for example, scan in ((vmf, True), (gaussian, False)):
        sim = Simulation(cfg, dataset=ds, defenses={"example": example})
        assert 1 < sim.settings.num_steps <= sim.settings.unroll_steps
        assert (" scan[" in _one_client_jaxpr(sim)) == scan, example.name
