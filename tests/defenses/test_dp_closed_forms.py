"""DP defenses against independent numpy references: L1 clipping of update_laplace,
the one-real-example mean of dp_gaussian, and the worst-client ε of the accountant."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from defenses import accounting
from defenses.dp import dp_gaussian, update_laplace
from fedsim.simulation import Simulation
from tests.defenses.dp_helpers import context, flat_rows, per_example_tree
from tests.fedsim.helpers import small_config, small_dataset


def _flat(tree):
    return np.concatenate([np.asarray(l, np.float64).ravel() for l in jax.tree_util.tree_leaves(tree)])


@pytest.mark.parametrize("clip", [0.5, 3.0])
def test_update_laplace_clips_the_whole_update_in_l1(clip):
    """With ``clip_norm`` C, update_laplace is the Laplace mechanism with L1 sensitivity C:
    the flattened update v becomes v / max(1, ‖v‖₁ / C) (numpy, float64) before the
    (here negligible, b = 1e-9) noise. The update's L2 norm is below C and its L1 norm above,
    so clipping in L2 would leave it untouched."""
    update = {"w": jnp.full((4, 5), 0.1, jnp.float32) * jnp.arange(1, 21).reshape(4, 5) / 10,
              "b": -0.05 * jnp.ones((7,), jnp.float32)}
    v = _flat(update)
    scale_to = clip / np.linalg.norm(v, 1)  # so that ‖v‖₁ = 4C and ‖v‖₂ < C
    update = jax.tree_util.tree_map(lambda u: u * jnp.float32(4 * scale_to), update)
    v = _flat(update)
    assert np.linalg.norm(v, 1) > clip > np.linalg.norm(v, 2)
    d = update_laplace(1e-9, clip_norm=clip)
    out, _ = d.apply(update, d.init(None), key=jax.random.key(0))
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(update)
    want = v / max(1.0, np.abs(v).sum() / clip)
    np.testing.assert_allclose(_flat(out), want, rtol=1e-5, atol=1e-7)
    assert np.abs(_flat(out)).sum() == pytest.approx(clip, rel=1e-5)


def test_update_laplace_leaves_an_update_inside_the_l1_ball_alone():
    """‖v‖₁ < C: the clip is the identity (numpy: v / max(1, ‖v‖₁/C) = v)."""
    update = {"w": 0.01 * jnp.ones((3, 3), jnp.float32)}
    d = update_laplace(1e-9, clip_norm=1.0)
    out, _ = d.apply(update, d.init(None), key=jax.random.key(3))
    np.testing.assert_allclose(_flat(out), _flat(update), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("real", [0, 5])
def test_dp_gaussian_mean_over_a_single_real_example_is_its_clipped_gradient(real):
    """Alg 1 divides the clipped sum by the number L of real examples; with L = 1 the
    (noise-free) output is that one example's gradient clipped to C (numpy, float64),
    whatever the padding rows hold."""
    tree = per_example_tree(jax.random.key(7))
    mask = np.zeros(8, np.float32)
    mask[real] = 1.0
    d = dp_gaussian(0.0, clip_norm=2.0)
    g, _ = d.apply(tree, (), key=jax.random.key(0), context=context(mask))
    row = np.asarray(flat_rows(tree), np.float64)[real]  # leaves in tree order: v, w
    want = row / max(1.0, np.linalg.norm(row) / 2.0)
    assert np.linalg.norm(row) > 2.0  # the clip is active
    got = np.concatenate([np.asarray(g["v"]).ravel(), np.asarray(g["w"]).ravel()])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_accountant_reports_the_worst_client_among_unequal_ones(tmp_path):
    """Clients of unequal size (Dirichlet α = 0.3) have unequal ε; after a round in which
    all train, the accountant reports the MAX over clients of gaussian_epsilon at their own
    q = B/n_c and T = ⌈n_c/B⌉ (recomputed here), and the client attaining it."""
    cfg = small_config(**{"output.dir": str(tmp_path), "training.algorithm": "fedavg",
                          "training.local_epochs": 1, "data.partition": "dirichlet",
                          "data.alpha": 0.3, "training.rounds": 1,
                          "training.clients_per_round": 6})
    cfg = dataclasses.replace(cfg, defenses=[{"name": "dp_gaussian", "noise_multiplier": 1.1,
                                              "clip_norm": 1.0}])
    sim = Simulation(cfg, dataset=small_dataset())
    counts = [int(c) for c in sim.client_counts]
    delta = 1.0 / max(counts)
    per_client = [accounting.gaussian_epsilon(1.1, min(1.0, 16 / c), delta,
                                              steps=math.ceil(c / 16)).epsilon for c in counts]
    assert max(per_client) > 1.01 * min(per_client), counts  # the clients do differ

    row = {}
    for cb in sim.round_callbacks:
        row.update(cb(0, row) or {})
    assert row["epsilon"] == pytest.approx(max(per_client), rel=1e-9)
    assert row["epsilon_client"] == int(np.argmax(per_client))
