"""Tan et al. (000) Thm 3 terms from their definition, the jitter, and Thm 4 (1) with S ≠ 1.

The references solve the linear systems of Thm 3 one coordinate at a time with
``numpy.linalg.solve`` (no Cholesky trick), and write Thm 4's B·S²/σ out by hand.
"""

import numpy as np
import pytest

from defenses.bounds import (
    dp_capacity_from_noise,
    personalized_channel_bound,
    personalized_channel_terms,
)


def _thm3_terms(cov, beta):
    """Tan et al. (000) Thm 3 / App. B.4, by definition, 0-based i:

    u_i = c_ii − ρ_iᵀ Σ_{<i}⁻¹ ρ_i,  k_i = β_i + w_iᵀ diag(β_{<i}) w_i,  w_i = Σ_{<i}⁻¹ ρ_i,
    with Σ_{<i} = cov[:i, :i] and ρ_i = cov[:i, i].
    """
    d = cov.shape[0]
    u, k = np.empty(d), np.empty(d)
    for i in range(d):
        if i == 0:
            u[i], k[i] = cov[0, 0], beta[0]
            continue
        rho = cov[:i, i]
        w = np.linalg.solve(cov[:i, :i], rho)
        u[i] = cov[i, i] - rho @ w
        k[i] = beta[i] + np.sum(w * w * beta[:i])
    return np.diag(cov).copy(), u, k


def _correlated(d, seed):
    """A strongly correlated PD covariance (conditional variances ≪ variances)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, 2))
    return a @ a.T + 0.05 * np.eye(d) + 0.02 * np.diag(rng.uniform(size=d))


def _bound(sigma, diag, u, k, beta):
    """U(σ) = ½(min[Σ ln(c_ii + σβ_i), Σ ln(u_i + σk_i)] − Σ ln(σβ_i)) (000 after Thm 3)."""
    a = np.sum(np.log(diag + sigma * beta))
    c = np.sum(np.log(u + sigma * k))
    return 0.5 * (min(a, c) - np.sum(np.log(sigma * beta))), c < a


def test_personalized_terms_are_thm_3s_schur_complements_and_regressions():
    """u_i and k_i of Thm 3 for a full covariance, and the bound they give.

    Kills the mutations of ``_personalized.personalized_channel_terms`` that
    divide the Cholesky factor by its diagonal along the wrong axis
    (``chol / dvec[:, None]``: every k_i with i ≥ 1 wrong) or keep
    ``dvec`` instead of ``dvec**2`` as u (the Schur complements). Reference:
    Thm 3's definitions solved per coordinate with ``numpy.linalg.solve``; the
    bound is checked at σ where the (u, k) sum is the smaller one, so a wrong
    k changes the capacity a user sees.
    """
    d = 6
    cov = _correlated(d, 7)
    beta = np.random.default_rng(8).uniform(0.5, 3.0, size=d)
    diag, u, k = _thm3_terms(cov, beta)
    terms = personalized_channel_terms(cov, beta)
    np.testing.assert_allclose(terms.diag, diag, rtol=1e-12)
    np.testing.assert_allclose(terms.u, u, rtol=1e-9)
    np.testing.assert_allclose(terms.k, k, rtol=1e-9)
    np.testing.assert_array_equal(terms.beta, beta)
    for sigma in [1e-3, 0.1]:
        ref, second_is_smaller = _bound(sigma, diag, u, k, beta)
        assert second_is_smaller
        assert personalized_channel_bound(sigma, terms) == pytest.approx(ref, rel=1e-10)


def test_jitter_is_added_to_a_full_covariances_diagonal():
    """``jitter`` regularises a full covariance: the terms are those of Σ + jitter·I.

    Kills the mutation that drops ``+ jitter * np.eye(d)`` for matrices (the
    jitter then only worked for a vector of variances; a singular covariance
    raised although jitter was given, and a PD one ignored it). Reference:
    Thm 3's terms of Σ + jitter·I, by definition.
    """
    d, jitter = 5, 0.3
    cov = _correlated(d, 3)
    beta = np.linspace(1.0, 2.0, d)
    diag, u, k = _thm3_terms(cov + jitter * np.eye(d), beta)
    terms = personalized_channel_terms(cov, beta, jitter=jitter)
    np.testing.assert_allclose(terms.diag, diag, rtol=1e-12)
    np.testing.assert_allclose(terms.u, u, rtol=1e-9)
    np.testing.assert_allclose(terms.k, k, rtol=1e-9)
    # A singular covariance (rank 1) is usable with jitter, as the error message says.
    v = np.arange(1.0, d + 1.0)
    singular = np.outer(v, v)
    with pytest.raises(ValueError, match="jitter"):
        personalized_channel_terms(singular, beta)
    diag, u, k = _thm3_terms(singular + jitter * np.eye(d), beta)
    terms = personalized_channel_terms(singular, beta, jitter=jitter)
    np.testing.assert_allclose(terms.u, u, rtol=1e-8)
    np.testing.assert_allclose(terms.k, k, rtol=1e-8)


@pytest.mark.parametrize("b,s,v", [(32, 2.5, 3.0), (7, 0.1, 0.02), (64, 1.0, 0.64)])
def test_dp_capacity_from_noise_is_b_s_squared_over_sigma(b, s, v):
    """Tan et al. (000) Thm 4 (1), App. B.5 Eq. (34): C_DP ≤ B·S²/σ.

    Kills the mutation ``b * s * s / v`` → ``b * s / v`` (S instead of S²),
    which the paper's numbers (all at S = 1) cannot see. Reference: the
    formula by hand, and its scale invariance: clipping at c·S with noise
    variance c²·σ is the same channel.
    """
    assert dp_capacity_from_noise(b, s, v) == pytest.approx(b * s**2 / v, rel=1e-14)
    assert dp_capacity_from_noise(b, 3.0 * s, 9.0 * v) == pytest.approx(
        dp_capacity_from_noise(b, s, v), rel=1e-14)
