"""attack.shard_victims: an attack's victims split over devices (jax.shard_map).

The multi-device cases run in a subprocess with 4 forced CPU devices; the
two-process case is in test_distributed_attack.py.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attacks.gradient_inversion import (AttackConfigError, InversionConfig, inversion_config,
                                        invert_victims)
from fedsim.client import masked_mean_loss
from fedsim.models import build_model, init_params, make_apply_fn

ROOT = Path(__file__).resolve().parents[2]
SHAPE = (16, 16, 1)

SETUP = """
import jax, jax.numpy as jnp, numpy as np
from attacks.gradient_inversion import InversionConfig, invert_victims
from fedsim.client import masked_mean_loss
from fedsim.models import build_model, init_params, make_apply_fn
V = 6
m = build_model("mlp"); f = make_apply_fn(m); p = init_params(m, (16, 16, 1), jax.random.key(0))
rng = np.random.default_rng(0)
x = jnp.asarray(rng.random((V, 2, 16, 16, 1)), jnp.float32)
y = jnp.asarray(rng.integers(0, 10, (V, 2)), jnp.int32)
g = jax.vmap(lambda xi, yi: jax.grad(masked_mean_loss, argnums=1)(f, p, xi, yi, jnp.ones(2)))(x, y)
keys = jax.random.split(jax.random.key(1), V)
# Plain Adam on the l2 loss without TV: signed Adam would turn float rounding
# into sign flips, and on this MLP the cosine loss moves the sharded run
# 2.5e-4 from the one-device run after 20 steps (rounding of the differently
# blocked matmuls, amplified by Adam's normalisation), where the l2 loss keeps
# the two runs equal. The MLP keeps the five compiles cheap.
cfg = InversionConfig(iterations=20, signed=False, loss="l2", tv=0.0)
kw = dict(batch_size=2, input_shape=(16, 16, 1), num_classes=10)
"""


def _run_on_devices(body: str, devices: int = 4) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    code = SETUP + textwrap.dedent(body)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=600, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_sharded_victims_match_one_device_and_really_spread_and_a_bad_pin_is_named():
    r = _run_on_devices("""
        import json
        from attacks import gradient_inversion as GI
        one = invert_victims(f, cfg, p, g, y, keys, shared_params=True, **kw)
        split = invert_victims(f, cfg, p, g, y, keys, shared_params=True, shard_victims=True, **kw)
        pinned = invert_victims(f, cfg, p, g, y, keys, shared_params=True, shard_victims=True,
                                victims_per_call=4, **kw)
        own = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (V, *a.shape)), p)
        per = invert_victims(f, cfg, own, g, y, keys, shard_victims=True, **kw)
        mesh = GI.victim_mesh(True)
        four = lambda t: jax.tree_util.tree_map(lambda a: a[:4], t)
        hlo = GI._compiled(f, cfg, 2, (16, 16, 1), 10, True, mesh).lower(
            p, four(g), y[:4], keys[:4]).compile().as_text()
        try:  # 6 victims per call do not divide over 4 devices
            invert_victims(f, cfg, p, g, y, keys, shared_params=True, shard_victims=True,
                           victims_per_call=6, **kw)
            error = None
        except GI.AttackConfigError as e:
            error = str(e)
        diff = lambda o: float(np.abs(o["x"] - one["x"]).max())
        print(json.dumps({"devices": [one["devices"], split["devices"]],
                          "per_call": [one["victims_per_call"], split["victims_per_call"],
                                       pinned["victims_per_call"], per["victims_per_call"]],
                          "diff": [diff(split), diff(pinned), diff(per)],
                          "labels": bool((split["labels"] == one["labels"]).all()),
                          "all_gather": "all-gather" in hlo, "mesh": mesh.size,
                          "error": error}))
    """)
    assert r["devices"] == [1, 4] and r["mesh"] == 4
    # 6 victims on 4 devices: one call padded to 8; pinned at 4: two calls.
    assert r["per_call"] == [6, 8, 4, 8]
    assert max(r["diff"]) < 1e-4 and r["labels"]
    # The sharded executable gathers each device's block: it did split them.
    assert r["all_gather"]
    assert "6 is not a multiple of the 4 devices" in r["error"]
    assert "attack.config.shard_victims" in r["error"]


def test_on_one_device_sharding_changes_nothing():
    assert len(jax.devices()) == 1
    m = build_model("mlp")
    f = make_apply_fn(m)
    p = init_params(m, SHAPE, jax.random.key(0))
    x = jnp.asarray(np.random.default_rng(0).random((3, 1, *SHAPE)), jnp.float32)
    y = jnp.zeros((3, 1), jnp.int32)
    g = jax.vmap(lambda xi, yi: jax.grad(masked_mean_loss, argnums=1)(f, p, xi, yi, jnp.ones(1)))(x, y)
    keys = jax.random.split(jax.random.key(1), 3)
    cfg = InversionConfig(iterations=5)
    kw = dict(batch_size=1, input_shape=SHAPE, num_classes=10, shared_params=True)
    a = invert_victims(f, cfg, p, g, y, keys, **kw)
    b = invert_victims(f, cfg, p, g, y, keys, shard_victims=True, **kw)
    assert b["devices"] == 1 and b["victims_per_call"] == 3
    np.testing.assert_array_equal(a["x"], b["x"])


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_shard_victims_must_be_a_boolean(value):
    with pytest.raises(AttackConfigError, match="attack.config.shard_victims: must be true or false"):
        inversion_config({"shard_victims": value}, {"iterations": 10})
