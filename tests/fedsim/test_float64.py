"""``training.dtype: float64``: a whole run in 64-bit floats, to check float32 numbers.

The float64 run starts from the float32 run's model (its initialisation cast),
so the two differ by rounding only.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from fedsim.checkpoint import config_fingerprint
from fedsim.config import ConfigError
from fedsim.simulation import Simulation

from .helpers import small_config, small_dataset

FLOAT64 = {"training.dtype": "float64"}


def _run(cfg, rounds=2):
    sim = Simulation(cfg, dataset=small_dataset())
    state = sim.init_state()
    first = state.params
    for r in range(rounds):
        state, _ = sim.run_round(state, r)
    return first, state, sim


def _leaves(tree):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


def test_float64_without_64_bit_jax_is_refused_by_name():
    assert not jax.config.jax_enable_x64
    with pytest.raises(ConfigError, match=r"config key 'training.dtype' \(float64\).*"
                                          r"JAX_ENABLE_X64=1"):
        Simulation(small_config(**FLOAT64), dataset=small_dataset())


def test_a_float64_run_starts_from_the_float32_model_and_stays_in_float64():
    first32, state32, _ = _run(small_config())
    with jax.enable_x64(True):
        first64, state64, sim = _run(small_config(**FLOAT64))
        acc, loss = sim.evaluate(state64.params)
    for a, b in zip(_leaves(first32), _leaves(first64)):
        assert a.dtype == np.float32 and b.dtype == np.float64
        np.testing.assert_array_equal(b, a.astype(np.float64))
    assert {a.dtype for a in _leaves(state64.params)} == {np.dtype(np.float64)}
    assert {a.dtype for a in _leaves(state64.opt_state) if a.dtype.kind == "f"} <= {
        np.dtype(np.float64)}
    assert sim.dataset.x_train.dtype == np.float64 and np.isfinite(loss) and 0 <= acc <= 1
    # Two rounds apart by rounding only.
    for a, b in zip(_leaves(state32.params), _leaves(state64.params)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_strategies_agree_to_float64_rounding():
    # vmap's batched programs run float64 too, and agree with the loop's to float64
    # rounding (on conv models float32's do not agree bit for bit:
    # benchmarks/results/diagnose_vmap_rounding.md).
    with jax.enable_x64(True):
        looped = _leaves(_run(small_config(**FLOAT64))[1].params)
        vmapped = _leaves(_run(small_config(**FLOAT64, **{
            "training.client_parallelism": "vmap"}))[1].params)
    for a, b in zip(looped, vmapped):
        assert a.dtype == b.dtype == np.float64
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_float64_is_in_the_fingerprint_and_float32_hashes_as_before():
    base = small_config()
    assert config_fingerprint(small_config(**{"training.dtype": "float32"})) == \
        config_fingerprint(base)
    assert config_fingerprint(small_config(**FLOAT64)) != config_fingerprint(base)


def test_fedsim_run_turns_on_64_bit_jax_and_records_the_models_type(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    config = tmp_path / "tiny.yaml"
    config.write_text(json.dumps({
        "data": {"dataset": "synthetic", "num_clients": 4, "image_size": 8, "max_train": 64},
        "model": {"name": "mlp"},
        "training": {"rounds": 1, "clients_per_round": 2, "client_parallelism": "loop",
                     "unroll_steps": 0},
        "output": {"plots": False, "progress": False}}))
    summaries = {}
    for dtype in ("float32", "float64"):
        out = tmp_path / dtype
        proc = subprocess.run([sys.executable, "-m", "fedsim", "run", str(config), "--quiet",
                               "--set", f"training.dtype={dtype}", "--set", f"output.dir={out}"],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        summaries[dtype] = json.loads((out / "summary.json").read_text())
    assert summaries["float32"]["params_dtype"] == "float32"
    assert summaries["float64"]["params_dtype"] == "float64"
    assert summaries["float64"]["test_loss"] == pytest.approx(summaries["float32"]["test_loss"],
                                                              rel=1e-3)
