"""DP-SGD Gaussian (001 Alg 1): clipping, reduction, noise statistics, contract."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from defenses.dp import (clip_examples, clip_layers, dp_clip, dp_gaussian, dp_parameters, dp_psac,
                         dp_vmf)
from fedsim.hooks import build_defense
from tests.defenses.dp_helpers import check_keyed_randomness, context, flat_rows, per_example_tree


def test_flat_clipping_bounds_every_norm_and_keeps_small_rows():
    m = jnp.concatenate([10 * jax.random.normal(jax.random.key(0), (20, 50)),
                         0.01 * jnp.ones((3, 50))])
    blocks = [m[:, :20], m[:, 20:]]  # one example's norm spans both blocks
    clipped, norms = clip_examples(blocks, 1.5)
    c = np.concatenate([np.asarray(b) for b in clipped], axis=1)
    out = np.linalg.norm(c, axis=1)
    assert np.all(out <= 1.5 * (1 + 1e-6))
    np.testing.assert_allclose(out[:20], 1.5, rtol=1e-5)  # big rows land on the sphere
    np.testing.assert_allclose(c[20:], np.asarray(m[20:]))  # small rows untouched
    np.testing.assert_allclose(norms, np.linalg.norm(np.asarray(m), axis=1), rtol=1e-5)
    # the same direction per example: the blocks are scaled together
    np.testing.assert_allclose(c[:20] * np.linalg.norm(np.asarray(m[:20]), axis=1)[:, None] / 1.5,
                               np.asarray(m[:20]), rtol=1e-4, atol=1e-5)


def test_per_layer_clipping_bounds_each_layer_and_matches_float64():
    m = np.asarray(flat_rows(per_example_tree(jax.random.key(1))))
    blocks = [m[:, :7], 10 * m[:, 7:]]  # the second layer's rows mostly exceed C
    clipped, norms = clip_layers([jnp.asarray(b) for b in blocks], 0.7)
    assert norms.shape == (m.shape[0], 2)
    for b, c in zip(blocks, clipped):
        b64 = b.astype(np.float64)
        n64 = np.linalg.norm(b64, axis=1)
        assert np.all(np.linalg.norm(np.asarray(c), axis=1) <= 0.7 * (1 + 1e-6))
        np.testing.assert_allclose(np.asarray(c), b64 / np.maximum(1.0, n64 / 0.7)[:, None],
                                   rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(norms), np.stack(
        [np.linalg.norm(b.astype(np.float64), axis=1) for b in blocks], 1), rtol=1e-5)


def test_reduction_matches_numpy_without_noise_and_ignores_padding():
    tree = per_example_tree(jax.random.key(2))
    mask = np.array([1, 1, 1, 1, 1, 0, 0, 0], np.float32)
    d = dp_gaussian(0.0, clip_norm=2.0)
    g, _ = d.apply(tree, (), key=jax.random.key(0), context=context(mask))
    # independent computation in numpy
    rows = np.asarray(flat_rows(tree))[:5]
    clipped = rows / np.maximum(1, np.linalg.norm(rows, axis=1, keepdims=True) / 2.0)
    expect = clipped.sum(0) / 5
    got = np.concatenate([np.asarray(g["v"]).ravel(), np.asarray(g["w"]).ravel()])
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)


def test_per_layer_reduction_matches_float64_on_a_million_coordinate_layer():
    # A layer of 2**20 coordinates (Conv-2's first dense layer is 2**21): the
    # former segment-sum over a flat [B, P] matrix was off by 2.6e-4 relative here.
    k1, k2 = jax.random.split(jax.random.key(7))
    tree = {"big": 0.01 * jax.random.normal(k1, (4, 1024, 1024)),
            "small": 3.0 * jax.random.normal(k2, (4, 10))}
    mask = np.array([1, 1, 1, 0], np.float32)
    g, _ = dp_clip(1.0).apply(tree, (), key=jax.random.key(0), context=context(mask))
    expect = {}
    for name, leaf in tree.items():
        rows = np.asarray(leaf, np.float64).reshape(4, -1)[:3]
        clipped = rows / np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
        expect[name] = clipped.sum(0) / 3
    for name, e in expect.items():
        got = np.asarray(g[name], np.float64).ravel()
        assert np.max(np.abs(got - e)) <= 2e-6 * np.max(np.abs(e)), name


@pytest.mark.parametrize("factor,should_pass", [(1.0, True), (2 / 3, False), (1.5, False)])
def test_noise_is_gaussian_with_std_sigma_c_over_batch(factor, should_pass):
    batch, sigma, clip = 4, 1.3, 0.5
    tree = {"w": jnp.zeros((batch, 40, 50)), "v": jnp.zeros((batch, 100))}
    g, _ = dp_gaussian(sigma, clip_norm=clip).apply(tree, (), key=jax.random.key(3),
                                                    context=context(np.ones(batch)))
    noise = np.concatenate([np.asarray(l).ravel() for l in jax.tree_util.tree_leaves(g)])
    p = stats.kstest(noise, "norm", args=(0.0, factor * sigma * clip / batch)).pvalue
    assert (p > 0.01) == should_pass, p


def test_per_layer_noise_scale_is_sigma_c_sqrt_layers():
    tree = {"w": jnp.zeros((2, 60, 50)), "v": jnp.zeros((2, 100))}
    g, _ = dp_gaussian(1.0, clip_norm=1.0, clipping="per_layer").apply(
        tree, (), key=jax.random.key(4), context=context(np.ones(2)))
    noise = np.concatenate([np.asarray(l).ravel() for l in jax.tree_util.tree_leaves(g)])
    assert stats.kstest(noise, "norm", args=(0.0, np.sqrt(2) / 2)).pvalue > 0.01


def test_contract_pure_keys_shapes_jit():
    tree = per_example_tree(jax.random.key(5))
    d = dp_gaussian(1.0)
    ctx = context(np.ones(8))
    a = check_keyed_randomness(d, tree, ctx, rtol=1e-5, atol=1e-6)
    _, sa = d.apply(tree, d.init(None), key=jax.random.key(1), context=ctx)
    chex.assert_shape(a["w"], (6, 5))
    chex.assert_shape(a["v"], (7,))
    assert a["w"].dtype == tree["w"].dtype and sa == ()
    chex.assert_tree_all_finite(a)


def test_registry_config_and_errors():
    d = build_defense("dp_gaussian", noise_multiplier=0.5, clip_norm=2.0)
    assert d.stage == "example"
    assert dp_parameters(d).noise_multiplier == 0.5
    assert dp_parameters(dp_clip()).mechanism == "clip"
    with pytest.raises(ValueError, match="noise_multiplier"):
        dp_gaussian(-1.0)
    with pytest.raises(ValueError, match="clip_norm"):
        dp_gaussian(1.0, clip_norm=0.0)
    with pytest.raises(ValueError, match="clipping"):
        dp_gaussian(1.0, clipping="layer")
    # The error lists what the defense takes.
    with pytest.raises(ValueError, match=r"bad arguments .*; it takes noise_multiplier, "
                                         r"clip_norm=1.0, clipping='flat'"):
        build_defense("dp_gaussian", sigma=1.0)
    with pytest.raises(ValueError, match="batch dimension"):
        dp_gaussian(1.0).apply({"a": jnp.zeros((3, 2)), "b": jnp.zeros((4,))}, (),
                               key=jax.random.key(0))


def test_two_example_stage_defenses_are_refused_by_name():
    # Each reduces the per-example gradients to one gradient: chained, the second
    # took that gradient for a batch and failed at trace time with a shape error.
    from fedsim.config import ConfigError
    from fedsim.simulation import _load_defenses, build_defenses

    _load_defenses()
    with pytest.raises(ConfigError, match=r"config key 'defenses': defenses dp_gaussian\(.*\), "
                                          r"dp_vmf\(.*\) all act at the 'example' stage"):
        build_defenses([{"name": "dp_gaussian", "noise_multiplier": 1.0},
                        {"name": "dp_vmf", "kappa": 100.0}])


@pytest.mark.parametrize("clip", [clip_examples, clip_layers])
def test_the_clipping_functions_refuse_a_bound_or_rows_they_would_misuse(clip):
    rows = [jnp.full((4, 3), 3.0), jnp.ones((4, 2))]
    # Before: C = -1 left every row as it was, C = 0 zeroed them, without a word.
    for bad in (-1.0, 0.0, float("nan")):
        with pytest.raises(ValueError, match="clip_norm must be a finite number > 0"):
            clip(rows, bad)
    with pytest.raises(ValueError, match=rf"{clip.__name__}: rows must be a non-empty list"):
        clip({"w": jnp.ones((4, 3))}, 1.0)  # the per-example pytree dp_gaussian takes
    with pytest.raises(ValueError, match=rf"{clip.__name__}: rows must be a non-empty list"):
        clip(jnp.ones((4, 3)), 1.0)
    with pytest.raises(ValueError, match=r"rows must be \[B, n\] arrays with one B"):
        clip([jnp.ones((4, 3)), jnp.ones((5, 3))], 1.0)
    jax.jit(lambda c: clip(rows, c)[0])(jnp.float32(1.0))  # a traced bound is left to the caller


@pytest.mark.parametrize("factory", [lambda: dp_gaussian(1.0), lambda: dp_vmf(10.0),
                                     lambda: dp_psac(1.0)])
@pytest.mark.parametrize("shape", [(1,), (5,), (8, 1), ()])
def test_a_mask_that_is_not_one_entry_per_example_is_refused(factory, shape):
    # Before, a (1,) mask broadcast: the mean over the batch became its sum.
    tree = per_example_tree(jax.random.key(0))  # batch 8
    d = factory()
    with pytest.raises(ValueError, match=r"context.mask must have shape \(8,\), one 0/1 entry "
                                         r"per example"):
        d.apply(tree, d.init(None), key=jax.random.key(1), context=context(np.ones(shape)))
