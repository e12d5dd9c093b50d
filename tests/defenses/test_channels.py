"""Tests of the data-space channels of 000 (natural, white, personalized, compression)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

from defenses.bounds import channel_capacity, personalized_channel_bound, personalized_channel_terms
from defenses.channels import (
    data_statistics,
    eigen_compression,
    natural_channel,
    natural_noise_variance,
    paper_prior_beta,
    personalized_channel,
    personalized_exact_capacity,
    personalized_noise_scale,
    white_channel,
    white_noise_variances,
)
from fedsim.hooks import DefenseContext, build_defense

SHAPE = (4, 4, 1)
D = 16


def correlated_data(n=4000, seed=0):
    """Correlated inputs with a full-rank, far-from-isotropic covariance."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(D, D)) * np.linspace(2.0, 0.1, D)[None, :]
    x = rng.normal(size=(n, D)) @ mix.T + 0.5
    return x.reshape((n,) + SHAPE).astype(np.float32)


@pytest.fixture(scope="module")
def stats():
    return data_statistics(correlated_data())


def beta_prior():
    b = np.ones(SHAPE)
    b[1:3, 1:3] = 50.0
    return b


def build(kind, stats, kappa=5.0):
    if kind == "natural":
        return natural_channel(kappa, statistics=stats)
    if kind == "white":
        return white_channel(kappa, statistics=stats)
    return personalized_channel(kappa, statistics=stats, beta=beta_prior())


def noise_samples(defense, n, key):
    x = jnp.zeros((n,) + SHAPE, jnp.float32)
    xt, _ = defense.apply(x, defense.init(None), key=key)
    return np.asarray(xt, np.float64).reshape(n, D)


KINDS = ("natural", "white", "personalized")


def spec_covariance(kind, stats, kappa=5.0):
    if kind == "natural":
        return natural_noise_variance(stats, kappa) * np.eye(D)
    if kind == "white":
        q = stats.eigenvectors
        return (q * white_noise_variances(stats, kappa)) @ q.T
    return personalized_noise_scale(stats, kappa, beta_prior()) * np.diag(beta_prior().ravel())


def test_statistics_match_numpy(stats):
    x = correlated_data().reshape(-1, D).astype(np.float64)
    chex.assert_trees_all_close(stats.covariance, np.cov(x, rowvar=False), rtol=1e-6, atol=1e-8)
    recon = (stats.eigenvectors * stats.eigenvalues) @ stats.eigenvectors.T
    chex.assert_trees_all_close(recon, stats.covariance, atol=1e-8)
    assert np.all(np.diff(stats.eigenvalues) <= 0)


@pytest.mark.parametrize("kind", KINDS)
def test_noise_covariance_matches_specification(kind, stats):
    n = 40_000
    xi = noise_samples(build(kind, stats), n, jax.random.key(1))
    target = spec_covariance(kind, stats)
    sample_cov = np.cov(xi, rowvar=False)
    # Sample covariance error is ~ sqrt(2/n) * scale; 5 standard errors.
    scale = np.sqrt(np.outer(np.diag(target), np.diag(target)))
    assert np.max(np.abs(sample_cov - target) / scale) < 5 * np.sqrt(2.0 / n)
    assert np.max(np.abs(xi.mean(0)) / np.sqrt(np.diag(target))) < 5 / np.sqrt(n)


@pytest.mark.parametrize("kappa", [0.5, 5.0, 40.0])
def test_natural_and_white_capacity_equals_kappa(kappa, stats):
    sigma = natural_noise_variance(stats, kappa)
    assert abs(channel_capacity(stats.eigenvalues, sigma) - kappa) < 1e-6
    # Independent check: ½ ln det(Σ_D + σI) − ½ d ln σ.
    _, logdet = np.linalg.slogdet(stats.covariance + sigma * np.eye(D))
    assert abs(0.5 * (logdet - D * np.log(sigma)) - kappa) < 1e-6
    psi = white_noise_variances(stats, kappa)
    assert abs(channel_capacity(stats.eigenvalues, psi) - kappa) < 1e-9
    q = stats.eigenvectors
    cov_xi = (q * psi) @ q.T
    _, ld_sum = np.linalg.slogdet(stats.covariance + cov_xi)
    _, ld_xi = np.linalg.slogdet(cov_xi)
    assert abs(0.5 * (ld_sum - ld_xi) - kappa) < 1e-6


@pytest.mark.parametrize("kappa", [0.5, 5.0, 40.0])
def test_personalized_capacity_at_most_kappa(kappa, stats):
    beta = beta_prior()
    sigma = personalized_noise_scale(stats, kappa, beta)
    terms = personalized_channel_terms(stats.covariance, beta.ravel())
    assert abs(personalized_channel_bound(sigma, terms) - kappa) < 1e-6
    exact = personalized_exact_capacity(stats, sigma, beta)
    assert 0 < exact <= kappa + 1e-9


@pytest.mark.parametrize("kind", KINDS)
def test_ks_at_true_scale_passes_and_wrong_scale_fails(kind, stats):
    xi = noise_samples(build(kind, stats), 4000, jax.random.key(7))
    if kind == "natural":
        z = xi / np.sqrt(natural_noise_variance(stats, 5.0))
    elif kind == "white":
        psi = white_noise_variances(stats, 5.0)
        z = (xi @ stats.eigenvectors) / np.sqrt(psi)
    else:
        z = xi / np.sqrt(personalized_noise_scale(stats, 5.0, beta_prior()) * beta_prior().ravel())
    z = z.ravel()
    assert sps.kstest(z, "norm").pvalue > 1e-3
    assert sps.kstest(z, "norm", args=(0, 2 / 3)).pvalue < 1e-6
    assert sps.kstest(z, "norm", args=(0, 3 / 2)).pvalue < 1e-6


@pytest.mark.parametrize("kind", KINDS + ("compression",))
def test_contract(kind, stats):
    d = eigen_compression(1, statistics=stats) if kind == "compression" else build(kind, stats)
    x = jnp.asarray(correlated_data(8, seed=3))
    mask = jnp.array([1, 1, 1, 1, 1, 1, 0, 0], jnp.float32)
    x = x * mask[:, None, None, None]
    ctx = DefenseContext(x=x, mask=mask)
    state = d.init(None)
    k1, k2 = jax.random.key(0), jax.random.key(1)
    out1, s1 = d.apply(x, state, key=k1, context=ctx)
    out1b, _ = d.apply(x, state, key=k1, context=ctx)
    out2, _ = d.apply(x, state, key=k2, context=ctx)
    jit_out, _ = jax.jit(lambda x, k: d.apply(x, state, key=k, context=ctx))(x, k1)
    chex.assert_shape(out1, x.shape)
    assert out1.dtype == x.dtype
    chex.assert_trees_all_equal_structs(s1, state)
    chex.assert_tree_all_finite(out1)
    chex.assert_trees_all_close(out1, out1b)
    chex.assert_trees_all_close(out1, jit_out, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out1[6:]), 0.0)  # padding untouched
    if kind == "compression":
        chex.assert_trees_all_close(out1, out2)  # deterministic
    else:
        assert not np.allclose(out1, out2)


def test_compression_removes_exactly_one_component(stats):
    x = jnp.asarray(correlated_data(50, seed=4))
    for rank in (0, 1, 10):
        out, _ = eigen_compression(rank, statistics=stats).apply(x, (), key=jax.random.key(0))
        coords = (np.asarray(out, np.float64).reshape(50, D) - stats.mean) @ stats.eigenvectors
        orig = (np.asarray(x, np.float64).reshape(50, D) - stats.mean) @ stats.eigenvectors
        assert np.max(np.abs(coords[:, rank])) < 1e-4
        keep = [i for i in range(D) if i != rank]
        np.testing.assert_allclose(coords[:, keep], orig[:, keep], atol=1e-4)
    out, _ = eigen_compression("max", statistics=stats).apply(x, (), key=jax.random.key(0))
    out0, _ = eigen_compression(0, statistics=stats).apply(x, (), key=jax.random.key(0))
    chex.assert_trees_all_close(out, out0)


def test_more_kappa_less_noise(stats):
    sig = [natural_noise_variance(stats, k) for k in (1, 5, 20)]
    assert sig[0] > sig[1] > sig[2]
    beta = beta_prior()
    sig = [personalized_noise_scale(stats, k, beta) for k in (1, 5, 20)]
    assert sig[0] > sig[1] > sig[2]


def test_registry_and_errors(stats):
    d = build_defense("natural_channel", kappa=2.0, data=correlated_data(100))
    assert d.stage == "data" and d.name == "natural_channel(kappa=2)"  # κ named
    with pytest.raises(ValueError, match="kappa"):
        natural_channel(-1.0, statistics=stats)
    with pytest.raises(ValueError, match="exactly one"):
        white_channel(1.0)
    with pytest.raises(ValueError, match="beta"):
        personalized_channel(1.0, statistics=stats, beta=np.ones(3))
    with pytest.raises(ValueError, match="32x32"):
        paper_prior_beta((16, 16, 1))
    with pytest.raises(ValueError, match="example shape"):
        natural_channel(1.0, statistics=stats).apply(jnp.zeros((2, 8, 8, 1)), (),
                                                     key=jax.random.key(0))
    with pytest.raises(ValueError, match="component"):
        eigen_compression("biggest", statistics=stats)


def test_paper_prior():
    beta = paper_prior_beta((32, 32, 3))
    assert beta.shape == (32, 32, 3)
    assert np.sum(beta == 50) == 8 * 16 * 3
    assert beta[12, 8, 0] == 50 and beta[19, 23, 2] == 50
    assert beta[11, 8, 0] == 1 and beta[12, 24, 0] == 1 and beta[20, 8, 0] == 1


def test_personalized_noise_scale_small_and_large_kappa(stats):
    beta = beta_prior()
    for kappa in (3.0, 30.0):  # U(σ) = κ and the exact capacity is below it
        sigma = personalized_noise_scale(stats, kappa, beta)
        terms = personalized_channel_terms(stats.covariance, beta.ravel())
        assert abs(personalized_channel_bound(sigma, terms) - kappa) < 1e-6
        assert personalized_exact_capacity(stats, sigma, beta) <= kappa + 1e-6
    # κ = 1500 (Fig 15): U(σ) = κ still solved, exact capacity ≤ κ.
    big = data_statistics(np.random.default_rng(1).normal(size=(3000, 4, 4, 1)) * 1e3)
    sigma = personalized_noise_scale(big, 1500.0, np.ones(SHAPE))
    terms = personalized_channel_terms(big.covariance, np.ones(D))
    assert abs(personalized_channel_bound(sigma, terms) - 1500.0) < 1e-6
    assert personalized_exact_capacity(big, sigma, np.ones(SHAPE)) <= 1500.0 + 1e-6
