"""Closed forms of the leakage ledger (000 Thm 1, §4) and PriPrune's bound (002 Thm 1 / Cor 1).

Each test compares the code with the formula of its docstring / paper,
recomputed by hand in numpy (not with the function under test).
"""

import math

import numpy as np
import pytest

from defenses.bounds import priprune_leakage_bound
from defenses.channels import LeakageLedger, data_statistics


def test_ledger_mean_leakage_averages_only_clients_that_trained():
    # Independent computation: cumulative steps per client replayed by hand from
    # the cohorts; the mean is over clients with n_c > 0 only (ledger docstring).
    kappa = 2.0
    steps = [3, 4, 5, 6]
    cohorts = {0: [0, 2], 1: [2]}
    ledger = LeakageLedger(kappa, steps, 4, lambda r: np.array(cohorts[r]))
    row0 = ledger(0, {})
    # After round 0: client 0 took 3 steps, client 2 took 5; clients 1 and 3 none.
    assert row0["leakage_steps"] == 5
    assert row0["leakage_total_mean"] == pytest.approx(kappa * (3 + 5) / 2)  # 8, not 4
    row1 = ledger(1, {})
    # After round 1: client 2 has 10 steps, client 0 still 3.
    assert row1["leakage_total"] == pytest.approx(kappa * 10)
    assert row1["leakage_total_mean"] == pytest.approx(kappa * (3 + 10) / 2)


def test_ledger_mse_floor_is_scaled_by_the_share_of_nonconstant_coordinates():
    # Independent computation: Thm 1 (000 Eq 5) on the d' = 3 directions with
    # variance > 0, floor = (d'/d) · e^{2h/d'}/(2πe) · e^{−2I/d'} with
    # h = ½ Σ ln(2πe λ_i), λ from numpy's eigvalsh of the covariance of the
    # non-constant columns only (the constant 4th column adds nothing).
    rng = np.random.default_rng(0)
    mix = np.array([[1.0, 0.3, 0.0], [0.0, 2.0, 0.5], [0.2, 0.0, 0.7]])
    x3 = rng.normal(size=(200, 3)) @ mix
    x = np.concatenate([x3, np.full((200, 1), 0.25)], axis=1)  # a constant "pixel"
    stats = data_statistics(x)
    lam = np.linalg.eigvalsh(np.cov(x3, rowvar=False))
    d, dp = 4, 3
    h = 0.5 * np.sum(np.log(2 * np.pi * np.e * lam))
    kappa = 1.5
    ledger = LeakageLedger(kappa, [2, 2], 2, lambda r: np.array([0]), stats)
    for info in (0.0, 4.0):
        ref = (dp / d) * math.exp(2 * h / dp) / (2 * np.pi * np.e) * math.exp(-2 * info / dp)
        assert ledger.mse_floor(info) == pytest.approx(ref, rel=1e-9)
    row = ledger(0, {})
    info = 2 * kappa
    ref = (dp / d) * math.exp(2 * h / dp) / (2 * np.pi * np.e) * math.exp(-2 * info / dp)
    assert row["mse_lower_bound"] == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("cov", [
    np.diag([2.0, 3.0, 5.0]),
    np.array([[2.0, 0.5, 0.0], [0.5, 1.5, 0.3], [0.0, 0.3, 0.8]]),
])
def test_priprune_bound_matches_corollary_1_with_a_nonidentity_covariance(cov):
    # Independent computation: 002 Cor 1 (Eq 5 / App. Eq 22) in bits,
    # I ≤ T(1 − (p−1)/(2 ln 2) + 2 log2(1/B) + 2Δ + d* log2(2πe)),
    # Δ = log2 |det Σ^{−1/2}|, Σ^{−1/2} built from numpy's eigendecomposition.
    p, B, T = 0.3, 4, 3
    lam, Q = np.linalg.eigh(cov)
    inv_sqrt = Q @ np.diag(lam ** -0.5) @ Q.T
    delta = math.log2(abs(np.linalg.det(inv_sqrt)))
    d_star = cov.shape[0]
    ref = T * (1 - (p - 1) / (2 * math.log(2)) + 2 * math.log2(1 / B) + 2 * delta
               + d_star * math.log2(2 * math.pi * math.e))
    assert priprune_leakage_bound(p, B, cov, rounds=T) == pytest.approx(ref, rel=1e-12)
    # The (logdet, dim) form gives the same number.
    ln_det = float(np.sum(np.log(lam)))
    assert priprune_leakage_bound(p, B, logdet=ln_det, dim=d_star, rounds=T) == \
        pytest.approx(ref, rel=1e-12)
    # A larger covariance (more spread gradients) gives a smaller bound (Δ < 0 grows in size).
    assert priprune_leakage_bound(p, B, 4.0 * cov, rounds=T) < ref
