"""GC / magnitude pruning: exact counts, independent check, defense contract."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedsim.hooks import build_defense
from defenses.pruning import flatten, magnitude_prune, mask_from_scores, random_mask


def _tree(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return {"a": {"w": jax.random.normal(k1, (7, 5)), "b": jax.random.normal(k2, (5,))},
            "c": jax.random.normal(k3, (3, 2, 4))}


@pytest.mark.parametrize("p", [0.0, 0.1, 0.37, 0.5, 0.9, 1.0])
def test_magnitude_prune_matches_numpy_quantile(p):
    tree = _tree(jax.random.key(0))
    out = magnitude_prune(tree, p)
    v = np.asarray(flatten(tree))
    d = v.size
    k = int(round(p * d))
    # Independent computation: keep the d-k largest |v| (values are distinct).
    keep = np.zeros(d, bool)
    keep[np.argsort(-np.abs(v))[: d - k]] = True
    expected = np.where(keep, v, 0.0)
    np.testing.assert_array_equal(np.asarray(flatten(out)), expected)
    assert int(np.sum(np.asarray(flatten(out)) == 0)) == k


def test_gc_defense_contract():
    d = build_defense("gc", p=0.6)
    assert d.stage == "upload"
    tree = _tree(jax.random.key(1))
    state = d.init(tree)
    out, st = d.apply(tree, state, key=jax.random.key(2))
    out_jit, _ = jax.jit(lambda t: d.apply(t, state, key=jax.random.key(2)))(tree)
    chex.assert_trees_all_close(out, out_jit)
    chex.assert_trees_all_equal_shapes_and_dtypes(out, tree)
    chex.assert_tree_all_finite(out)
    assert st == state
    # Pure: the input is untouched and the output depends only on the input.
    out2, _ = d.apply(tree, state, key=jax.random.key(3))
    chex.assert_trees_all_close(out, out2)  # deterministic: the key is unused by design
    kept = np.asarray(flatten(out)) != 0
    assert abs(kept.mean() - 0.4) < 1.0 / kept.size + 1e-9
    # Every kept coordinate is at least as large in |.| as every pruned one.
    v = np.abs(np.asarray(flatten(tree)))
    assert v[kept].min() >= v[~kept].max()


@pytest.mark.parametrize("bad", [-0.1, 1.5, "x"])
def test_gc_bad_rate_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="gc p"):
        build_defense("gc", p=bad)


def test_mask_from_scores_highest_and_eligible():
    scores = {"w": jnp.arange(10.0)}
    m = mask_from_scores(scores, 0.3, "highest")
    np.testing.assert_array_equal(np.asarray(m["w"]), [1] * 7 + [0] * 3)
    elig = {"w": jnp.array([1.0] * 5 + [0.0] * 5)}
    m = mask_from_scores(scores, 0.3, "highest", eligible=elig)
    np.testing.assert_array_equal(np.asarray(m["w"]), [1, 1, 0, 0, 0] + [1] * 5)


def test_random_mask_exact_count_and_key_dependence():
    like = _tree(jax.random.key(0))
    m1 = random_mask(jax.random.key(5), like, 0.5)
    m2 = random_mask(jax.random.key(5), like, 0.5)
    m3 = random_mask(jax.random.key(6), like, 0.5)
    chex.assert_trees_all_close(m1, m2)
    assert not np.array_equal(np.asarray(flatten(m1)), np.asarray(flatten(m3)))
    assert int(np.sum(np.asarray(flatten(m1)) == 0)) == round(0.5 * flatten(like).size)


@pytest.mark.parametrize("k", [0, 1, 17, 250, 260, 520, 536])
@pytest.mark.parametrize("prune", ["lowest", "highest"])
def test_mask_from_scores_equals_stable_argsort_with_ties(k, prune):
    """The bisection selection against an independent numpy stable argsort (ties, ±0)."""
    v = jnp.concatenate([jax.random.normal(jax.random.key(3), (500,)), jnp.zeros(30),
                         jnp.array([1.0] * 5 + [-0.0])])
    sv = -np.asarray(v) if prune == "highest" else np.asarray(v)
    ref = np.ones(v.size)
    ref[np.argsort(np.where(sv == 0, 0.0, sv), kind="stable")[:k]] = 0
    got = np.asarray(mask_from_scores({"v": v}, k / v.size, prune)["v"])
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("k", [0, 3, 40, 41, 60, 95, 120])
@pytest.mark.parametrize("prune", ["lowest", "highest"])
def test_selection_over_leaves_equals_stable_argsort_of_the_flat_vector(k, prune):
    """Ties that straddle leaves are broken by flat position (leaf order, then row-major),
    ineligible coordinates are never pruned, and a traced k gives the same mask."""
    from defenses.pruning.masks import mask_pruning_count
    vals = np.round(np.asarray(jax.random.normal(jax.random.key(7), (120,))), 1)  # many ties
    vals[::13] = 0.0
    vals[5] = -0.0
    tree = {"a": jnp.asarray(vals[:35].reshape(7, 5)), "b": jnp.asarray(vals[35:40]),
            "c": jnp.asarray(vals[40:].reshape(4, 5, 4))}
    elig_flat = (np.arange(120) % 7 != 3).astype(np.float32)
    eligible = {"a": jnp.asarray(elig_flat[:35].reshape(7, 5)),
                "b": jnp.asarray(elig_flat[35:40]), "c": jnp.asarray(elig_flat[40:].reshape(4, 5, 4))}
    flat = np.asarray(flatten(tree))
    np.testing.assert_array_equal(flat, vals)  # leaf order of the pytree is a, b, c
    sv = -flat if prune == "highest" else flat
    sv = np.where(sv == 0, 0.0, sv)
    ref = np.ones(120)
    ref[np.argsort(sv, kind="stable")[:k]] = 0
    np.testing.assert_array_equal(np.asarray(flatten(mask_from_scores(tree, k / 120, prune))), ref)
    # Among the eligible only, with k traced under jit.
    ranked = [i for i in np.argsort(np.where(elig_flat > 0, sv, np.inf), kind="stable")
              if elig_flat[i] > 0]
    ref_e = np.ones(120)
    ref_e[ranked[:min(k, len(ranked))]] = 0
    got = jax.jit(lambda s, e, n: mask_pruning_count(s, n, prune, e))(tree, eligible, k)
    np.testing.assert_array_equal(np.asarray(flatten(got)), ref_e)


def test_rate_count_rounds_decimal_rates_exactly_where_float32_is_off_by_one():
    """round(p·n), half to even, against exact decimal arithmetic, n traced up to 2**31 - 1."""
    from fractions import Fraction

    from defenses.pruning.masks import rate_count
    rng = np.random.default_rng(0)
    ns = np.concatenate([[0, 1, 2, 3, 5, 10, 15, 65535, 65536, 65537, 3_897_298, 2**31 - 1],
                         rng.integers(0, 2**31 - 1, 400), rng.integers(0, 10**6, 400),
                         20 * rng.integers(0, 2**31 // 20, 400) + rng.integers(0, 20, 400)])
    count = lambda p: jax.jit(jax.vmap(lambda n: rate_count(p, n)))
    for p in (0.0, 0.05, 0.1, 0.15, 0.25, 0.3, 0.35, 0.5, 0.7, 0.75, 0.9, 1.0):
        want = [round(Fraction(repr(p)) * int(n)) for n in ns]  # the decimal p, exact
        np.testing.assert_array_equal(np.asarray(count(p)(ns.astype(np.int32))), want,
                                      err_msg=f"p={p}")
    # Rates without a short decimal form: Python's float64 round(p * n).
    small = ns[ns < 10**7]
    for p in (1 / 3, 0.123456789):
        np.testing.assert_array_equal(np.asarray(count(p)(small.astype(np.int32))),
                                      [round(p * int(n)) for n in small], err_msg=f"p={p}")
    # The float32 rounding this replaces is off by one there.
    assert int(jnp.round(0.3 * jnp.int32(3_897_298))) == 1_169_190
    assert int(rate_count(0.3, 3_897_298)) == 1_169_189 == round(0.3 * 3_897_298)


def test_two_sum_returns_the_rounding_error_under_jit():
    """rate_count's compensated sum: XLA must not simplify (a + b) − a to b."""
    from defenses.pruning.masks import _two_sum
    a, b = jnp.float32(1.0), jnp.float32(2.0 ** -30)
    s, err = jax.jit(_two_sum)(a, b)
    assert float(s) == 1.0 and float(err) == 2.0 ** -30
    s, err = jax.jit(_two_sum)(jnp.float32(3.0), jnp.float32(0.1))
    assert float(s) + float(err) == 3.0 + float(jnp.float32(0.1))  # exact in float64
