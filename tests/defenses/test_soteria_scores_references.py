"""Checks of Soteria (paper 003 §4.2, Alg 1–2; module docstrings).

Expected values are derived by hand (closed forms of a tanh layer's Jacobian,
the scores' definitions), never read off the code under test.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from defenses.soteria import jacobian_row_norms, perturb_representation, soteria_gradient
from fedsim.hooks import DefenseContext
from fedsim.models import make_apply_fn


def test_exact_score_prunes_a_feature_with_zero_jacobian_first():
    """Kills the ``+inf`` priority of rᵢ ≠ 0 with ‖∇_X rᵢ‖ = 0 replaced by 0.

    Reference (Eq 8, q = 0, p = 2): the score ‖rᵢ(∇_X fᵢ)⁻¹‖ = |rᵢ|/‖∇_X rᵢ‖ is
    unbounded for ‖∇_X rᵢ‖ → 0 with rᵢ ≠ 0, so that feature has the largest score;
    scores [1, 2, ∞, 4] with ε = round(0.25·4) = 1 zero feature 2.
    """
    r = jnp.array([[1.0, 2.0, 3.0, 4.0]])
    gn = jnp.array([[1.0, 1.0, 0.0, 1.0]])
    r_prime, keep = perturb_representation(r, gn, 0.25, score="exact")
    np.testing.assert_array_equal(np.asarray(keep), [[1.0, 1.0, 0.0, 1.0]])
    np.testing.assert_array_equal(np.asarray(r_prime), [[1.0, 2.0, 0.0, 4.0]])


def test_code_score_prunes_a_negative_feature_first():
    """Kills ``jnp.where(r > 0, ...)`` (negative features never pruned) in the code score.

    Reference (module docstring; authors' ``deviation_f1_x_norm``): the code zeroes
    the smallest signed ratios ‖∇_X rᵢ‖/rᵢ; with unit norms and r = [1, −2, 3, 4]
    the ratios are [1, −½, ⅓, ¼], so ε = 1 zeroes feature 1 and ε = 2 features 1, 3.
    """
    r = jnp.array([[1.0, -2.0, 3.0, 4.0]])
    gn = jnp.ones_like(r)
    ratio = np.asarray(gn / r)[0]
    for p_fc, eps in ((0.25, 1), (0.5, 2)):
        expected = np.ones(4, np.float32)
        expected[np.argsort(ratio)[:eps]] = 0.0
        _, keep = perturb_representation(r, gn, p_fc, score="code")
        np.testing.assert_array_equal(np.asarray(keep)[0], expected)
    assert np.argsort(ratio)[0] == 1


def test_code_score_batch_scope_ignores_a_zero_padding_row():
    """Kills ``never = any(~finite)`` (padding rows' rᵢ = 0 block every feature).

    Reference (module docstring): in batch scope a feature is never pruned when
    it is 0 in a REAL example; padding rows do not count. Only row 0 is real:
    ratios [1, ½, ⅓], so ε = 1 zeroes feature 2; the all-zero padding row must not
    stop it.
    """
    r = jnp.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    gn = jnp.ones_like(r)
    _, keep = perturb_representation(r, gn, 1 / 3, score="code", scope="batch",
                                     example_mask=jnp.array([1.0, 0.0]))
    np.testing.assert_array_equal(np.asarray(keep), [[1.0, 1.0, 0.0]])


class _TanhNet(nn.Module):
    """x -> r = tanh(x A + a) -> logits = r W + w (the defended layer "fc")."""

    def setup(self):
        self.feat = nn.Dense(5, name="feat")
        self.fc = nn.Dense(3, name="fc")

    def __call__(self, x):
        return self.fc(jnp.tanh(self.feat(x.reshape(x.shape[0], -1))))


def _tanh_setup():
    model = _TanhNet()
    x = jax.random.normal(jax.random.key(1), (4, 6))
    params = model.init(jax.random.key(0), x)["params"]
    A = np.asarray(params["feat"]["kernel"], np.float64)
    a = np.asarray(params["feat"]["bias"], np.float64)
    r = np.tanh(np.asarray(x, np.float64) @ A + a)
    # ∂rᵢ/∂x = (1 − rᵢ²) A[:, i]: row norm (1 − rᵢ²)‖A[:, i]‖₂.
    norms = (1.0 - r ** 2) * np.linalg.norm(A, axis=0)[None, :]
    return model, params, x, norms


def test_row_norms_are_zero_on_padding_rows_and_closed_form_elsewhere():
    """Kills the cotangent ``.set(1.0)`` (padding rows not masked) in ``jacobian_row_norms``.

    Reference (docstring): with ``example_mask`` a padding row's norms are 0; a
    real row's are ‖∇_X rᵢ‖₂ = (1 − rᵢ²)‖A[:, i]‖₂ for r = tanh(xA + a), by hand.
    """
    model, params, x, norms = _tanh_setup()
    mask = jnp.array([1.0, 1.0, 0.0, 1.0])
    got = np.asarray(jacobian_row_norms(make_apply_fn(model), params, x, "fc",
                                        example_mask=mask))
    expected = norms * np.asarray(mask)[:, None]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_soteria_gradient_reports_zero_norms_on_padding_rows():
    """Kills ``jacobian_row_norms(...)`` called without ``example_mask`` in ``soteria_gradient``.

    Reference (``soteria_gradient`` docstring): ``info["grad_norm"]`` is
    ‖∇_X rᵢ‖ per real example and 0 on padding rows; closed form as above.
    """
    model, params, x, norms = _tanh_setup()
    mask = jnp.array([1.0, 0.0, 1.0, 1.0])
    y = jnp.array([0, 1, 2, 1])
    ctx = DefenseContext(params=params, x=x, y=y, mask=mask, apply_fn=make_apply_fn(model))
    grad = jax.tree_util.tree_map(jnp.zeros_like, params)
    _, info = soteria_gradient(grad, ctx, 0.4, layer="fc")
    np.testing.assert_allclose(np.asarray(info["grad_norm"]), norms * np.asarray(mask)[:, None],
                               rtol=1e-5, atol=1e-7)


def test_batch_scope_mask_in_soteria_gradient_ignores_padding_rows():
    """Kills ``perturb_representation(...)`` called without ``example_mask`` in ``soteria_gradient``.

    Reference (Alg 1 with the authors' batch scope; ``perturb_representation``
    docstring: batch pooling ignores padding): the exact score |rᵢ|/‖∇_X rᵢ‖ summed
    over the REAL examples, r = tanh(xA + a) and ‖∇_X rᵢ‖ = (1 − rᵢ²)‖A[:, i]‖ by
    hand, and the round(0.4·5) = 2 largest sums zeroed for every example. The
    padding row is scaled up so that tanh saturates: counted, its huge scores
    would decide the two features.
    """
    model, params, x, _ = _tanh_setup()
    x = x.at[1].multiply(6.0)  # the padding row
    mask = jnp.array([1.0, 0.0, 1.0, 1.0])
    A = np.asarray(params["feat"]["kernel"], np.float64)
    a = np.asarray(params["feat"]["bias"], np.float64)
    r = np.tanh(np.asarray(x, np.float64) @ A + a)
    score = np.abs(r) / ((1.0 - r ** 2) * np.linalg.norm(A, axis=0)[None, :])
    real = np.asarray(mask) > 0
    expected = np.ones(5, np.float32)
    expected[np.argsort(-score[real].sum(axis=0))[:2]] = 0.0
    with_padding = np.ones(5, np.float32)
    with_padding[np.argsort(-score.sum(axis=0))[:2]] = 0.0
    assert not np.array_equal(expected, with_padding)  # the padding row would matter
    ctx = DefenseContext(params=params, x=x, y=jnp.array([0, 1, 2, 1]), mask=mask,
                         apply_fn=make_apply_fn(model))
    grad = jax.tree_util.tree_map(jnp.zeros_like, params)
    _, info = soteria_gradient(grad, ctx, 0.4, layer="fc", scope="batch")
    np.testing.assert_array_equal(np.asarray(info["keep"]).reshape(-1), expected)
    np.testing.assert_allclose(np.asarray(info["r_prime"]), r * expected[None, :],
                               rtol=1e-5, atol=1e-6)
