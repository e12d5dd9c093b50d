"""Masks as pytrees of {0,1}: applying one checks that it fits the parameters."""

import jax
import jax.numpy as jnp
import pytest


def test_a_mask_that_does_not_fit_the_parameters_is_refused_by_name():
    from defenses.pruning.masks import apply_mask
    params = {"Dense_0": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones(2)}}
    # Before: an (out,) leaf against an (in, out) kernel broadcast, masking whole columns.
    with pytest.raises(ValueError, match=r"mask: leaf \['Dense_0'\]\['kernel'\] has shape "
                                         r"\(2,\), the parameter \(3, 2\)"):
        apply_mask(params, {"Dense_0": {"kernel": jnp.asarray([1.0, 0.0]), "bias": jnp.ones(2)}})
    with pytest.raises(ValueError, match=r"mask: its pytree structure differs from the "
                                         r"parameters' \(1 leaves against 2\)"):
        apply_mask(params, {"Dense_0": {"kernel": jnp.ones((3, 2))}})
    ones = jax.tree_util.tree_map(jnp.ones_like, params)
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(
        lambda a, b: bool(jnp.array_equal(a, b)), jax.jit(apply_mask)(params, ones), params))


def test_unflatten_and_an_eligible_mask_check_their_sizes():
    from defenses.pruning.masks import flatten, mask_from_scores, unflatten
    like = {"a": jnp.ones((2, 3)), "b": jnp.ones(4)}
    v = flatten(like)
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(
        lambda x, y: bool(jnp.array_equal(x, y)), unflatten(v, like), like))
    for bad in (jnp.ones(11), jnp.ones(9), jnp.ones((10, 1))):  # 11 lost its tail before
        with pytest.raises(ValueError, match=r"unflatten: expected a vector of the tree's 10 "
                                             r"coordinates"):
            unflatten(bad, like)
    with pytest.raises(ValueError, match=r"eligible: leaf \['a'\] has shape \(3,\)"):
        mask_from_scores(like, 0.5, eligible={"a": jnp.ones(3), "b": jnp.ones(4)})
