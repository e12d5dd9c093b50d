"""Closed forms of SynFlow, PriPrune (Eq 8, L_acc's server view) and Soteria's scores.

Each test compares the code with a formula from the paper / docstring,
recomputed by hand in numpy (not with the function under test).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from defenses.pruning import schemes
from defenses.pruning.priprune import (PriPruneConfig, priprune_client_update,
                                       priprune_defense, privacy_loss)
from defenses.soteria import perturb_representation
from defenses.soteria._scores import num_pruned_features
from fedsim.client import LocalTraining
from fedsim.typing import CohortData


def _two_layer_linear():
    """x [1, 3] -> x W1 + b1 -> (.) W2: a 2-layer linear net (the bias is not prunable)."""
    rng = np.random.default_rng(7)
    params = {"W1": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
              "b1": jnp.asarray(rng.normal(size=(4,)), jnp.float32),
              "W2": jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)}

    def apply_fn(p, x):
        return (x.reshape(x.shape[0], -1) @ p["W1"] + p["b1"]) @ p["W2"]

    return params, apply_fn


def test_synflow_one_iteration_prunes_the_lowest_synaptic_flow_scores():
    # Independent computation (Tanaka et al. 2020, Alg 1): R = 1ᵀ|W2ᵀ||W1ᵀ|1 (all-ones
    # input, biases zeroed), i.e. R = Σ_{i,j,k} |W1_ij| |W2_jk|, and score = |θ ⊙ ∂R/∂θ|:
    # score(W1_ij) = |W1_ij| Σ_k |W2_jk| and score(W2_jk) = |W2_jk| Σ_i |W1_ij|;
    # one iteration prunes the round(p·d_w) lowest scores globally.
    params, apply_fn = _two_layer_linear()
    a1, a2 = np.abs(np.asarray(params["W1"])), np.abs(np.asarray(params["W2"]))
    s1 = a1 * a2.sum(axis=1)[None, :]
    s2 = a2 * a1.sum(axis=0)[:, None]
    p = 0.5
    flat = np.concatenate([s1.ravel(), s2.ravel()])
    n_prune = int(round(p * flat.size))  # 10 of the 20 weights
    cut = np.sort(flat)[n_prune - 1]
    assert np.sort(flat)[n_prune] > cut  # no tie at the threshold
    mask = schemes.synflow(params, apply_fn, (3,), p, iterations=1)
    np.testing.assert_array_equal(np.asarray(mask["W1"]), (s1 > cut).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(mask["W2"]), (s2 > cut).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(mask["b1"]), np.ones(4, np.float32))


def test_synflow_uses_the_exponential_schedule(monkeypatch):
    # Independent computation (Tanaka et al. 2020, Alg 1): at iteration k of n the
    # cumulative rate is 1 − (1 − p)^(k/n) (so the density shrinks geometrically);
    # recorded from the rate each iteration asks the pruning helper for, and
    # checked against the zeros of the mask it returns.
    params, apply_fn = _two_layer_linear()
    seen = []
    original = schemes.prune_weights

    def recording(scores, prm, rate, *args, **kwargs):
        out = original(scores, prm, rate, *args, **kwargs)
        zeros = int(sum(np.sum(np.asarray(out[k]) == 0) for k in ("W1", "W2")))
        seen.append((rate, zeros))
        return out

    monkeypatch.setattr(schemes, "prune_weights", recording)
    p, n = 0.6, 4
    schemes.synflow(params, apply_fn, (3,), p, iterations=n)
    expected = [1.0 - (1.0 - p) ** (k / n) for k in range(1, n + 1)]
    np.testing.assert_allclose([r for r, _ in seen], expected, rtol=1e-12)
    assert [z for _, z in seen] == [int(round(e * 20)) for e in expected]  # [4, 7, 10, 12]


def test_privacy_loss_is_eq8_with_layer_size_weights():
    # Independent computation: Eq 8 (papers README),
    # L_pri = Σ_l (N_l/N) Σ_{j∈l} (|g_j| / Σ_{j∈l}|g_j|) · (−log α_j), α = σ(θ).
    rng = np.random.default_rng(3)
    theta = {"a": rng.normal(size=(2, 3)), "b": rng.normal(size=(5,))}
    grad = {"a": rng.normal(size=(2, 3)), "b": rng.normal(size=(5,))}
    N = 6 + 5
    ref = 0.0
    for k in ("a", "b"):
        g, t = np.abs(grad[k]), theta[k]
        ref += (t.size / N) * np.sum(g / g.sum() * -np.log(1.0 / (1.0 + np.exp(-t))))
    got = privacy_loss({k: jnp.asarray(v, jnp.float32) for k, v in theta.items()},
                       {k: jnp.asarray(v, jnp.float32) for k, v in grad.items()})
    assert float(got) == pytest.approx(ref, rel=1e-5)


def test_priprune_accuracy_term_sees_zero_at_withheld_weights():
    # Independent computation: with upload="weights" the server's view of a
    # coordinate with "not shared" sample v is w·(1 − v) (module docstring; the
    # fill is 0). For softmax cross-entropy on logits x W with x > 0, label 0 and
    # W > 0: ∂L/∂W[i,0] = x_i(p_0 − 1) < 0 and ∂L/∂W[i,1] = x_i p_1 > 0 at any W,
    # and ∂v/∂θ > 0, so dL(w(1−v))/dθ is > 0 on column 0 and < 0 on column 1.
    # With λ_pri = λ_sha = 0 θ's first Adam step is −lr·sign(that gradient):
    # θ goes to −lr on column 0 (keep sharing) and +lr on column 1 (withhold).
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.uniform(0.5, 1.5, (3, 2)), jnp.float32)}
    apply_fn = lambda p, x: x @ p["w"]
    lr = 0.1
    hp = PriPruneConfig(lambda_acc=1.0, lambda_pri=0.0, lambda_sha=0.0, tau=1.0,
                        alpha_lr=lr, alpha_init=0.5, upload="weights")
    up = priprune_defense(hp)
    settings = LocalTraining(algorithm="fedsgd", local_epochs=1, batch_size=4, n_max=4)
    update = priprune_client_update(hp)(apply_fn, optax.sgd(0.01), settings, {"upload": up})
    data = CohortData(x=jnp.asarray(rng.uniform(0.5, 1.5, (4, 3)), jnp.float32),
                      y=jnp.zeros(4, jnp.int32), mask=jnp.ones(4, jnp.float32),
                      n=jnp.asarray(4, jnp.int32))
    out = update(params, data, {"upload": up.init(params)}, jax.random.key(1))
    theta = np.asarray(out.client_state["upload"]["theta"]["w"])
    np.testing.assert_allclose(theta[:, 0], -lr, rtol=1e-3)
    np.testing.assert_allclose(theta[:, 1], +lr, rtol=1e-3)
    np.testing.assert_array_equal(np.asarray(out.client_state["upload"]["withheld"]["w"]),
                                  np.tile([0.0, 1.0], (3, 1)))


def test_code_score_batch_scope_ignores_a_nonzero_padding_row():
    # Independent computation: the authors' rule (batch scope) sums ‖∇r_i‖/r_i over
    # the REAL examples only and zeroes the round(p·L) smallest sums; here only
    # row 0 is real: ratios [1, 1/2, 1/3] -> feature 2 goes. The padding row
    # (ratios [0.01, 10, 10]) would move it to feature 0 if it counted.
    r = jnp.array([[1.0, 2.0, 3.0], [100.0, 0.1, 0.1]])
    gn = jnp.ones_like(r)
    ratio = np.asarray(gn[0] / r[0])
    expected = np.ones(3, np.float32)
    expected[np.argsort(ratio)[:1]] = 0.0
    _, keep_pad = perturb_representation(r, gn, 1 / 3, score="code", scope="batch",
                                         example_mask=jnp.array([1.0, 0.0]))
    _, keep_real = perturb_representation(r[:1], gn[:1], 1 / 3, score="code", scope="batch")
    np.testing.assert_array_equal(np.asarray(keep_pad)[0], expected)
    np.testing.assert_array_equal(np.asarray(keep_pad), np.asarray(keep_real))


@pytest.mark.parametrize("p_fc, L", [(0.4, 4), (0.6, 3)])
def test_soteria_prunes_the_nearest_integer_count(p_fc, L):
    # Independent computation: ε = round(p_fc·L) (Alg 1; module docstring), here
    # 1.6 -> 2 and 1.8 -> 2, where truncation would give 1.
    expected = math.floor(p_fc * L + 0.5)
    assert expected == 2
    assert num_pruned_features(p_fc, L) == expected
    r = jnp.arange(1.0, L + 1.0)[None, :]
    _, keep = perturb_representation(r, jnp.ones_like(r), p_fc)
    assert int(np.sum(np.asarray(keep) == 0)) == expected
