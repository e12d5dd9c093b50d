"""Gaussian accountant through dp_accounting; conversions and amplification."""

import dp_accounting
import numpy as np
import pytest

from defenses.accounting import (
    gaussian_epsilon,
    gaussian_noise_for_epsilon,
    gaussian_rdp,
    gaussian_rdp_unsampled,
    kairouz_composition,
    poisson_subsampled_rdp,
    rdp_to_epsilon,
    subsample_dp,
)


def test_rdp_golden_values_from_dp_accounting_tests():
    # dp_accounting rdp_privacy_accountant_test.test_compute_rdp_poisson_sampled_gaussian
    rdp = gaussian_rdp(2.5, 0.01, [1.5, 2.5, 5, 50, 100], steps=50)
    np.testing.assert_allclose(
        rdp, [6.70579741e-04, 1.08548710e-03, 2.18075656e-03, 2.38460375e-02, 1.67416308e02],
        rtol=1e-4)


def test_prop4_conversion_matches_dp_accounting():
    orders = np.arange(2, 64, dtype=float)
    rdp = gaussian_rdp(1.1, 0.01, orders, steps=1000)
    ours = rdp_to_epsilon(orders, rdp, 1e-5)
    ref = dp_accounting.rdp.compute_epsilon(orders, rdp, 1e-5)
    assert ours[0] == pytest.approx(ref[0], rel=1e-9)
    assert ours[1] == ref[1]


def test_epsilon_rdp_vs_pld_and_calibration_round_trip():
    rdp = gaussian_epsilon(1.1, 0.01, 1e-5, steps=1000)
    pld = gaussian_epsilon(1.1, 0.01, 1e-5, steps=1000, accountant="pld")
    assert rdp.approach == "rdp" and pld.approach == "pld" and pld.alpha is None
    assert 0.7 * rdp.epsilon < pld.epsilon <= rdp.epsilon  # PLD is tighter
    sigma = gaussian_noise_for_epsilon(rdp.epsilon, 0.01, 1e-5, steps=1000)
    assert sigma == pytest.approx(1.1, rel=1e-3)


def test_zhu_wang_bound_upper_bounds_exact_subsampled_gaussian():
    orders = np.arange(2, 33, dtype=float)
    bound = poisson_subsampled_rdp(gaussian_rdp_unsampled(2.0, orders), 0.05)
    exact = gaussian_rdp(2.0, 0.05, orders, steps=1)
    assert np.all(bound >= exact * (1 - 1e-9))
    assert np.all(bound[:10] <= 3 * exact[:10])  # and is not vacuous at small orders
    np.testing.assert_allclose(poisson_subsampled_rdp([0.3, 0.4], 1.0), [0.3, 0.4])


def test_subsample_and_kairouz():
    eps_s, d_s = subsample_dp(1.0, 1e-3, 0.1)
    assert eps_s == pytest.approx(np.log(1 + 0.1 * (np.e - 1)))
    assert d_s == pytest.approx(1e-4)
    eps, delta = kairouz_composition(0.01, 0.0, 1000, 1e-5)
    assert eps < 1000 * 0.01
    assert delta == pytest.approx(1e-5)
    assert kairouz_composition(0.5, 0.0, 3, 1e-5)[0] == pytest.approx(1.5)


@pytest.mark.parametrize("kwargs,name", [
    (dict(noise_multiplier=0.0), "sigma"), (dict(noise_multiplier=-1.0), "sigma"),
    (dict(sample_rate=0.0), "sample_rate"), (dict(delta=1.5), "delta"),
])
def test_gaussian_rejects_bad_input(kwargs, name):
    args = dict(noise_multiplier=1.0, sample_rate=0.01, delta=1e-5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        gaussian_epsilon(**args, steps=10)
