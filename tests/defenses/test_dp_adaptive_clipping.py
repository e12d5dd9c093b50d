"""Adaptive clipping to a private quantile (Andrew et al. 2021), defenses/dp/adaptive_clipping.py.

References used: dp_accounting's RDP accountant for the joint analysis (§3),
a numpy round written from the module docstring's equations, the sample
moments of the noise over many keys, and the quantiles of a log-normal
norm distribution in closed form for the tracking (§2).
"""

from __future__ import annotations

import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from defenses.accounting import dp_fedavg_epsilon
from defenses.dp.adaptive_clipping import (clip_to_quantile_estimate, quantile_dp_fedavg,
                                           update_noise_multiplier)


def _updates(key, count, scales):
    """A stack of ``count`` updates with L2 norms exactly ``scales`` [count]."""
    k1, k2 = jax.random.split(key)
    w = jax.random.normal(k1, (count, 4, 5))
    b = jax.random.normal(k2, (count, 3))
    norms = jnp.sqrt(jnp.sum(w * w, axis=(1, 2)) + jnp.sum(b * b, axis=1))
    f = jnp.asarray(scales) / norms
    return {"w": w * f[:, None, None], "b": b * f[:, None]}


def _flat_np(tree):
    return np.concatenate([np.asarray(tree["b"]).reshape(tree["b"].shape[0], -1),
                           np.asarray(tree["w"]).reshape(tree["w"].shape[0], -1)], axis=1)


# --- the joint analysis (§3) -------------------------------------------------


@pytest.mark.parametrize("z, sigma_b", [(1.0, 5.0), (0.8, 0.5), (2.0, 1.01)])
def test_the_update_and_count_noise_compose_to_one_gaussian_at_z(z, sigma_b):
    """The update at z_Δ and the count (sensitivity ½) at σ_b are, composed, the
    Gaussian mechanism at z: dp_accounting's RDP of the two events against the one."""
    z_delta = update_noise_multiplier(z, sigma_b)
    assert z_delta > z
    joint = dp_accounting.rdp.RdpAccountant()
    joint.compose(dp_accounting.ComposedDpEvent([
        dp_accounting.GaussianDpEvent(z_delta),
        dp_accounting.GaussianDpEvent(2.0 * sigma_b)]))  # noise σ_b over sensitivity ½
    single = dp_accounting.rdp.RdpAccountant()
    single.compose(dp_accounting.GaussianDpEvent(z))
    assert joint.get_epsilon(1e-5) == pytest.approx(single.get_epsilon(1e-5), rel=1e-9)
    # ...and the run is accounted as DP-FedAvg at z (unsampled rounds: q = 1).
    assert dp_fedavg_epsilon(z, 1.0, 1e-5, sampled_rounds=1).epsilon == pytest.approx(
        single.get_epsilon(1e-5), rel=1e-6)


def test_a_count_noise_that_spends_the_whole_budget_is_refused_by_name():
    # The default σ_b = m/20 is 0.5 at m = 10: 2σ_b = 1 is not above z = 1.
    with pytest.raises(ValueError, match="clipped_count_stddev=0.5 is too small"):
        quantile_dp_fedavg(1.0, 10)
    agg = quantile_dp_fedavg(1.0, 10, clipped_count_stddev=5.0)
    assert agg.update_noise_multiplier == pytest.approx((1.0 - 0.01) ** -0.5)
    assert agg.noise_multiplier == 1.0
    assert quantile_dp_fedavg(1.0, 100).clipped_count_stddev == pytest.approx(5.0)
    zero = quantile_dp_fedavg(0.0, 10)
    assert (zero.update_noise_multiplier, zero.clipped_count_stddev) == (0.0, 0.0)


@pytest.mark.parametrize("kwargs, name", [
    ({"noise_multiplier": -1.0}, "noise_multiplier"),
    ({"noise_multiplier": float("nan")}, "noise_multiplier"),
    ({"expected_clients_per_round": 0}, "expected_clients_per_round"),
    ({"initial_clip_norm": 0.0}, "initial_clip_norm"),
    ({"initial_clip_norm": float("inf")}, "initial_clip_norm"),
    ({"target_unclipped_quantile": 1.5}, "target_unclipped_quantile"),
    ({"target_unclipped_quantile": -0.1}, "target_unclipped_quantile"),
    ({"clip_learning_rate": -0.2}, "clip_learning_rate"),
    ({"clipped_count_stddev": -1.0}, "clipped_count_stddev"),
    ({"geometric_update": "yes"}, "geometric_update"),
])
def test_bad_parameters_are_named(kwargs, name):
    args = {"noise_multiplier": 0.5, "expected_clients_per_round": 100, **kwargs}
    with pytest.raises(ValueError, match=name):
        quantile_dp_fedavg(args.pop("noise_multiplier"), args.pop("expected_clients_per_round"),
                           **args)


def test_a_missing_key_is_named():
    agg = quantile_dp_fedavg(0.5, 100)
    ups = _updates(jax.random.key(0), 4, jnp.ones(4))
    for call in (lambda: agg.apply(ups, agg.init(), key=None),
                 lambda: agg.aggregate(jax.tree_util.tree_map(lambda a: a[0], ups), 0.0,
                                       agg.init(), key=3)):
        with pytest.raises(TypeError, match="quantile_dp_fedavg .*needs .*key"):
            call()


def test_a_present_mask_of_the_wrong_shape_is_named():
    agg = quantile_dp_fedavg(0.0, 4)
    ups = _updates(jax.random.key(0), 4, jnp.ones(4))
    with pytest.raises(ValueError, match=r"present must have shape \(4,\)"):
        agg.apply(ups, agg.init(), key=jax.random.key(1), present=jnp.ones(3))
    for bad in ([1, 2, 1, 0], [1, float("nan"), 1, 1], [0.5, 1, 1, 1]):
        with pytest.raises(ValueError, match="present must hold 0 .* or 1"):
            agg.apply(ups, agg.init(), key=jax.random.key(1), present=jnp.asarray(bad))
    agg.apply(ups, agg.init(), key=jax.random.key(1), present=jnp.asarray([1, 0, 1, 1]))


# --- one round against numpy -------------------------------------------------


@pytest.mark.parametrize("geometric", [True, False])
def test_one_noiseless_round_is_the_papers_round_in_numpy(geometric):
    """Alg 1 without noise: the mean of the clipped updates over the fixed m, and
    C' from b̃ = Σ(b − ½)/m + ½, with absent and NaN clients left out."""
    m, clip, gamma, eta = 8, 1.0, 0.3, 0.7
    norms = np.array([0.2, 0.5, 1.0, 1.5, 3.0, 0.9, 2.0, 0.1], np.float32)
    ups = _updates(jax.random.key(3), 8, norms)
    ups["w"] = ups["w"].at[6, 0, 0].set(jnp.nan)  # client 6 diverged
    present = np.array([1, 1, 1, 1, 1, 0, 1, 1], np.float32)  # client 5 not sampled
    agg = quantile_dp_fedavg(0.0, m, initial_clip_norm=clip, target_unclipped_quantile=gamma,
                             clip_learning_rate=eta, geometric_update=geometric)
    mean, state, info = jax.jit(agg.apply)(ups, agg.init(), key=jax.random.key(9),
                                           present=jnp.asarray(present))

    rows = _flat_np(ups)
    counted = present * np.all(np.isfinite(rows), axis=1)
    rows = np.where(counted[:, None] > 0, rows, 0.0)
    scale = 1.0 / np.maximum(1.0, norms / clip)
    expected_mean = (counted * scale) @ rows / m
    bits = (norms <= clip).astype(np.float64)  # ≤: the client at exactly C is unclipped
    fraction = np.clip(np.sum(counted * (bits - 0.5)) / m + 0.5, 0, 1)
    expected_clip = (clip * math.exp(-eta * (fraction - gamma)) if geometric
                     else max(clip - eta * (fraction - gamma), 0.0))

    np.testing.assert_allclose(_flat_np(jax.tree_util.tree_map(lambda a: a[None], mean))[0],
                               expected_mean, rtol=1e-5, atol=1e-7)
    assert float(info["noised_unclipped_fraction"]) == pytest.approx(fraction, abs=1e-7)
    assert float(state.clip_norm) == pytest.approx(expected_clip, rel=1e-6)
    assert float(info["clip_norm"]) == clip
    assert int(info["nonfinite"]) == 1
    # Not sampled, a NaN update is no client's business: nothing is counted.
    _, _, info2 = agg.apply(ups, agg.init(), key=jax.random.key(9),
                            present=jnp.asarray(present).at[6].set(0.0))
    assert int(info2["nonfinite"]) == 0


def test_the_linear_update_stops_at_zero_and_the_fraction_is_clamped():
    # Every client unclipped, η = 5, γ = 0: C − 5·1 < 0 → 0. A huge count noise
    # draws b̃ far outside [0, 1]; it is clamped before the update.
    agg = quantile_dp_fedavg(0.0, 4, initial_clip_norm=2.0, target_unclipped_quantile=0.0,
                             clip_learning_rate=5.0, geometric_update=False)
    ups = _updates(jax.random.key(0), 4, jnp.full(4, 0.5))
    _, state, info = agg.apply(ups, agg.init(), key=jax.random.key(1))
    assert float(info["noised_unclipped_fraction"]) == 1.0
    assert float(state.clip_norm) == 0.0
    # At C = 0 every update is clipped to 0 (a zero update too: no 0/0 NaN).
    ups0 = jax.tree_util.tree_map(lambda a: a.at[0].set(0.0), ups)
    mean, _, info0 = agg.apply(ups0, state, key=jax.random.key(2))
    assert all(not np.any(np.asarray(a)) for a in jax.tree_util.tree_leaves(mean))
    assert int(info0["nonfinite"]) == 0
    noisy = quantile_dp_fedavg(0.0, 4, clipped_count_stddev=1e4, clip_learning_rate=0.2)
    fractions = [float(noisy.apply(ups, noisy.init(), key=jax.random.key(s))[2][
        "noised_unclipped_fraction"]) for s in range(6)]
    assert set(fractions) <= {0.0, 1.0} and len(set(fractions)) == 2


def test_the_client_half_summed_and_the_server_half_are_apply():
    """Secure aggregation's view: summing clip_to_quantile_estimate over the
    cohort and calling aggregate gives apply's round, same key."""
    agg = quantile_dp_fedavg(1.0, 6, clipped_count_stddev=2.0, initial_clip_norm=0.8)
    ups = _updates(jax.random.key(4), 6, jnp.array([0.1, 0.5, 0.79, 0.81, 2.0, 5.0]))
    state, key = agg.init(), jax.random.key(11)
    halves = [clip_to_quantile_estimate(jax.tree_util.tree_map(lambda a: a[i], ups),
                                        state.clip_norm) for i in range(6)]
    assert [float(b) for _, b in halves] == [0.5, 0.5, 0.5, -0.5, -0.5, -0.5]
    for (clipped, _), norm in zip(halves, [0.1, 0.5, 0.79, 0.8, 0.8, 0.8]):
        assert float(jnp.sqrt(sum(jnp.sum(c * c) for c in jax.tree_util.tree_leaves(
            clipped)))) == pytest.approx(norm, rel=1e-5)
    total = jax.tree_util.tree_map(lambda *c: sum(c), *[c for c, _ in halves])
    bit_sum = sum(b for _, b in halves)
    a = agg.aggregate(total, bit_sum, state, key=key)
    b = agg.apply(ups, state, key=key)
    for x, y in zip(jax.tree_util.tree_leaves(a[:2]), jax.tree_util.tree_leaves(b[:2])):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-7)


# --- the noise ---------------------------------------------------------------


def test_the_noise_has_the_stated_scales_and_is_independent():
    """Over 4,000 keys: the update's noise has std z_Δ C/m per coordinate, b̃'s
    has σ_b/m, both centred on the noiseless values, and they are uncorrelated."""
    m, z, sigma_b, clip, eta = 20, 1.0, 1.0, 0.5, 0.2
    agg = quantile_dp_fedavg(z, m, clipped_count_stddev=sigma_b, initial_clip_norm=clip,
                             clip_learning_rate=eta)
    norms = jnp.concatenate([jnp.full(10, 0.25), jnp.full(10, 2.0)])  # half unclipped
    ups = _updates(jax.random.key(5), m, norms)
    state = agg.init()
    run = jax.jit(jax.vmap(lambda k: agg.apply(ups, state, key=k)))
    mean, new_state, info = run(jax.random.split(jax.random.key(6), 4000))
    clean = quantile_dp_fedavg(0.0, m, initial_clip_norm=clip, clip_learning_rate=eta)
    mean0, _, info0 = clean.apply(ups, state, key=jax.random.key(0))

    value_noise = _flat_np(mean) - _flat_np(jax.tree_util.tree_map(lambda a: a[None], mean0))
    expected_std = update_noise_multiplier(z, sigma_b) * clip / m
    assert value_noise.std() == pytest.approx(expected_std, rel=0.02)
    assert abs(value_noise.mean()) < 4 * expected_std / math.sqrt(value_noise.size)

    fraction = np.asarray(info["noised_unclipped_fraction"])
    assert float(info0["noised_unclipped_fraction"]) == 0.5
    assert fraction.std() == pytest.approx(sigma_b / m, rel=0.05)
    assert abs(fraction.mean() - 0.5) < 4 * (sigma_b / m) / math.sqrt(fraction.size)
    # C' = C·exp(−η(b̃ − γ)) draw by draw.
    np.testing.assert_allclose(np.asarray(new_state.clip_norm),
                               clip * np.exp(-eta * (fraction - 0.5)), rtol=1e-5)
    r, _ = stats.pearsonr(value_noise[:, 0], fraction)
    assert abs(r) < 0.06


# --- tracking (§2) -----------------------------------------------------------


@pytest.mark.parametrize("z, gamma", [(0.0, 0.5), (0.0, 0.2), (0.0, 0.8), (1.0, 0.5)])
def test_the_clip_norm_tracks_the_target_quantile_of_the_norms(z, gamma):
    """Norms log-normal(0, 1): the γ-quantile is exp(Φ⁻¹(γ)). From C₀ = 0.1 and
    η = 0.2 (the paper's), C over rounds 150–300 averages within 10 % of it,
    with and without the noise of z = 1 (σ_b = m/20)."""
    m = 100
    agg = quantile_dp_fedavg(z, m, target_unclipped_quantile=gamma)

    def round_(state, key):
        k1, k2, k3 = jax.random.split(key, 3)
        ups = _updates(k1, m, jnp.exp(jax.random.normal(k2, (m,))))
        _, state, info = agg.apply(ups, state, key=k3)
        return state, info["clip_norm"]

    _, clips = jax.jit(lambda s, ks: jax.lax.scan(round_, s, ks))(
        agg.init(), jax.random.split(jax.random.key(int(gamma * 10) + int(z)), 300))
    target = math.exp(stats.norm.ppf(gamma))
    assert float(clips[0]) == pytest.approx(0.1)
    assert float(np.exp(np.mean(np.log(np.asarray(clips[150:]))))) == pytest.approx(
        target, rel=0.10)
