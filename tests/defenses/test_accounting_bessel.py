"""log I_nu(x) against mpmath (arbitrary precision) and scipy."""

import mpmath
import numpy as np
import pytest
from scipy import special

from defenses.accounting import bessel_iv_ratio, log_bessel_iv

mpmath.mp.dps = 30

CASES = [
    (nu, x)
    for nu in [0.0, 0.5, 1.0, 3.5, 10.0, 49.5, 50.0, 51.0, 100.0, 500.0, 6849.0, 6850.0]
    for x in [1e-8, 1e-3, 0.5, 1.0, 25.0, 75.0, 500.0, 1e4]
]


@pytest.mark.parametrize("nu,x", CASES)
def test_log_bessel_matches_mpmath(nu, x):
    ref = float(mpmath.log(mpmath.besseli(nu, x, maxterms=10**6)))
    got = float(log_bessel_iv(nu, x))
    assert got == pytest.approx(ref, rel=1e-10, abs=1e-10)


@pytest.mark.slow
def test_log_bessel_p13700_at_1e5_matches_mpmath():
    ref = float(mpmath.log(mpmath.besseli(6849, 1e5, maxterms=10**7)))
    assert float(log_bessel_iv(6849, 1e5)) == pytest.approx(ref, rel=1e-12)


def test_log_bessel_matches_scipy_where_finite():
    nu = np.array([0.0, 2.0, 20.0, 60.0, 120.0, 300.0])[:, None]
    x = np.array([0.1, 3.0, 40.0, 200.0, 650.0])[None, :]
    with np.errstate(divide="ignore"):  # scipy's I_nu underflows to 0 there: left out below
        ref = np.log(special.iv(nu, x))
    ok = np.isfinite(ref) & (ref > -700)
    np.testing.assert_allclose(log_bessel_iv(nu, x)[ok], ref[ok], rtol=1e-9, atol=1e-9)


def test_log_bessel_finite_for_paper_sizes():
    x = np.geomspace(1e-3, 1e5, 50)
    vals = log_bessel_iv(6849.0, x)
    assert np.all(np.isfinite(vals))
    assert np.all(np.diff(vals) > 0)


def test_log_bessel_at_zero_and_errors():
    assert float(log_bessel_iv(0, 0)) == 0.0
    assert float(log_bessel_iv(3, 0)) == -np.inf
    with pytest.raises(ValueError, match="nu"):
        log_bessel_iv(-1, 1.0)
    with pytest.raises(ValueError, match="x"):
        log_bessel_iv(1, -1.0)


def test_ratio_matches_mpmath():
    for nu, x in [(6849.0, 75.0), (0.5, 2.0), (100.0, 1e4)]:
        ref = float(mpmath.besseli(nu + 1, x) / mpmath.besseli(nu, x))
        assert float(bessel_iv_ratio(nu, x)) == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("nu, x", [(49.0, 2e9), (0.0, 5e9), (10.5, 1.5e9), (0.5, 1.1e9)])
def test_log_bessel_past_scipys_range_matches_mpmath(nu, x):
    """scipy's ive returns NaN past x = 2^30; the power series meant for tiny x
    gave log I_49(2e9) = 2875 instead of ≈ 2e9 (and a negative vMF RDP)."""
    ref = float(mpmath.log(mpmath.besseli(nu, x)))
    assert float(log_bessel_iv(nu, x)) == pytest.approx(ref, rel=1e-14)


def test_vmf_rdp_stays_non_negative_and_non_decreasing_past_scipys_range():
    from defenses.accounting import vmf_epsilon, vmf_rdp

    tau = vmf_rdp(1e5, 100, [2.0, 100.0, 5611.19])
    assert np.all(tau >= 0) and np.all(np.diff(tau) >= 0)
    # κ = 1e5 in 100 dimensions is almost no noise: ε is huge, not ≈ 0.
    assert vmf_epsilon(1e5, 100, 1.0, 1e-5, steps=10).epsilon > 1e6
