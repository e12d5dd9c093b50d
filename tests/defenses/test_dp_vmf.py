"""VMF sampler (Wood 1994) and the VMF DP-SGD defense (001 Alg 2)."""

import chex
import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest
from scipy import stats

from defenses.dp import dp_parameters, dp_vmf, sample_vmf, sample_vmf_cosine
from tests.defenses.dp_helpers import check_keyed_randomness, context, per_example_tree


def mean_resultant_length(p, kappa):
    """A_p(κ) = I_{p/2}(κ) / I_{p/2−1}(κ), independently with mpmath."""
    return float(mpmath.besseli(p / 2, kappa) / mpmath.besseli(p / 2 - 1, kappa))


@pytest.mark.parametrize("p,kappa", [
    (3, 2.0), (50, 10.0),
    pytest.param(3, 1e4, marks=pytest.mark.slow),
    pytest.param(50, 1e3, marks=pytest.mark.slow),
    pytest.param(13_700, 75.0, marks=pytest.mark.slow),
    pytest.param(13_700, 1e4, marks=pytest.mark.slow),
])
def test_mean_resultant_length_matches_bessel_ratio(p, kappa):
    n = 4000
    x = np.asarray(sample_vmf(jax.random.key(p + int(kappa)), jnp.ones(p), kappa, num=n))
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)  # on the sphere
    mu = np.ones(p) / np.sqrt(p)
    w = x @ mu
    se = w.std() / np.sqrt(n)
    assert abs(w.mean() - mean_resultant_length(p, kappa)) < 4 * se + 1e-6
    # The mean vector points along mu with length A_p(κ): the tangent parts cancel.
    resid = x.mean(0) - w.mean() * mu
    assert np.linalg.norm(resid) < 4 * np.sqrt((1 - (w**2).mean()) / n) + 1e-6


def _cdf_p3(kappa):
    # p = 3: W = μᵀX has density ∝ e^{κw} on [−1, 1] (exact CDF).
    return lambda w: np.expm1(kappa * (w + 1)) / np.expm1(2 * kappa)


@pytest.mark.parametrize("factor,should_pass", [(1.0, True), (2 / 3, False), (1.5, False)])
def test_cosine_distribution_ks_p3(factor, should_pass):
    kappa = 3.0
    w = np.asarray(sample_vmf_cosine(jax.random.key(7), kappa, 3, 3000))
    p = stats.kstest(w, _cdf_p3(factor * kappa)).pvalue
    assert (p > 0.01) == should_pass, p


def test_defense_output_is_unit_norm_and_centred_on_clipped_mean():
    tree = per_example_tree(jax.random.key(3), batch=6)
    mask = np.array([1, 1, 1, 1, 0, 0], np.float32)
    d = dp_vmf(kappa=5e4, clip_norm=1.0)
    g, state = d.apply(tree, d.init(None), key=jax.random.key(1), context=context(mask))
    flat = np.concatenate([np.asarray(g["v"]).ravel(), np.asarray(g["w"]).ravel()])
    np.testing.assert_allclose(np.linalg.norm(flat), 1.0, atol=1e-5)
    rows = np.concatenate([np.asarray(tree["v"]).reshape(6, -1),
                           np.asarray(tree["w"]).reshape(6, -1)], axis=1)[:4]
    mean = (rows / np.maximum(1, np.linalg.norm(rows, axis=1, keepdims=True))).mean(0)
    cos = flat @ mean / np.linalg.norm(mean)
    assert cos > 0.95  # κ = 5e4 in p = 37: tightly concentrated on μ
    chex.assert_shape(g["w"], (6, 5))
    assert state == ()


def test_defense_contract_and_errors():
    tree = per_example_tree(jax.random.key(4))
    d = dp_vmf(kappa=10.0)
    ctx = context(np.ones(8))
    check_keyed_randomness(d, tree, ctx, rtol=1e-4, atol=1e-5)
    assert dp_parameters(d).kappa == 10.0
    with pytest.raises(ValueError, match="kappa"):
        dp_vmf(kappa=0.0)
    with pytest.raises(ValueError, match="dim"):
        sample_vmf_cosine(jax.random.key(0), 1.0, 1, 4)
    with pytest.raises(ValueError, match="mu"):
        sample_vmf(jax.random.key(0), jnp.ones((2, 2)), 1.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_gradient_gives_a_nan_output_not_a_random_sample(bad):
    # Before, the NaN mean failed `norm > 0` and took the random fallback
    # direction: a finite unit-norm "gradient" the engine could not flag.
    tree = per_example_tree(jax.random.key(5))
    tree["w"] = tree["w"].at[0, 0, 0].set(bad)
    d = dp_vmf(kappa=10.0)
    g, _ = d.apply(tree, d.init(None), key=jax.random.key(1), context=context(np.ones(8)))
    assert all(np.isnan(np.asarray(leaf)).all() for leaf in jax.tree_util.tree_leaves(g))


def test_a_zero_mean_gradient_still_gets_a_unit_sample():
    tree = jax.tree_util.tree_map(jnp.zeros_like, per_example_tree(jax.random.key(6)))
    d = dp_vmf(kappa=10.0)
    g, _ = d.apply(tree, d.init(None), key=jax.random.key(1), context=context(np.ones(8)))
    flat = np.concatenate([np.asarray(leaf).ravel() for leaf in jax.tree_util.tree_leaves(g)])
    np.testing.assert_allclose(np.linalg.norm(flat), 1.0, atol=1e-5)


def test_sample_vmf_refuses_a_zero_mean_direction():
    with pytest.raises(ValueError, match="mu must be non-zero"):
        sample_vmf(jax.random.key(0), jnp.zeros(5), 1.0)
