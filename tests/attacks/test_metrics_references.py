"""Checks of attacks/metrics.py, each against a numpy reference."""

import numpy as np
import pytest

from attacks import metrics as M


def test_score_batch_clips_the_reconstruction_before_scoring():
    """Kills E2 (metrics.py ``score_batch``: the clip of ``x_rec`` to [0, 1] dropped).

    Reference: the ``score_batch`` docstring ("The reconstructions are clipped
    to [0, 1] first"), then MSE = mean (x − x̂)², PSNR = 10·log10(1/MSE) (module
    docstring), in numpy. A reconstruction that overshoots the box (an
    unconstrained attack) is scored as its clipped image: here the overshoot
    is entirely clipped away on the first image, and half of it on the second.
    """
    rng = np.random.default_rng(0)
    x_true = rng.uniform(0.2, 0.8, (2, 6, 6, 1)).astype(np.float32)
    x_rec = x_true.copy()
    x_rec[0] = np.where(x_true[0] > 0.5, 1.7, -0.6)   # clipped: 1 or 0
    x_rec[1] = x_true[1] + 0.1
    x_rec[1, :3] = 2.0                                   # clipped to 1
    clipped = np.clip(x_rec.astype(np.float64), 0, 1)
    mse = np.mean((clipped - x_true) ** 2, axis=(1, 2, 3))
    s = M.score_batch(x_rec, x_true)
    assert s.mse == pytest.approx(np.mean(mse), rel=1e-5)
    assert s.psnr == pytest.approx(np.mean(10 * np.log10(1 / mse)), rel=1e-5)


def test_matching_minimises_the_total_mse_not_the_total_absolute_error():
    """Kills E3 (metrics.py ``match_reconstructions``: cost (x − x̂)² → |x − x̂|).

    Reference: the module docstring ("Hungarian assignment on MSE"), by brute
    force over both permutations in numpy. On this pair the MSE-optimal
    matching is the identity (total MSE 0.729 vs 0.771) while the
    absolute-error-optimal one is the swap (1.083 vs 0.917), so a matching on
    another cost scores the batch on the wrong pairs.
    """
    x_true = np.array([[0.0, 0.75, 0.0], [0.5, 1.0, 1.0]], np.float32).reshape(2, 1, 3, 1)
    x_rec = np.array([[0.25, 0.0, 0.5], [1.0, 0.75, 0.0]], np.float32).reshape(2, 1, 3, 1)
    tot = lambda f, perm: sum(float(np.mean(f(x_rec[perm[i]] - x_true[i]))) for i in range(2))
    perms = [(0, 1), (1, 0)]
    best_mse = min(perms, key=lambda p: tot(np.square, p))
    best_abs = min(perms, key=lambda p: tot(np.abs, p))
    assert best_mse != best_abs  # the instance separates the two costs
    np.testing.assert_array_equal(M.match_reconstructions(x_rec, x_true), best_mse)
    want = np.mean([np.mean((x_rec[best_mse[i]] - x_true[i]) ** 2) for i in range(2)])
    assert M.score_batch(x_rec, x_true).mse == pytest.approx(want, rel=1e-6)


def _ami_reference(u, v):
    """AMI with the arithmetic mean (Vinh, Epps & Bailey 2010, Eq. of AMI_sum),
    written in numpy/scipy from the definitions: I and H on the contingency table,
    E[I] under the hypergeometric model of random pairings of the same marginals."""
    from scipy.special import gammaln
    u, v = np.unique(u, return_inverse=True)[1], np.unique(v, return_inverse=True)[1]
    n = u.size
    table = np.zeros((u.max() + 1, v.max() + 1))
    np.add.at(table, (u, v), 1.0)
    a, b = table.sum(1), table.sum(0)
    nz = table > 0
    mi = np.sum(table[nz] / n * np.log(n * table[nz] / np.outer(a, b)[nz]))
    h = lambda c: -np.sum(c / n * np.log(c / n))
    emi = 0.0
    for ai in a:
        for bj in b:
            for nij in range(int(max(1, ai + bj - n)), int(min(ai, bj)) + 1):
                logp = (gammaln(ai + 1) + gammaln(bj + 1) + gammaln(n - ai + 1) + gammaln(n - bj + 1)
                        - gammaln(n + 1) - gammaln(nij + 1) - gammaln(ai - nij + 1)
                        - gammaln(bj - nij + 1) - gammaln(n - ai - bj + nij + 1))
                emi += nij / n * np.log(n * nij / (ai * bj)) * np.exp(logp)
    return (mi - emi) / (0.5 * (h(a) + h(b)) - emi)


def test_ami_is_the_arithmetic_mean_adjusted_mutual_information():
    """Kills E4 (metrics.py ``ami``: ``average_method="arithmetic"`` → ``"geometric"``).

    Reference: :func:`_ami_reference`, the module docstring's
    (I − E[I]) / (mean(H(U), H(V)) − E[I]) written out in numpy on the same
    equal-width levels. The two images' level histograms have different
    entropies (y is x squashed into fewer levels plus noise), so the
    arithmetic and geometric means of H(U), H(V) differ.
    """
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (1, 6, 6, 1)).astype(np.float32)
    y = np.clip(0.5 * x + 0.2 + rng.normal(0, 0.1, x.shape), 0, 1).astype(np.float32)
    bins = 4
    u = np.minimum((x.ravel() * bins).astype(int), bins - 1)
    v = np.minimum((y.ravel() * bins).astype(int), bins - 1)
    hu = -sum(c / u.size * np.log(c / u.size) for c in np.bincount(u) if c)
    hv = -sum(c / v.size * np.log(c / v.size) for c in np.bincount(v) if c)
    assert abs(hu - hv) > 0.2
    assert M.ami(x, y, bins=bins) == pytest.approx(_ami_reference(u, v), rel=1e-6, abs=1e-9)
