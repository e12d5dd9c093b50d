"""Bayes capacity (001 Thm 5-6) and channel bounds (000, 002)."""

import numpy as np
import pytest
from scipy import integrate, special

from defenses.bounds import (
    channel_capacity,
    dp_capacity_from_epsilon,
    dp_capacity_from_noise,
    large_batch_channel_capacity,
    log_bayes_capacity_gaussian,
    log_bayes_capacity_vmf,
    mse_lower_bound,
    natural_channel_sigma,
    personalized_channel_bound,
    personalized_channel_sigma,
    personalized_channel_terms,
    priprune_leakage_bound,
    total_leakage_bound,
    white_channel_covariance,
    white_channel_sigmas,
)


def _sphere_area(p):
    return 2 * np.pi ** (p / 2) / special.gamma(p / 2)


@pytest.mark.parametrize("p", [2, 3, 5])
@pytest.mark.parametrize("sigma,radius", [(0.5, 1.0), (1.3, 2.0)])
def test_gaussian_capacity_matches_radial_quadrature(p, sigma, radius):
    # Def. 7: integral over y of sup_x density; sup is at the projection onto the ball.
    dens = lambda r: (2 * np.pi * sigma**2) ** (-p / 2) * np.exp(-max(r - radius, 0) ** 2 / (2 * sigma**2))
    val = integrate.quad(lambda r: _sphere_area(p) * r ** (p - 1) * dens(r), 0, radius)[0]
    val += integrate.quad(lambda r: _sphere_area(p) * r ** (p - 1) * dens(r), radius, np.inf)[0]
    assert np.exp(log_bayes_capacity_gaussian(sigma, radius, p)) == pytest.approx(val, rel=1e-3)


def test_gaussian_capacity_monte_carlo_p2():
    rng = np.random.default_rng(0)
    sigma, radius, half = 0.7, 1.0, 1.0 + 7 * 0.7
    y = rng.uniform(-half, half, size=(400_000, 2))
    # Brute-force sup over a dense set of inputs in the disc (no projection formula).
    t = np.linspace(0, 2 * np.pi, 64, endpoint=False)
    rad = np.linspace(0, radius, 24)
    xs = np.stack([np.outer(rad, np.cos(t)).ravel(), np.outer(rad, np.sin(t)).ravel()], 1)
    norms = np.linalg.norm(y, axis=1)
    d2 = np.maximum(norms - radius, 0) ** 2
    # cross-check the projection claim on a subset against the brute-force sup
    sub = y[:2000]
    brute = np.min(((sub[:, None, :] - xs[None]) ** 2).sum(-1), axis=1)
    assert np.all(brute >= d2[:2000] - 1e-12) and np.max(brute - d2[:2000]) < 0.02
    est = np.mean(np.exp(-d2 / (2 * sigma**2)) / (2 * np.pi * sigma**2)) * (2 * half) ** 2
    assert np.exp(log_bayes_capacity_gaussian(sigma, radius, 2)) == pytest.approx(est, rel=0.02)


@pytest.mark.parametrize("p", [2, 3, 5])
@pytest.mark.parametrize("kappa", [0.5, 4.0, 20.0])
def test_vmf_capacity_matches_quadrature(p, kappa):
    # C = e^kappa A_{p-1} / C_{p,kappa}, normaliser by quadrature (no Bessel).
    if p == 2:
        norm = integrate.quad(lambda th: np.exp(kappa * np.cos(th)), 0, 2 * np.pi)[0]
    else:
        norm = _sphere_area(p - 1) * integrate.quad(
            lambda t: np.exp(kappa * t) * (1 - t * t) ** ((p - 3) / 2), -1, 1)[0]
    ref = np.exp(kappa) * _sphere_area(p) / norm
    assert np.exp(log_bayes_capacity_vmf(kappa, p)) == pytest.approx(ref, rel=1e-3)


@pytest.mark.parametrize("p", [10, 13_700])
@pytest.mark.parametrize("kappa", [75.0, 1e6, 1e12, 1e18, 1e20])
def test_vmf_capacity_matches_mpmath_up_to_large_kappa(p, kappa):
    # Before, kappa − log I(kappa) lost its digits: at p = 10 the capacity was
    # 119.30798 at 1e12 (9e-5 off), 128.0 at 1e18 and 0.0 at 1e20.
    import mpmath
    with mpmath.workdps(50):
        nu, k = mpmath.mpf(p) / 2 - 1, mpmath.mpf(kappa)
        ref = float(mpmath.log(2) - mpmath.loggamma(mpmath.mpf(p) / 2) + nu * mpmath.log(k)
                    + k - mpmath.mpf(p) / 2 * mpmath.log(2)
                    - mpmath.log(mpmath.besseli(nu, k, maxterms=10**6)))
    assert log_bayes_capacity_vmf(kappa, p) == pytest.approx(ref, rel=1e-12)


def test_log_bessel_ive_is_log_bessel_iv_less_x_where_both_keep_their_digits():
    from defenses.accounting._bessel import log_bessel_iv, log_bessel_ive
    nu = np.array([0.0, 0.5, 3.5, 49.0, 50.0, 1000.0, 6849.0])[:, None]
    x = np.array([1e-300, 1e-5, 1.0, 75.0, 1e3, 1e5])[None, :]
    np.testing.assert_allclose(log_bessel_ive(nu, x), log_bessel_iv(nu, x) - x,
                               rtol=1e-12, atol=1e-9)
    assert log_bessel_ive(0.0, 0.0) == 0.0 and log_bessel_ive(2.0, 0.0) == -np.inf
    with pytest.raises(ValueError, match="x must be"):
        log_bessel_ive(1.0, -1.0)


def test_capacities_monotone_and_finite_at_paper_size():
    kap = [log_bayes_capacity_vmf(k, 13_700) for k in [0, 25, 75, 200, 500]]
    assert kap[0] == 0 and np.all(np.diff(kap) > 0) and np.all(np.isfinite(kap))
    gs = [log_bayes_capacity_gaussian(s, 1.0, 13_700) for s in [2.0, 1.23, 0.66, 0.2]]
    assert np.all(np.diff(gs) > 0) and np.all(np.isfinite(gs))
    assert log_bayes_capacity_gaussian(1.0, 0.0, 5) == 0.0


def test_capacity_errors():
    with pytest.raises(ValueError, match="sigma"):
        log_bayes_capacity_gaussian(0.0, 1.0, 3)
    with pytest.raises(ValueError, match="kappa"):
        log_bayes_capacity_vmf(-1.0, 3)
    with pytest.raises(ValueError, match="dim"):
        log_bayes_capacity_vmf(1.0, 1)


def test_natural_and_white_channels():
    lam = np.random.default_rng(1).gamma(0.5, 2.0, size=300)
    for kappa in [0.5, 50.0, 300.0]:
        s = natural_channel_sigma(lam, kappa)
        assert abs(channel_capacity(lam, s) - kappa) <= 1e-6
        w = white_channel_sigmas(lam, kappa)
        assert channel_capacity(lam, w) == pytest.approx(kappa, rel=1e-12)
    with pytest.raises(ValueError, match="kappa"):
        natural_channel_sigma(lam, 0.0)


def test_personalized_channel():
    rng = np.random.default_rng(2)
    a = rng.normal(size=(12, 12))
    cov = a @ a.T / 12 + 0.1 * np.eye(12)
    beta = rng.uniform(1, 50, size=12)
    terms = personalized_channel_terms(cov, beta)
    for s in [0.01, 1.0, 30.0]:
        exact = 0.5 * (np.linalg.slogdet(cov + s * np.diag(beta))[1] - np.sum(np.log(s * beta)))
        assert personalized_channel_bound(s, terms) >= exact - 1e-9
    # Diagonal covariance: bound is exact; inverse hits kappa.
    var = rng.uniform(0.5, 2, size=12)
    s = personalized_channel_sigma(var, beta, 3.0)
    assert 0.5 * np.sum(np.log1p(var / (s * beta))) == pytest.approx(3.0, abs=1e-6)
    s_full = personalized_channel_sigma(cov, beta, 3.0)
    assert personalized_channel_bound(s_full, terms) == pytest.approx(3.0, abs=1e-6)


def test_dp_capacity_thm4_paper_numbers():
    caps = [dp_capacity_from_noise(64, 1.0, m**2) for m in [0.8, 0.57, 0.46, 0.2066]]
    np.testing.assert_allclose(caps, [100, 197, 302, 1499], rtol=3e-3)
    assert dp_capacity_from_epsilon(64, 1.0, 1e-5) == pytest.approx(64 / (2 * np.log(1.25e5)))


def test_other_bounds():
    lam = np.array([4.0, 1.0])
    assert large_batch_channel_capacity(lam, 0.5, 4) == pytest.approx(channel_capacity(lam / 4, 0.5))
    assert total_leakage_bound(300.0, 10) == 3000.0
    m0 = mse_lower_bound(10.0, 0.0, 20)
    assert mse_lower_bound(10.0, 5.0, 20) == pytest.approx(m0 * np.exp(-0.5))
    b1 = priprune_leakage_bound(0.3, 20, np.eye(3))
    assert b1 == pytest.approx(1 + 0.7 / (2 * np.log(2)) + 2 * np.log2(1 / 20) + 3 * np.log2(2 * np.pi * np.e))
    assert priprune_leakage_bound(0.5, 20, np.eye(3)) < b1
    assert priprune_leakage_bound(0.3, 20, np.eye(3), rounds=5) == pytest.approx(5 * b1)
    with pytest.raises(ValueError, match="pruning_rate"):
        priprune_leakage_bound(1.5, 20, np.eye(3))
    # A positive determinant is not positive definiteness: diag(-1, -1) used to
    # give the identity's bound; a non-symmetric or NaN matrix, a NaN log-det too.
    for bad, match in ((-np.eye(2), "positive definite"),
                       (np.array([[1.0, 0.5], [0.0, 1.0]]), "symmetric"),
                       (np.full((2, 2), np.nan), "NaN")):
        with pytest.raises(ValueError, match=match):
            priprune_leakage_bound(0.3, 20, bad)
    with pytest.raises(ValueError, match="logdet must be finite"):
        priprune_leakage_bound(0.3, 20, logdet=float("nan"), dim=3)


@pytest.mark.parametrize("dim", [4, 300])
def test_channel_solvers_at_large_kappa(dim):
    # κ = 1000 needs σ ~ λ e^{-2κ/d}: the solvers work in log space (no overflow
    # of λ/σ, no underflow of σ at the lower bracket).
    rng = np.random.default_rng(3)
    lam = rng.gamma(0.5, 2.0, size=dim)
    for kappa in [350.0, 1000.0]:
        s = natural_channel_sigma(lam, kappa)
        assert s > 0 and abs(channel_capacity(lam, s) - kappa) <= 1e-6
    var = rng.uniform(0.5, 2, size=dim)
    beta = rng.uniform(1, 50, size=dim)
    for kappa in [370.0, 1000.0]:
        s = personalized_channel_sigma(var, beta, kappa)
        assert s > 0
        assert 0.5 * np.sum(np.log1p(var / (s * beta))) == pytest.approx(kappa, abs=1e-6)
    a = rng.normal(size=(dim, dim))
    cov = a @ a.T / dim + 0.1 * np.eye(dim)
    s_full = personalized_channel_sigma(cov, beta, 1000.0)
    terms = personalized_channel_terms(cov, beta)
    assert personalized_channel_bound(s_full, terms) == pytest.approx(1000.0, abs=1e-6)
    exact = 0.5 * (np.linalg.slogdet(cov + s_full * np.diag(beta))[1] - np.sum(np.log(s_full * beta)))
    assert exact <= 1000.0 + 1e-6


@pytest.mark.parametrize("kappa", [400.0, 1e306, 1e308])
def test_a_kappa_whose_noise_underflows_is_refused_by_every_channel(kappa):
    """Past 2κ/d ≈ 709.8 exp overflows: White raised OverflowError (a traceback
    under `fedsim run`) or, at κ = 1e308, returned σ = 0, and Personalized returned
    σ = 0 at κ >= 1e306: channels that add no noise at all."""
    var = np.array([1.0, 0.5, 2.0])
    beta = np.ones(3)
    with pytest.raises(ValueError, match="white_channel_sigmas.*underflows"):
        white_channel_sigmas(var[:1] if kappa == 400.0 else var, kappa)
    with pytest.raises(ValueError, match="natural_channel_sigma.*underflows"):
        natural_channel_sigma(var[:1] if kappa == 400.0 else var, kappa)
    with pytest.raises(ValueError, match="personalized_channel_sigma.*underflows"):
        personalized_channel_sigma(var[:1] if kappa == 400.0 else var,
                                   beta[:1] if kappa == 400.0 else beta, kappa)


def test_white_sigmas_near_the_float_limit_keep_eq_19():
    """σᵢ = λᵢ / (exp(2κ/d) − 1), computed in logs: exact where the quotient is
    representable, e.g. 2κ/d = 700 (expm1 is still finite there)."""
    lam = np.array([3.0, 1.0, 0.0, 0.25])
    kappa = 700.0 * 3 / 2
    expected = np.where(lam > 0, lam / np.expm1(700.0), 0.0)
    np.testing.assert_allclose(white_channel_sigmas(lam, kappa), expected, rtol=1e-12)


def test_white_noise_covariance_of_a_singular_covariance_spends_kappa_where_data_varies():
    # Σ_D of rank 2 in 3 dimensions, its zero eigenvalue as eigh's round-off
    # (1e-16 relative) rather than exactly 0.
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))
    lam = np.array([4.0, 1.0, 4e-16])
    cov = (q * lam) @ q.T
    kappa = 3.0
    noise = white_channel_covariance(cov, kappa)
    psi = np.einsum("ij,jk,ki->i", q.T, noise, q)  # Ψ in Σ_D's eigenbasis
    assert psi[2] == pytest.approx(0.0, abs=1e-12)  # the constant direction: no noise
    # The two directions that vary carry κ between them (κ/2 each), not 2κ/3.
    carried = 0.5 * np.log((lam[:2] + psi[:2]) / psi[:2])
    np.testing.assert_allclose(carried, [kappa / 2, kappa / 2], rtol=1e-9)


def test_a_covariance_matrix_is_refused_where_eigenvalues_are_due():
    # Before, [[2, 1], [1, 2]] passed as four "eigenvalues": capacity 5.44 for 2.92.
    from defenses.bounds import (channel_capacity, gaussian_entropy, natural_channel_sigma,
                                 white_channel_sigmas)
    cov = np.array([[2.0, 1.0], [1.0, 2.0]])
    lam = np.linalg.eigvalsh(cov)
    for call in (lambda e: channel_capacity(e, 0.1), gaussian_entropy,
                 lambda e: natural_channel_sigma(e, 0.5), lambda e: white_channel_sigmas(e, 0.5)):
        with pytest.raises(ValueError, match=r"eigenvalues must be a vector; got an array of "
                                             r"shape \(2, 2\)"):
            call(cov)
        call(lam)
        call(lam[None, :])  # a row of eigenvalues is still a vector
    assert channel_capacity(lam, 0.1) == pytest.approx(0.5 * np.sum(np.log((lam + 0.1) / 0.1)))
