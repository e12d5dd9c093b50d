"""fedsim.hooks: a chain's keys and order, and the global pruning mask around a defense.

Checked against the properties the module's docstrings state (and paper 002,
Chu et al. 2023, Alg 1 line 11 for the mask), on plain arrays: no model here.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedsim.hooks import Defense, chain, mask_around, mask_start

N = 20_000  # coordinates: a sample variance within ±2 % (one sd) of its expectation


def _noise(stage="upload") -> Defense:
    """Adds N(0, 1) noise drawn from its key."""

    def apply(v, state, *, key, context=None):
        return v + jax.random.normal(key, v.shape, v.dtype), state

    return Defense(init=lambda p: (), apply=apply, stage=stage, name="noise")


def _begin_adding(c=None) -> Defense:
    """begin_round: start from global + c, or global + N(0, 1) from its key when c is None."""

    def begin(g, state, *, key, context=None):
        return (g + c if c is not None else g + jax.random.normal(key, g.shape, g.dtype)), state

    return Defense(init=lambda p: (), apply=lambda v, s, *, key=None, context=None: (v, s),
                   stage="upload", name="begin", begin_round=begin)


def test_two_chained_defenses_draw_independent_noise():
    """Kills ``d.apply(value, s, key=key, ...)`` in ``chain`` (the index not folded in).

    Reference: the ``chain`` docstring: each defense gets its own key, so two
    chained defenses never share randomness. Two N(0, 1) noise defenses on 0 then
    give variance 2 per coordinate; with one key for both, 2·n has variance 4.
    """
    d = chain(_noise(), _noise())
    out, _ = d.apply(jnp.zeros(N), d.init(None), key=jax.random.key(0))
    assert 1.8 < float(jnp.var(out)) < 2.2, float(jnp.var(out))


def test_two_chained_begin_rounds_draw_independent_noise():
    """Kills ``d.begin_round(params, s, key=key, ...)`` in ``chain``'s begin.

    Reference: as above, for ``begin_round``: each chained defense's start-model
    draw has its own key, so two N(0, 1) perturbations add to variance 2, not 4.
    """
    d = chain(_begin_adding(), _begin_adding())
    start, _ = d.begin_round(jnp.zeros(N), d.init(None), key=jax.random.key(1))
    assert 1.8 < float(jnp.var(start)) < 2.2, float(jnp.var(start))


def test_chained_begin_rounds_compose_left_to_right():
    """Kills ``d.begin_round(global_params, s, ...)`` (each part starting from the global model).

    Reference: the ``chain`` docstring: the defenses are composed, left to right,
    so the second part's start model is made from the first's: g + 1 + 10.
    """
    d = chain(_begin_adding(1.0), _begin_adding(10.0))
    start, _ = d.begin_round(jnp.full(3, 5.0), d.init(None), key=jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(start), [16.0, 16.0, 16.0])


def test_mask_around_zeroes_what_the_defense_puts_on_pruned_coordinates():
    """Kills ``return value, state`` in ``mask_around``'s apply (the mask after the defense dropped).

    Reference: the ``mask_around`` docstring and Chu et al. 2023 Alg 1 line 11:
    what the defense puts on pruned coordinates (noise here) is taken off again,
    so the upload is exactly 0 where the mask is 0, and the defense's output where
    it is 1.
    """
    mask = (jnp.arange(1000) % 3 == 0).astype(jnp.float32)
    value = jnp.ones(1000)
    key = jax.random.key(2)
    out, _ = mask_around(mask, _noise()).apply(value, (), key=key)
    out = np.asarray(out)
    assert np.all(out[np.asarray(mask) == 0] == 0.0)
    plain, _ = _noise().apply(value * mask, (), key=key)
    np.testing.assert_array_equal(out[np.asarray(mask) == 1], np.asarray(plain)[np.asarray(mask) == 1])


def test_mask_start_masks_the_start_model_a_begin_round_makes():
    """Kills ``return start, state`` in ``mask_start`` (the start model left unmasked).

    Reference: the ``mask_around``/``mask_start`` docstrings: a pruned weight is 0
    in every model a client trains, whatever the defense's begin_round puts back.
    """
    mask = jnp.array([1.0, 0.0, 1.0, 0.0])
    for d in (mask_start(mask, _begin_adding(2.0)), mask_around(mask, _begin_adding(2.0))):
        start, _ = d.begin_round(jnp.array([1.0, 1.0, 3.0, 3.0]), (), key=jax.random.key(0))
        np.testing.assert_array_equal(np.asarray(start), [3.0, 0.0, 5.0, 0.0])
