"""DP-PSAC (Xia et al. 2023): weight function, sensitivity, noise, contract."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from defenses.dp import dp_parameters, dp_psac, psac_weights
from fedsim.hooks import build_defense
from tests.defenses.dp_helpers import check_keyed_randomness, context, flat_rows, per_example_tree


def test_weighted_norm_is_below_c_and_non_monotonic_scaling():
    s = np.logspace(-4, 3, 200)
    w = np.asarray(psac_weights(jnp.asarray(s), 0.1))
    np.testing.assert_allclose(w, 1 / (s + 0.1 / (s + 0.1)), rtol=1e-5)  # the stated formula
    assert np.all(s * w < 1.0)             # ‖ḡ‖ = C·s·w(s) < C
    assert s[0] * w[0] < 1e-2              # tiny gradients are not blown up to norm C


def test_reduction_matches_numpy_and_masks_padding():
    tree = per_example_tree(jax.random.key(0))
    mask = np.array([1, 1, 1, 0, 1, 1, 0, 0], np.float32)
    g, _ = dp_psac(0.0, clip_norm=2.0, r=0.5).apply(tree, (), key=jax.random.key(0),
                                                    context=context(mask))
    rows = np.asarray(flat_rows(tree))[mask > 0]
    s = np.linalg.norm(rows, axis=1, keepdims=True)
    expect = (2.0 * rows / (s + 0.5 / (s + 0.5))).sum(0) / mask.sum()
    got = np.concatenate([np.asarray(g["v"]).ravel(), np.asarray(g["w"]).ravel()])
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("factor,should_pass", [(1.0, True), (2 / 3, False), (1.5, False)])
def test_noise_ks(factor, should_pass):
    tree = {"w": jnp.zeros((5, 60, 50))}
    g, _ = dp_psac(0.8, clip_norm=1.5).apply(tree, (), key=jax.random.key(9),
                                             context=context(np.ones(5)))
    p = stats.kstest(np.asarray(g["w"]).ravel(), "norm", args=(0, factor * 0.8 * 1.5 / 5)).pvalue
    assert (p > 0.01) == should_pass, p


def test_contract():
    tree = per_example_tree(jax.random.key(1))
    d = dp_psac(1.0)
    ctx = context(np.ones(8))
    check_keyed_randomness(d, tree, ctx, rtol=1e-5, atol=1e-6)
    assert dp_parameters(d).mechanism == "gauss"
    with pytest.raises(ValueError, match="r must"):
        dp_psac(1.0, r=0.0)


@pytest.mark.parametrize("name", ["dp_psac", "dp_gaussian"])
@pytest.mark.parametrize("sigma", [float("nan"), float("inf"), -1.0, "zzz", None, True])
def test_a_noise_multiplier_that_is_not_a_finite_number_at_least_0_is_refused(name, sigma):
    # NaN used to pass dp_psac's `< 0` test, and its `sigma > 0` then added no
    # noise at all: a run "with DP" that had none.
    with pytest.raises(ValueError, match="noise_multiplier must be "):
        build_defense(name, noise_multiplier=sigma)


@pytest.mark.parametrize("r", [0.0, -0.1, float("nan")])
def test_psac_weights_refuses_a_stability_constant_that_is_not_positive(r):
    # Before, r = 0 gave w(0) = 1 / (0 + 0/0) = NaN without a word.
    with pytest.raises(ValueError, match="r"):
        psac_weights(jnp.zeros(2), r)
