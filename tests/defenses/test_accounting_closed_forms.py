"""Accounting building blocks against their papers' closed forms, written out in plain math.

Every reference value here is computed term by term from the theorem as printed
in the paper (Zhu & Wang 2019 Thm 6; Kairouz, Oh, Viswanath 2017 Thm 3.5;
the convexity of the RDP cumulant, Wang, Balle, Kasiviswanathan 2019 Cor 10)
with ``math``/``numpy`` only — never through the code under test.
"""

import math

import numpy as np
import pytest

from defenses.accounting import interpolate_rdp, kairouz_composition, poisson_subsampled_rdp


def _gauss_rdp(alpha, sigma):
    """RDP of the (unsampled) Gaussian mechanism at multiplier σ: α / (2σ²) (Mironov 2017)."""
    return alpha / (2.0 * sigma**2)


# ---------------------------------------------------------------- Zhu & Wang 2019


def _zhu_wang_bound(tau, alpha, q):
    """Zhu & Wang (ICML 2019) Thm 6, general upper bound, integer α ≥ 2, summed term by term:

    1/(α-1) · log{ (1-q)^(α-1) (αq - q + 1)
                   + C(α,2) q² (1-q)^(α-2) e^{τ(2)}
                   + 3 Σ_{l=3..α} C(α,l) (1-q)^(α-l) q^l e^{(l-1) τ(l)} }.
    """
    total = (1 - q) ** (alpha - 1) * (alpha * q - q + 1)
    total += math.comb(alpha, 2) * q**2 * (1 - q) ** (alpha - 2) * math.exp(tau(2))
    for l in range(3, alpha + 1):
        total += 3 * math.comb(alpha, l) * (1 - q) ** (alpha - l) * q**l * math.exp((l - 1) * tau(l))
    return math.log(total) / (alpha - 1)


@pytest.mark.parametrize("q,sigma", [(0.01, 1.1), (0.1, 2.0), (0.3, 4.0), (0.5, 1.5)])
def test_poisson_subsampled_rdp_is_zhu_wang_theorem_6(q, sigma):
    """Against :func:`_zhu_wang_bound` (the paper's sum written out) for a Gaussian base
    mechanism τ(l) = l/(2σ²), at α = 2..6 (α ≥ 3 is where the factor 3 enters)."""
    tau = lambda l: _gauss_rdp(l, sigma)
    alphas = range(2, 7)
    got = poisson_subsampled_rdp([tau(a) for a in alphas], q)
    want = [_zhu_wang_bound(tau, a, q) for a in alphas]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)


@pytest.mark.parametrize("q,sigma", [(0.01, 1.1), (0.1, 2.0), (0.5, 1.5)])
def test_poisson_subsampled_rdp_upper_bounds_the_exact_sampled_gaussian(q, sigma):
    """An upper bound must not undercut the exact RDP of the Sampled Gaussian Mechanism
    (Mironov, Talwar, Zhang 2019, integer α: log Σ_k C(α,k)(1-q)^(α-k) q^k e^{(k²-k)/(2σ²)}
    / (α-1))."""
    alphas = range(2, 9)
    got = poisson_subsampled_rdp([_gauss_rdp(a, sigma) for a in alphas], q)
    for a, g in zip(alphas, got):
        exact = math.log(sum(math.comb(a, k) * (1 - q) ** (a - k) * q**k
                             * math.exp((k * k - k) / (2 * sigma**2)) for k in range(a + 1))) / (a - 1)
        assert g >= exact * (1 - 1e-12)


# ---------------------------------------------------------------- Kairouz et al. 2017


def _kairouz_reference(eps, delta, k, dslack):
    """Kairouz, Oh, Viswanath (IEEE T-IT 2017) Thm 3.5, with (e^ε-1)/(e^ε+1) written as such:

    ε~ = min{ kε, kε(e^ε-1)/(e^ε+1) + ε√(2k log(e + √(kε²)/δ~)),
              kε(e^ε-1)/(e^ε+1) + ε√(2k log(1/δ~)) },   δ_total = 1 - (1-δ)^k (1-δ~).
    """
    ratio = (math.exp(eps) - 1.0) / (math.exp(eps) + 1.0)
    first = k * eps * ratio
    eps_total = min(k * eps,
                    first + eps * math.sqrt(2 * k * math.log(math.e + math.sqrt(k * eps * eps) / dslack)),
                    first + eps * math.sqrt(2 * k * math.log(1.0 / dslack)))
    return eps_total, 1.0 - (1.0 - delta) ** k * (1.0 - dslack)


@pytest.mark.parametrize("eps,k,dslack", [(0.1, 100, 1e-5), (0.5, 50, 1e-6), (0.05, 1000, 1e-3),
                                          (1.0, 200, 1e-5), (0.2, 30, 0.1)])
def test_kairouz_composition_epsilon_is_theorem_3_5(eps, k, dslack):
    """ε~ against :func:`_kairouz_reference`; the cases are chosen so that a sublinear
    candidate (not kε) is the minimum, i.e. the (e^ε-1)/(e^ε+1) drift term matters."""
    want_eps, _ = _kairouz_reference(eps, 0.0, k, dslack)
    assert want_eps < k * eps  # the advanced-composition branch is the active one
    got_eps, _ = kairouz_composition(eps, 0.0, k, dslack)
    assert got_eps == pytest.approx(want_eps, rel=1e-12)


@pytest.mark.parametrize("delta,k,dslack", [(1e-3, 10, 1e-5), (1e-4, 300, 1e-6), (0.02, 5, 0.0)])
def test_kairouz_composition_delta_compounds_over_k_mechanisms(delta, k, dslack):
    """δ_total = 1 - (1-δ)^k (1-δ~) (Thm 3.5), not 1 - (1-δ)(1-δ~)."""
    want_delta = 1.0 - (1.0 - delta) ** k * (1.0 - dslack)
    _, got_delta = kairouz_composition(0.3, delta, k, dslack)
    assert got_delta == pytest.approx(want_delta, rel=1e-12)
    assert got_delta > delta + dslack  # k > 1 mechanisms each failing w.p. δ


# ---------------------------------------------------------------- Hölder interpolation


@pytest.mark.parametrize("sigma", [0.8, 1.1, 3.0])
def test_holder_interpolation_is_linear_in_the_cumulant(sigma):
    """K(α) = (α-1)τ_α is convex (Wang, Balle, Kasiviswanathan 2019, Cor 10), so linear
    interpolation of K between ⌊α⌋ and ⌈α⌉ bounds τ_α: written out here in numpy, and for
    the Gaussian (τ_α = α/(2σ²), K(α) = α(α-1)/(2σ²) exactly) the bound is ≥ the exact τ_α,
    equal at the integers, and its excess is t(1-t)/(2σ²(α-1)) (the chord of a parabola)."""
    ints = np.arange(2, 9)
    tau_int = _gauss_rdp(ints.astype(float), sigma)
    orders = np.array([1.5, 2.0, 2.5, 3.3, 4.75, 6.0, 7.9])
    got = interpolate_rdp(tau_int, orders, method="holder")

    tau = {int(a): float(v) for a, v in zip(ints, tau_int)}
    tau[1] = 0.0  # K(1) = 0
    want = []
    for alpha in orders:
        lo = math.floor(alpha)
        t = alpha - lo
        if t == 0:
            want.append(tau[lo])
            continue
        k_lo, k_hi = (lo - 1) * tau[lo], lo * tau[lo + 1]
        want.append(((1 - t) * k_lo + t * k_hi) / (alpha - 1))
    np.testing.assert_allclose(got, want, rtol=1e-12)

    exact = _gauss_rdp(orders, sigma)
    t = orders - np.floor(orders)
    assert np.all(got >= exact * (1 - 1e-12))
    np.testing.assert_allclose(got - exact, t * (1 - t) / (2 * sigma**2 * (orders - 1)),
                               rtol=1e-9, atol=1e-15)
