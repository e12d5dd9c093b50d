"""A defense that draws random numbers names itself when it is given no usable key."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from defenses.channels import (data_statistics, natural_channel, parameter_channel,
                               personalized_channel, white_channel)
from defenses.dp import (client_level_dp, dp_gaussian, dp_psac, dp_vmf, update_gaussian,
                         update_laplace)
from defenses.pruning import prune_largest, prune_mix, prune_random
from fedsim.keys import require_key

SHAPE = (4, 4)


def _stats():
    x = np.random.default_rng(0).normal(size=(32,) + SHAPE).astype(np.float32)
    return data_statistics(x)


def _per_example():
    return {"w": jnp.ones((3, 5)), "b": jnp.ones((3, 2))}


def _update():
    return {"w": jnp.arange(5.0), "b": jnp.ones(2)}


# (what to build, what to call apply on, the name the message must carry)
CASES = {
    "dp_gaussian": (lambda: dp_gaussian(1.0), _per_example, r"dp_gaussian\(sigma=1"),
    "dp_vmf": (lambda: dp_vmf(10.0), _per_example, r"dp_vmf\(kappa=10"),
    "dp_psac": (lambda: dp_psac(1.0), _per_example, "dp_psac"),
    "update_gaussian": (lambda: update_gaussian(0.1), _update, r"update_gaussian\(sigma=0.1"),
    "update_laplace": (lambda: update_laplace(0.1), _update, r"update_laplace\(b=0.1"),
    "client_level_dp": (lambda: client_level_dp(1.0, 1.0, 4), _update, "client_level_dp"),
    "prune_random": (lambda: prune_random(0.5), _update, r"random\(p=0.5"),
    "prune_mix": (lambda: prune_mix(0.2, 0.3), _update, "mix"),
    "natural_channel": (lambda: natural_channel(2.0, statistics=_stats()),
                        lambda: jnp.zeros((2,) + SHAPE), r"natural_channel\(kappa=2"),
    "white_channel": (lambda: white_channel(2.0, statistics=_stats()),
                      lambda: jnp.zeros((2,) + SHAPE), "white_channel"),
    "personalized_channel": (lambda: personalized_channel(2.0, statistics=_stats(),
                                                          beta=np.ones(SHAPE)),
                             lambda: jnp.zeros((2,) + SHAPE), "personalized_channel"),
    "parameter_channel": (lambda: parameter_channel(2.0), _update, "parameter_channel"),
}


@pytest.mark.parametrize("bad_key,said", [(None, "key=None"), (3, "got a int"),
                                          (jnp.ones(2), "dtype float32")])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_noise_drawing_defense_names_itself_and_the_bad_key(case, bad_key, said):
    build, value, name = CASES[case]
    defense = build()
    with pytest.raises(TypeError, match=name) as caught:
        defense.apply(value(), defense.init(None), key=bad_key)
    assert said in str(caught.value) and "jax.random.key(seed)" in str(caught.value)


@pytest.mark.parametrize("case", ["dp_gaussian", "update_laplace", "prune_random",
                                  "natural_channel"])
def test_typed_raw_and_traced_keys_pass(case):
    build, value, _ = CASES[case]
    defense = build()
    state = defense.init(None)
    typed, _ = defense.apply(value(), state, key=jax.random.key(1))
    raw, _ = defense.apply(value(), state, key=jax.random.PRNGKey(1))
    traced, _ = jax.jit(lambda k: defense.apply(value(), state, key=k))(jax.random.key(1))
    # A raw key is the same key as the typed one: the same noise; under jit too, up to
    # the rounding of fused operations.
    jax.tree_util.tree_map(np.testing.assert_array_equal, typed, raw)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
                           typed, traced)


def test_a_defense_that_draws_nothing_needs_no_key():
    clip_only, state = dp_gaussian(0.0), ()
    out, _ = clip_only.apply(_per_example(), state, key=None)
    np.testing.assert_allclose(out["w"], np.full(5, 1 / np.sqrt(7)), rtol=1e-6)  # ‖(1,…,1)‖ = √7
    largest = prune_largest(0.4)
    kept, _ = largest.apply(_update(), largest.init(None), key=None)
    assert int(jnp.sum(kept["w"] == 0) + jnp.sum(kept["b"] == 0)) > 0


def test_require_key_accepts_keys_only():
    require_key(jax.random.key(0), "x")
    require_key(jax.random.PRNGKey(0), "x")
    with pytest.raises(TypeError, match="step y draws random numbers and needs a key; got key=None"):
        require_key(None, "step y")
    with pytest.raises(TypeError, match=r"step y needs a JAX random key; got an array of dtype "
                                        r"int32 and shape \(2,\)"):
        require_key(jnp.zeros(2, jnp.int32), "step y")
