"""001's approach 2, the RDP→(ε, δ) conversion and log I_ν at tiny x, against hand-written references.

The references are written out from the papers with numpy/scipy/mpmath only:

* VMF RDP (001 §III-A, Prop 1): τ_α = [−ν log(2α−1) + log I_ν((2α−1)κ) − log I_ν(κ)] / (α−1),
  ν = p/2 − 1, from ``scipy.special.ive`` (or mpmath's ``besseli``), not ``defenses``' Bessel code.
* Zhu & Wang (ICML 2019) Thm 6 (001 Thm 3), summed term by term in log space.
* Hölder interpolation of the cumulant K(α) = (α−1)τ_α, linear between integers
  (Wang, Balle, Kasiviswanathan 2019, Cor 10).
* Canonne, Kamath, Steinke (2020) Prop 12 (001 Prop 4):
  ε = τ_α + log(1 − 1/α) − (log δ + log α)/(α − 1), at least 0.
"""

import math

import mpmath
import numpy as np
import pytest
from scipy import special

from defenses.accounting import log_bessel_iv, rdp_to_epsilon, vmf_epsilon, vmf_rdp
from defenses.accounting._approaches import approach_two


def _vmf_tau(kappa, p, alpha):
    """001 Prop 1 through scipy's exponentially scaled I_ν (fine for ν < 50, x ≤ 10³)."""
    nu, m = p / 2.0 - 1.0, 2.0 * alpha - 1.0
    log_ratio = (math.log(special.ive(nu, m * kappa)) + m * kappa
                 - math.log(special.ive(nu, kappa)) - kappa)
    return (-nu * math.log(m) + log_ratio) / (alpha - 1.0)


def _zhu_wang(taus, alpha, q):
    """Zhu & Wang 2019 Thm 6 at integer α ≥ 2, log-sum-exp of the printed terms."""
    logs = [(alpha - 1) * math.log1p(-q) + math.log(alpha * q - q + 1),
            math.log(math.comb(alpha, 2)) + 2 * math.log(q) + (alpha - 2) * math.log1p(-q)
            + taus[2]]
    for l in range(3, alpha + 1):
        logs.append(math.log(3.0) + math.log(math.comb(alpha, l)) + l * math.log(q)
                    + (alpha - l) * math.log1p(-q) + (l - 1) * taus[l])
    return float(special.logsumexp(logs)) / (alpha - 1)


def _canonne(alpha, rdp, delta):
    return rdp + math.log1p(-1.0 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1.0)


def _approach_two_reference(kappa, p, q, n, delta, max_order, fractional):
    """min over orders of Prop 4(n · τ^s_α); fractional orders a + k/10 by Hölder."""
    taus = {a: _vmf_tau(kappa, p, a) for a in range(2, max_order + 1)}
    sub = {a: _zhu_wang(taus, a, q) for a in range(2, max_order + 1)}
    best = min(_canonne(a, n * sub[a], delta) for a in sub)
    if fractional:
        for a in range(2, max_order):
            for k in range(1, 10):
                t, alpha = k / 10.0, a + k / 10.0
                cumulant = (1 - t) * (a - 1) * sub[a] + t * a * sub[a + 1]
                best = min(best, _canonne(alpha, n * cumulant / (alpha - 1.0), delta))
    return max(0.0, best)


# κ, p, q, N, δ where fractional orders lower approach 2's ε (3.7427 vs 3.7512),
# and where 001's printed interpolation lowers it further than Hölder's.
CASE = dict(kappa=1.0, p=20, q=0.5, n=10, delta=0.01)
MAX_ORDER = 40


def test_vmf_epsilon_approach_two_uses_integer_orders_by_default():
    """``vmf_epsilon``'s approach-2 candidate is 001 §III-A-2 at integer orders only.

    Kills the mutation of ``_vmf_accountant.vmf_epsilon`` that always passes
    ``fractional_orders=True`` (the documented default is integer orders, which
    reproduce 001 Table I): the candidate would be 3.7427 instead of 3.7512.
    Reference: Zhu & Wang Thm 6 on Prop 1's τ, composed N times, Canonne Prop 12.
    """
    c = CASE
    ref_int = _approach_two_reference(c["kappa"], c["p"], c["q"], c["n"], c["delta"],
                                      MAX_ORDER, fractional=False)
    ref_frac = _approach_two_reference(c["kappa"], c["p"], c["q"], c["n"], c["delta"],
                                       MAX_ORDER, fractional=True)
    assert ref_frac < ref_int * (1 - 1e-3)  # the case tells the two apart
    got = vmf_epsilon(c["kappa"], c["p"], c["q"], c["delta"], steps=c["n"],
                      max_order=MAX_ORDER, delta_split=0.5)
    assert got.candidates["approach_2"] == pytest.approx(ref_int, rel=1e-9)
    on = vmf_epsilon(c["kappa"], c["p"], c["q"], c["delta"], steps=c["n"],
                     max_order=MAX_ORDER, delta_split=0.5, fractional_orders=True)
    assert on.candidates["approach_2"] == pytest.approx(ref_frac, rel=1e-9)


def test_approach_two_interpolates_fractional_orders_by_holder_by_default():
    """Fractional orders take the Hölder bound unless 001's formula is asked for.

    Kills the mutation of ``_approaches.approach_two``'s default
    ``interpolation="holder"`` → ``"paper"``: 001's printed interpolation
    undershoots the valid bound, so ε would come out lower than Hölder allows.
    Reference: Hölder (linear cumulant) interpolation of hand-computed
    Zhu–Wang values, Canonne Prop 12.
    """
    c = CASE
    ref = _approach_two_reference(c["kappa"], c["p"], c["q"], c["n"], c["delta"],
                                  MAX_ORDER, fractional=True)
    rdp = lambda a: vmf_rdp(c["kappa"], c["p"], a)
    eps, _ = approach_two(rdp, c["q"], c["n"], c["delta"], max_order=MAX_ORDER,
                          fractional_orders=True)
    assert eps == pytest.approx(ref, rel=1e-9)
    paper, _ = approach_two(rdp, c["q"], c["n"], c["delta"], max_order=MAX_ORDER,
                            fractional_orders=True, interpolation="paper")
    assert paper < eps * (1 - 1e-4)


def test_rdp_to_epsilon_is_never_negative():
    """ε of an (ε, δ) guarantee is ≥ 0: Prop 4's formula dips below 0 at large δ.

    Kills the mutation of ``_rdp_conversion.rdp_to_epsilon`` that drops the
    ``max(0.0, ...)``. At δ = 0.5 and τ ≡ 0 (a mechanism whose output does not
    depend on its input, e.g. VMF at κ = 0) Canonne Prop 12 gives
    log(511/512) − (log 0.5 + log 512)/511 ≈ −0.0128 at α = 512; the guarantee
    is ε = 0, and ``vmf_epsilon`` at κ = 0 must say so too.
    """
    orders = np.array([2.0, 64.0, 512.0])
    raw = min(_canonne(a, 0.0, 0.5) for a in orders)
    assert raw < -0.01
    eps, _ = rdp_to_epsilon(orders, np.zeros(3), 0.5)
    assert eps == 0.0
    res = vmf_epsilon(0.0, 10, 0.5, 0.5, steps=3, max_order=512, delta_split=0.5)
    assert res.candidates["approach_2"] == 0.0 and res.epsilon >= 0.0


@pytest.mark.parametrize("nu,x", [(49.0, 4e-5), (45.5, 1e-5), (40.0, 1e-8)])
def test_log_bessel_where_scipy_underflows_matches_mpmath(nu, x):
    """The power-series branch (DLMF 10.25.2, x small enough that ive < 1e-290).

    Kills the mutation of ``_bessel._series_log_iv`` that writes the k-th term's
    power of x/2 as k + ν instead of 2k + ν: its k = 1 term is (x/2)/(ν+1) of
    the first instead of (x/2)²/(ν+1), a 5·10⁻⁷ error in log I_49(4·10⁻⁵).
    Reference: mpmath ``besseli`` at 40 digits.
    """
    with mpmath.workdps(40):
        ref = float(mpmath.log(mpmath.besseli(mpmath.mpf(nu), mpmath.mpf(x))))
    assert float(log_bessel_iv(nu, x)) == pytest.approx(ref, rel=1e-14, abs=1e-11)


def test_vmf_rdp_at_tiny_kappa_matches_mpmath():
    """001 Prop 1 at κ = 10⁻⁵, p = 100, where both Bessel values come from the series.

    τ_α is then ≈ ((2α−1)² − 1)κ² / (4(ν+1)(α−1)) ≈ 4·10⁻¹²; the series
    mutation above (k + ν for 2k + ν) makes it ≈ κ/(ν+1) = 2·10⁻⁷, 10⁴× too
    large. The tolerance is absolute, 10⁻¹²: τ is a difference of two log I
    values near −1,000, whose float64 spacing is ~10⁻¹³.
    Reference: Prop 1 with mpmath ``besseli`` at 50 digits.
    """
    kappa, p = 1e-5, 100
    alphas = [2.0, 3.0]
    with mpmath.workdps(50):
        nu, k = mpmath.mpf(p) / 2 - 1, mpmath.mpf(kappa)
        ref = [float((-nu * mpmath.log(2 * a - 1) + mpmath.log(mpmath.besseli(nu, (2 * a - 1) * k))
                      - mpmath.log(mpmath.besseli(nu, k))) / (a - 1)) for a in alphas]
    np.testing.assert_allclose(vmf_rdp(kappa, p, alphas), ref, rtol=0, atol=1e-12)


def test_one_full_batch_vmf_step_with_a_tiny_epsilon_is_prop_4s():
    """One full-batch step (q = 1, FedSGD) is the plain VMF mechanism: ε is Prop 4's.

    At κ = 0.01, p = 100 that ε is ≈ 0.0050, reached by approach 1 at a
    per-step ε₀ below 10⁻². Kills the mutation of ``_approaches.approach_one``
    that starts its ε₀ grid at 10⁻² instead of the documented 10⁻⁴ (ε₀ ∈
    [1e-4, 1e3]): approach 1 then cannot go below 0.01 and ``vmf_epsilon``
    reports approach 2's 0.0094, nearly twice the guarantee. Reference:
    Canonne et al. Prop 12 minimised over a fine grid of α ∈ (1, 10⁴] on
    Prop 1's τ_α from ``scipy.special.ive``.
    """
    kappa, p, delta = 0.01, 100, 1e-5
    alphas = 1.0 + np.geomspace(1e-4, 1e4 - 1.0, 200_001)
    nu, m = p / 2.0 - 1.0, 2.0 * alphas - 1.0
    tau = (-nu * np.log(m) + np.log(special.ive(nu, m * kappa)) + m * kappa
           - math.log(special.ive(nu, kappa)) - kappa) / (alphas - 1.0)
    ref = float(np.min(tau + np.log1p(-1.0 / alphas) - (math.log(delta) + np.log(alphas))
                       / (alphas - 1.0)))
    assert 0.004 < ref < 0.006
    got = vmf_epsilon(kappa, p, 1.0, delta, steps=1)
    assert got.epsilon == pytest.approx(ref, rel=1e-6)
    assert got.approach == "1"
