"""partition.dirichlet's shares follow the Dir(α) law its docstring states."""

import numpy as np
import pytest

from fedsim import partition


def _dirichlet_share_variance(num_clients: int, alpha: float) -> float:
    """Var of one coordinate of Dir(α·1_N): (1/N)(1 − 1/N)/(N·α + 1)."""
    m = 1.0 / num_clients
    return m * (1 - m) / (num_clients * alpha + 1)


@pytest.mark.parametrize("alpha,seed", [(0.5, 0), (0.5, 1), (2.0, 2)])
def test_class_shares_have_the_dirichlet_variance(alpha, seed):
    # Compared to: the variance of a Dir(α, …, α) coordinate over N clients,
    # (1/N)(1 − 1/N)/(Nα + 1). The docstring says each class is divided over
    # the clients by Dir(α) shares, so the fraction of class c held by client
    # k, over many classes, has that variance (the cut's rounding at 600
    # examples a class adds < 1e-6). Sizes are picked so the same statistic
    # for 2α is far outside the tolerance (ratio 1.8 for α = 0.5).
    classes, per_class, clients = 300, 600, 10
    labels = np.repeat(np.arange(classes), per_class)
    np.random.default_rng(seed + 100).shuffle(labels)
    parts = partition.dirichlet(labels, clients, alpha, seed)
    # Every example dealt exactly once.
    together = np.sort(np.concatenate(parts))
    np.testing.assert_array_equal(together, np.arange(labels.size))
    counts = np.stack([np.bincount(labels[p], minlength=classes) for p in parts])  # [N, C]
    np.testing.assert_array_equal(counts.sum(0), per_class)
    shares = counts / per_class
    observed = float(np.mean((shares - 1.0 / clients) ** 2))
    want = _dirichlet_share_variance(clients, alpha)
    doubled = _dirichlet_share_variance(clients, 2 * alpha)
    assert abs(np.log(observed / want)) < 0.15, (observed, want, doubled)
    assert abs(observed - want) < 0.25 * abs(observed - doubled), (observed, want, doubled)
