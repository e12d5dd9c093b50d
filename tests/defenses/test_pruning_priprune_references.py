"""Checks of PriPrune (paper 002, Alg 3, Eq 6–8; papers README).

Each expected value is recomputed by hand in numpy from the equations, never
read off the code under test.
"""

import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from defenses.pruning.priprune import (PriPruneConfig, priprune_client_update,
                                       priprune_defense, privacy_loss, report_defense_rate)
from fedsim.client import LocalTraining
from fedsim.typing import CohortData


def _linear():
    return lambda p, x: x.reshape(x.shape[0], -1) @ p["w"]


def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("alpha_init", [0.1, 0.3, 0.9])
def test_theta_starts_at_the_logit_of_alpha_init(alpha_init):
    """Kills ``theta0 = log(alpha_init)`` (the ``− log1p(−α)`` of the logit dropped).

    Reference (module docstring, Alg 3 line 3): α = σ(θ) starts at ``alpha_init``,
    so θ₀ = ln(α/(1 − α)).
    """
    params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
    st = priprune_defense(PriPruneConfig(alpha_init=alpha_init)).init(params)
    for t in jax.tree_util.tree_leaves(st["theta"]):
        np.testing.assert_allclose(np.asarray(t), math.log(alpha_init / (1 - alpha_init)),
                                   rtol=1e-6)


@pytest.mark.parametrize("scale", [1e-4, 1e-2])
def test_privacy_loss_is_invariant_to_the_gradients_scale(scale):
    """Kills ``share = a / max(Σa, 1.0)`` (Eq 8's normalisation clamped at 1).

    Reference (Eq 8): L_pri = Σ_l (N_l/N) Σ_j (|g_j|/Σ_{j∈l}|g_j|)(−log α_j) depends on
    g only through |g_j|/Σ_{j∈l}|g_j|, so gradients of any scale (here sums
    below 1, as a trained model's) give the same value, recomputed in numpy.
    """
    rng = np.random.default_rng(5)
    theta = {"a": rng.normal(size=(3, 4)), "b": rng.normal(size=(6,))}
    grad = {"a": scale * rng.normal(size=(3, 4)), "b": scale * rng.normal(size=(6,))}
    N = 12 + 6
    ref = sum((theta[k].size / N) * np.sum(np.abs(grad[k]) / np.abs(grad[k]).sum()
                                           * np.log1p(np.exp(-theta[k]))) for k in ("a", "b"))
    got = privacy_loss({k: jnp.asarray(v, jnp.float32) for k, v in theta.items()},
                       {k: jnp.asarray(v, jnp.float32) for k, v in grad.items()})
    assert float(got) == pytest.approx(ref, rel=1e-5)


def test_first_alpha_step_follows_the_eq6_balance_point():
    """Kills ``sha = Σ θ`` (the λ_sha term charged on the logits instead of on α).

    Reference (Eq 6 + Eq 8, module docstring "Balance point"): with λ_acc = 0 and a
    single-leaf model, ∂/∂θ_j [λ_pri L_pri + λ_sha Σα] = (1 − α_j)(λ_sha α_j − λ_pri c_j),
    c_j = |g_j|/Σ|g|. At α = ½ (θ = 0) Adam's first step is −lr·sign of that, so θ_j
    becomes +lr iff c_j > λ_sha/(2 λ_pri), else −lr. g is the FedSGD gradient of the
    mean cross-entropy of a linear model, xᵀ(softmax(xW) − onehot(y))/n, by hand.
    """
    rng = np.random.default_rng(11)
    D, K, n = 6, 4, 8
    W = rng.normal(size=(D, K))
    x = rng.normal(size=(n, D))
    y = rng.integers(0, K, n)
    g = x.T @ (_softmax(x @ W) - np.eye(K)[y]) / n
    c = np.abs(g) / np.abs(g).sum()
    # The threshold λ_sha/(2λ_pri): midway in the widest gap of the sorted c near
    # the middle, so no coordinate sits at it (float32 vs float64 cannot flip one).
    cs = np.sort(c.ravel())
    i = 8 + int(np.argmax(np.diff(cs)[8:16]))
    thr = 0.5 * (cs[i] + cs[i + 1])
    assert np.min(np.abs(c - thr)) > 0.02 * thr
    lam_pri = 1.0
    lam_sha = 2.0 * lam_pri * thr
    # A mutant charging Σθ moves the threshold to 4/N: some coordinates lie between.
    assert np.any((c > thr) & (c < 4 * thr))
    lr = 0.05
    hp = PriPruneConfig(lambda_acc=0.0, lambda_pri=lam_pri, lambda_sha=lam_sha, tau=1.0,
                        alpha_lr=lr, alpha_init=0.5)
    up = priprune_defense(hp)
    settings = LocalTraining(algorithm="fedsgd", local_epochs=1, batch_size=n, n_max=n)
    update = priprune_client_update(hp)(_linear(), optax.sgd(0.01), settings, {"upload": up})
    params = {"w": jnp.asarray(W, jnp.float32)}
    data = CohortData(x=jnp.asarray(x, jnp.float32), y=jnp.asarray(y, jnp.int32),
                      mask=jnp.ones(n, jnp.float32), n=jnp.asarray(n, jnp.int32))
    out = update(params, data, {"upload": up.init(params)}, jax.random.key(0))
    theta = np.asarray(out.client_state["upload"]["theta"]["w"])
    np.testing.assert_allclose(theta, np.where(c > thr, lr, -lr), rtol=1e-3)


def test_reported_loss_averages_the_steps_taken_on_real_data():
    """Kills ``loss = Σ losses / (all scheduled steps)`` (all-padding steps counted).

    Reference: the client's loss is the mean over the local steps it took; here 2
    real examples of n_max = 8 with batch 2 make 4 scheduled steps of which only
    the first holds real data (padding goes last), so the loss is the mean
    cross-entropy of the start model (= the global one: nothing withheld yet) on
    the 2 real examples, by hand: −log softmax(xW)_y.
    """
    rng = np.random.default_rng(2)
    D, K, n_max = 5, 3, 8
    W = rng.normal(size=(D, K))
    x = rng.normal(size=(n_max, D))
    y = rng.integers(0, K, n_max)
    mask = np.array([1.0, 1.0] + [0.0] * 6)
    hp = PriPruneConfig()
    up = priprune_defense(hp)
    settings = LocalTraining(algorithm="fedavg", local_epochs=1, batch_size=2, n_max=n_max)
    update = priprune_client_update(hp)(_linear(), optax.sgd(0.1), settings, {"upload": up})
    params = {"w": jnp.asarray(W, jnp.float32)}
    data = CohortData(x=jnp.asarray(x, jnp.float32), y=jnp.asarray(y, jnp.int32),
                      mask=jnp.asarray(mask, jnp.float32), n=jnp.asarray(2, jnp.int32))
    out = update(params, data, {"upload": up.init(params)}, jax.random.key(3))
    p = _softmax(x[:2] @ W)
    expected = float(np.mean(-np.log(p[np.arange(2), y[:2]])))
    assert float(out.loss) == pytest.approx(expected, rel=1e-5)


def test_reported_defense_rate_is_the_cohort_mean_of_each_clients_fraction():
    """Kills ``jnp.sum(rates)`` in ``report_defense_rate``.

    Reference (Fig 5b): ``priprune_rate`` = mean over the round's cohort of each
    client's withheld fraction p̂_i = #withheld_i / d, computed in numpy from
    the stored masks; clients outside the cohort do not count.
    """
    rng = np.random.default_rng(4)
    withheld = {"w": (rng.uniform(size=(5, 3, 4)) < 0.4).astype(np.float32),
                "b": (rng.uniform(size=(5, 4)) < 0.7).astype(np.float32)}
    cohort = np.array([1, 3, 4])
    sim = types.SimpleNamespace(defenses={"upload": priprune_defense(PriPruneConfig())},
                                round_callbacks=[], cohort=lambda r: cohort)
    report_defense_rate(sim)
    assert len(sim.round_callbacks) == 1
    state = types.SimpleNamespace(client_states={"upload": {
        "withheld": {k: jnp.asarray(v) for k, v in withheld.items()}}})
    row = sim.round_callbacks[0](0, {}, state=state)
    per_client = [(withheld["w"][i].sum() + withheld["b"][i].sum()) / 16 for i in cohort]
    assert row["priprune_rate"] == pytest.approx(float(np.mean(per_client)), rel=1e-6)
