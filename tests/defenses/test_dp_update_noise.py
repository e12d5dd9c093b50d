"""Upload-stage noise: Soteria's DP-Gaussian / DP-Laplace, client-level DP."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from defenses.dp import client_level_dp, update_gaussian, update_laplace


def _upload():
    return {"w": jnp.zeros((60, 50)), "b": jnp.zeros((500,))}


def _flat(tree):
    return np.concatenate([np.asarray(l).ravel() for l in jax.tree_util.tree_leaves(tree)])


@pytest.mark.parametrize("factor,should_pass", [(1.0, True), (2 / 3, False), (1.5, False)])
def test_gaussian_update_noise_ks(factor, should_pass):
    out, _ = update_gaussian(0.01).apply(_upload(), (), key=jax.random.key(0))
    p = stats.kstest(_flat(out), "norm", args=(0, factor * 0.01)).pvalue
    assert (p > 0.01) == should_pass, p


@pytest.mark.parametrize("factor,should_pass", [(1.0, True), (2 / 3, False), (1.5, False)])
def test_laplace_update_noise_ks(factor, should_pass):
    out, _ = update_laplace(0.05).apply(_upload(), (), key=jax.random.key(1))
    p = stats.kstest(_flat(out), "laplace", args=(0, factor * 0.05)).pvalue
    assert (p > 0.01) == should_pass, p


def test_client_level_dp_clips_and_shares_noise():
    big = {"w": 100 * jnp.ones((60, 50)), "b": jnp.zeros((500,))}
    d = client_level_dp(clip_norm=1.0, noise_multiplier=1e-6, clients_per_round=4)
    out, _ = d.apply(big, (), key=jax.random.key(2))
    assert abs(np.linalg.norm(_flat(out)) - 1.0) < 1e-3
    zero_out, _ = client_level_dp(2.0, 1.5, 9).apply(_upload(), (), key=jax.random.key(3))
    assert stats.kstest(_flat(zero_out), "norm", args=(0, 1.5 * 2.0 / 3)).pvalue > 0.01


def test_contract_and_errors():
    d = update_laplace(0.1, clip_norm=5.0)
    u = {"w": jnp.ones((4, 3)), "b": jnp.ones((3,))}
    a, _ = d.apply(u, (), key=jax.random.key(1))
    b, _ = d.apply(u, (), key=jax.random.key(1))
    c, _ = d.apply(u, (), key=jax.random.key(2))
    j, _ = jax.jit(lambda x, k: d.apply(x, (), key=k))(u, jax.random.key(1))
    chex.assert_trees_all_close(a, b)
    chex.assert_trees_all_close(a, j, rtol=1e-5, atol=1e-6)
    assert not np.allclose(a["w"], c["w"])
    chex.assert_shape(a["w"], (4, 3))
    assert d.stage == "upload"
    with pytest.raises(ValueError, match="sigma"):
        update_gaussian(0.0)
    with pytest.raises(ValueError, match="clients_per_round"):
        client_level_dp(1.0, 1.0, 0)


@pytest.mark.parametrize("m", [2.5, True, "3", float("inf"), 0, -1])
def test_client_level_dp_needs_a_positive_integer_cohort(m):
    with pytest.raises(ValueError, match="clients_per_round must be a positive integer"):
        client_level_dp(1.0, 1.0, m)


def test_a_simulation_refuses_client_level_dp_that_does_not_match_its_cohort():
    """The shares add up to σC only over the m clients summed, weighed alike."""
    from fedsim.config import ConfigError
    from fedsim.simulation import Simulation
    from tests.fedsim.helpers import small_config, small_dataset

    spec = "[{name: client_level_dp, clip_norm: 1.0, noise_multiplier: 1.0, clients_per_round: %d}]"
    ds = small_dataset()
    with pytest.raises(ConfigError, match="training.clients_per_round=3"):
        Simulation(small_config(**{"defenses": spec % 5, "training.weighting": "uniform"}), ds)
    with pytest.raises(ConfigError, match="training.weighting: uniform"):
        Simulation(small_config(**{"defenses": spec % 3}), ds)
    sim = Simulation(small_config(**{"defenses": spec % 3, "training.weighting": "uniform"}), ds)
    assert sim.defenses["upload"].name == "client_level_dp(C=1,sigma=1,m=3)"


def test_the_cohort_check_travels_with_the_defense_not_its_name():
    """Chained after another upload defense, or renamed, it is still checked."""
    from fedsim.config import ConfigError
    from fedsim.hooks import chain
    from fedsim.simulation import Simulation
    from tests.fedsim.helpers import small_config, small_dataset

    ds = small_dataset()
    cfg = small_config(**{"training.weighting": "uniform"})  # samples 3 clients a round
    renamed = client_level_dp(1.0, 1.0, 5)._replace(name="my_dp")
    chained = chain(update_gaussian(0.1), client_level_dp(1.0, 1.0, 5))
    for d in (renamed, chained):
        with pytest.raises(ConfigError, match="clients_per_round=5"):
            Simulation(cfg, ds, defenses={"upload": d})
    sim = Simulation(cfg, ds, defenses={"upload": client_level_dp(1.0, 1.0, 3)._replace(name="x")})
    assert sim.defenses["upload"].config_checks
