"""Soteria (paper 003): exact gradient replacement, scores, bound, contract."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from defenses.soteria import (certified_bound, jacobian_row_norms, perturb_representation,
                              representation, representation_jacobian, soteria_gradient)
from fedsim.client import cross_entropy, masked_mean_loss
from fedsim.hooks import DefenseContext, build_defense
from fedsim.models import build_model, init_params, make_apply_fn


class _Explicit(nn.Module):
    """A model whose representation is reachable independently (``features``).

    The defended layer "Dense_0" is NOT the last layer, to test the general
    ∂l/∂b (b = output of the defended layer, followed by tanh and a head).
    """

    def setup(self):
        self.conv = nn.Conv(3, (3, 3))
        self.fc = nn.Dense(7, name="Dense_0")
        self.head = nn.Dense(4)

    def features(self, x):
        return jnp.tanh(self.conv(x)).reshape(x.shape[0], -1)

    def __call__(self, x):
        return self.head(jnp.tanh(self.fc(self.features(x))))


def _explicit_setup(B=5):
    model = _Explicit()
    x = jax.random.normal(jax.random.key(1), (B, 4, 4, 1))
    params = model.init(jax.random.key(0), x)["params"]
    y = jax.random.randint(jax.random.key(2), (B,), 0, 4)
    mask = jnp.array([1.0] * (B - 1) + [0.0])  # last row is padding
    return model, params, make_apply_fn(model), x, y, mask


def _lenet_setup(B=3, size=16):
    model = build_model("lenet")
    params = init_params(model, (size, size, 1), jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (B, size, size, 1))
    y = jnp.arange(B) % 10
    return params, make_apply_fn(model), x, y, jnp.ones((B,))


def _ctx(params, apply_fn, x, y, mask):
    return DefenseContext(params=params, x=x, y=y, mask=mask, apply_fn=apply_fn)


@pytest.mark.parametrize("score,scope", [("exact", "example"), ("code", "batch"),
                                         ("exact", "batch"), ("code", "example")])
def test_defended_kernel_gradient_is_dldb_times_r_prime(score, scope):
    model, params, apply_fn, x, y, mask = _explicit_setup()
    grad = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
    new, info = soteria_gradient(grad, _ctx(params, apply_fn, x, y, mask), 0.4,
                                 score=score, scope=scope)
    # Independent pieces: r from the model's own features method, per-example
    # ∂l_j/∂b_j from per-example gradients w.r.t. the layer's bias.
    r = model.apply({"params": params}, x, method=_Explicit.features)
    chex.assert_trees_all_close(info["r"], r, atol=1e-6)

    def loss_one(p, xj, yj):
        return cross_entropy(apply_fn(p, xj[None]), yj[None])[0]

    per_ex = jax.vmap(jax.grad(loss_one), in_axes=(None, 0, 0))(params, x, y)
    dldb = per_ex["Dense_0"]["bias"]  # [B, 7]
    w = mask / jnp.sum(mask)
    r_prime = r * info["keep"]
    expected = jnp.einsum("j,ji,jk->ik", w, r_prime, dldb)
    chex.assert_trees_all_close(new["Dense_0"]["kernel"], expected, atol=1e-6)
    # Exactly round(0.4 * 48) = 19 features zeroed per (example | batch).
    assert np.all(np.sum(np.asarray(info["keep"]) == 0, axis=-1) == 19)
    # Every other leaf (including the defended layer's bias) is untouched.
    for path in (("conv", "kernel"), ("conv", "bias"), ("Dense_0", "bias"),
                 ("head", "kernel"), ("head", "bias")):
        np.testing.assert_array_equal(new[path[0]][path[1]], grad[path[0]][path[1]])


@pytest.mark.slow
def test_zero_rate_returns_clean_gradient_on_lenet():
    params, apply_fn, x, y, mask = _lenet_setup()
    grad = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
    new, info = soteria_gradient(grad, _ctx(params, apply_fn, x, y, mask), 0.0)
    chex.assert_trees_all_close(new, grad, atol=1e-6)
    assert np.all(np.asarray(info["keep"]) == 1)


def test_exact_score_matches_pseudo_inverse_per_feature():
    # Paper: zero the ε largest ‖rᵢ (∇_X fᵢ)⁻¹‖₂ — checked with numpy pinv,
    # gradients of each feature taken one backward pass at a time.
    model, params, apply_fn, x, y, mask = _explicit_setup(B=2)
    feat = lambda v: model.apply({"params": params}, v[None], method=_Explicit.features)[0]
    r = np.asarray(feat(x[0]))
    scores = []
    for i in range(r.size):
        g = np.asarray(jax.grad(lambda v: feat(v)[i])(x[0])).reshape(1, -1)
        scores.append(np.linalg.norm(r[i] * np.linalg.pinv(g)))
    jac = representation_jacobian(apply_fn, params, x, ("Dense_0",))
    assert jac.shape == (2, 48, 16)
    gn = jnp.sqrt(jnp.sum(jac ** 2, -1))
    _, keep = perturb_representation(representation(apply_fn, params, x, ("Dense_0",)), gn,
                                     0.25, score="exact", scope="example")
    k = 12
    expected_pruned = set(np.argsort(-np.asarray(scores))[:k].tolist())
    assert set(np.flatnonzero(np.asarray(keep[0]) == 0).tolist()) == expected_pruned


def test_code_score_matches_authors_percentile_rule():
    # Authors' code: s = Σ_batch ‖∇rᵢ‖/rᵢ, zero s below the percentile.
    rng = np.random.default_rng(0)
    r = rng.uniform(0.1, 1.0, (3, 40)).astype(np.float32)
    gn = rng.uniform(0.1, 1.0, (3, 40)).astype(np.float32)
    s = (gn / r).sum(0)
    thresh = np.percentile(s, 30)
    ref_pruned = np.flatnonzero(s < thresh)
    _, keep = perturb_representation(jnp.asarray(r), jnp.asarray(gn), len(ref_pruned) / 40,
                                     score="code", scope="batch")
    np.testing.assert_array_equal(np.flatnonzero(np.asarray(keep[0]) == 0), ref_pruned)


def test_scores_agree_on_nonnegative_representations_and_ignore_zero_features():
    rng = np.random.default_rng(1)
    r = rng.uniform(0.0, 1.0, (1, 30)).astype(np.float32)
    r[0, :5] = 0.0  # features that are already 0 are never chosen
    gn = rng.uniform(0.1, 1.0, (1, 30)).astype(np.float32)
    _, k_exact = perturb_representation(jnp.asarray(r), jnp.asarray(gn), 0.5, score="exact")
    _, k_code = perturb_representation(jnp.asarray(r), jnp.asarray(gn), 0.5, score="code")
    np.testing.assert_array_equal(k_exact, k_code)
    assert np.all(np.asarray(k_exact)[0, :5] == 1)


def test_batch_scope_ignores_padding_rows():
    r = jnp.array([[1.0, 2.0, 3.0], [100.0, 0.1, 0.1]])
    gn = jnp.ones_like(r)
    _, keep = perturb_representation(r, gn, 1 / 3, scope="batch",
                                     example_mask=jnp.array([1.0, 0.0]))
    np.testing.assert_array_equal(keep, [[1.0, 1.0, 0.0]])


def test_code_score_never_prunes_a_zero_feature_even_past_the_prunable_count():
    """score="code": a feature with rᵢ = 0 (batch scope: in any example) is never pruned,
    also when ε = round(p_fc·L) exceeds the prunable features: only those are zeroed."""
    r = jnp.array([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 3.0, 4.0]])  # ε = 3, 2 prunable
    gn = jnp.ones_like(r)
    rp, keep = perturb_representation(r, gn, 0.75, score="code", scope="batch")
    np.testing.assert_array_equal(keep, [[1.0, 1.0, 0.0, 0.0]])
    np.testing.assert_array_equal(rp[0], [1.0, 2.0, 0.0, 0.0])  # example 0 keeps r_0, r_1
    _, keep_ex = perturb_representation(r, gn, 0.75, score="code", scope="example")
    np.testing.assert_array_equal(keep_ex, [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    _, keep_jit = jax.jit(lambda a: perturb_representation(a, gn, 0.75, score="code",
                                                           scope="batch"))(r)
    np.testing.assert_array_equal(keep_jit, keep)


@pytest.mark.parametrize("p_fc", [1.7, -0.3, float("nan"), "a"])
def test_perturb_representation_and_soteria_gradient_reject_a_bad_rate(p_fc):
    r = jnp.ones((2, 4))
    with pytest.raises(ValueError, match="p_fc"):
        perturb_representation(r, r, p_fc)
    _, params, apply_fn, x, y, mask = _explicit_setup(B=2)
    grad = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
    with pytest.raises(ValueError, match="p_fc"):
        soteria_gradient(grad, _ctx(params, apply_fn, x, y, mask), p_fc)


def test_a_traced_rate_is_named_and_a_closed_over_one_works_under_jit():
    r = jnp.array([[1.0, 2.0, 3.0, 4.0]])
    with pytest.raises(ValueError, match="p_fc .*traced"):
        jax.jit(lambda p: perturb_representation(r, r, p))(0.5)
    _, keep = jax.jit(lambda a: perturb_representation(a, jnp.ones_like(a), 0.5))(r)
    np.testing.assert_array_equal(keep, [[1.0, 1.0, 0.0, 0.0]])


def _check_contract(params, apply_fn, x, y, mask, layer):
    grad = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
    d = build_defense("soteria", p_fc=0.3, layer=layer)
    assert d.stage == "layer"
    state = d.init(params)
    ctx = _ctx(params, apply_fn, x, y, mask)
    out, st = d.apply(grad, state, key=jax.random.key(0), context=ctx)
    out_jit, st_jit = jax.jit(lambda g: d.apply(g, state, key=jax.random.key(0), context=ctx))(grad)
    chex.assert_trees_all_close(out, out_jit, atol=1e-6)
    chex.assert_trees_all_equal_shapes_and_dtypes(out, grad)
    chex.assert_tree_all_finite(out)
    assert st == state == st_jit
    # Deterministic by design (Alg 1 has no randomness): any key, same output.
    out2, _ = d.apply(grad, state, key=jax.random.key(123), context=ctx)
    chex.assert_trees_all_close(out, out2, atol=0)
    # Pure: a second call on the same inputs gives the same result.
    out3, _ = d.apply(grad, state, key=jax.random.key(0), context=ctx)
    chex.assert_trees_all_close(out, out3, atol=0)
    assert not np.allclose(out[layer]["kernel"], grad[layer]["kernel"])


def test_defense_contract():
    _, params, apply_fn, x, y, mask = _explicit_setup()
    _check_contract(params, apply_fn, x, y, mask, "Dense_0")


@pytest.mark.slow
def test_defense_contract_lenet():
    _check_contract(*_lenet_setup(B=2), "Dense_0")


def test_certified_bound_matches_numpy_svd():
    model, params, apply_fn, x, y, mask = _explicit_setup(B=2)
    r = representation(apply_fn, params, x, ("Dense_0",))
    r_prime = r.at[:, :10].set(0.0)
    bound = certified_bound(apply_fn, params, x, r_prime)
    feat = lambda v: model.apply({"params": params}, v[None], method=_Explicit.features)[0]
    for j in range(2):
        jac = np.asarray(jax.jacfwd(feat)(x[j])).reshape(48, -1)
        ref = np.linalg.norm(np.asarray(r[j] - r_prime[j])) / np.linalg.svd(jac, compute_uv=False)[0]
        np.testing.assert_allclose(float(bound[j]), ref, rtol=1e-4)
    fro = certified_bound(apply_fn, params, x, r_prime, norm="frobenius")
    assert np.all(np.asarray(fro) <= np.asarray(bound) + 1e-7)
    np.testing.assert_allclose(certified_bound(apply_fn, params, x, r), 0.0)


@pytest.mark.parametrize("kwargs,match", [
    ({"p_fc": 1.5}, "p_fc"), ({"p_fc": "a"}, "p_fc"), ({"p_fc": 0.1, "score": "x"}, "score"),
    ({"p_fc": 0.1, "scope": "x"}, "scope"), ({"p_fc": 0.1, "layer": ""}, "layer"),
    ({"p_fc": 0.1, "jacobian": "x"}, "jacobian")])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_defense("soteria", **kwargs)


def test_bad_layer_path_is_named():
    _, params, apply_fn, x, y, mask = _explicit_setup(B=2)
    grad = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
    d = build_defense("soteria", p_fc=0.1, layer="Dense_7")
    with pytest.raises(ValueError, match="Dense_7"):
        d.apply(grad, (), key=jax.random.key(0), context=_ctx(params, apply_fn, x, y, mask))
    d = build_defense("soteria", p_fc=0.1, layer="conv")
    with pytest.raises(ValueError, match="not a fully connected"):
        d.apply(grad, (), key=jax.random.key(0), context=_ctx(params, apply_fn, x, y, mask))


def test_labels_or_a_mask_not_one_per_example_are_refused_by_name():
    # Before: one-hot y failed in optax's dtype check, a y or mask of another
    # length in a broadcast, neither naming the context's field.
    _, params, apply_fn, x, y, mask = _explicit_setup(B=4)
    grad = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
    d = build_defense("soteria", p_fc=0.5)
    for bad_y in (jax.nn.one_hot(y, 10), y[:2], y.astype(jnp.float32)):
        with pytest.raises(ValueError, match=r"soteria: context.y must be the batch's integer "
                                             r"class labels, shape \(4,\)"):
            d.apply(grad, (), key=jax.random.key(0),
                    context=_ctx(params, apply_fn, x, bad_y, mask))
    with pytest.raises(ValueError, match=r"soteria: context.mask must have shape \(4,\)"):
        d.apply(grad, (), key=jax.random.key(0), context=_ctx(params, apply_fn, x, y, mask[:1]))


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_batched_jacobian_equals_per_example_jacrev(chunk):
    # The batched VJP relies on examples not interacting in the forward pass;
    # it must give the per-example jacrev rows exactly (up to float rounding).
    model, params, apply_fn, x, y, mask = _explicit_setup(B=4)
    per = representation_jacobian(apply_fn, params, x, ("Dense_0",), 2, "per_example")
    bat = representation_jacobian(apply_fn, params, x, ("Dense_0",), chunk, "batched")
    assert bat.shape == per.shape == (4, 48, 16)
    chex.assert_trees_all_close(bat, per, atol=1e-6)
    norms = jacobian_row_norms(apply_fn, params, x, ("Dense_0",), chunk, "batched")
    chex.assert_trees_all_close(norms, jnp.sqrt(jnp.sum(per ** 2, -1)), atol=1e-6)
    # The example mask leaves a real row's norm as it is (examples do not interact
    # here) and gives padding 0 (tests/fedsim/test_batch_norm.py: where they do).
    masked = jacobian_row_norms(apply_fn, params, x, ("Dense_0",), chunk, "batched",
                                example_mask=mask)
    np.testing.assert_array_equal(masked[:3], norms[:3])
    np.testing.assert_array_equal(masked[3], 0.0)
    if chunk == 1:  # a mask of another length is named, not broadcast
        with pytest.raises(ValueError, match=r"example_mask must have shape \(4,\).*got \(3,\)"):
            jacobian_row_norms(apply_fn, params, x, ("Dense_0",), chunk, "batched",
                               example_mask=mask[:3])
    grad = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
    ctx = _ctx(params, apply_fn, x, y, mask)
    g_per, _ = soteria_gradient(grad, ctx, 0.4, jacobian="per_example")
    g_bat, _ = soteria_gradient(grad, ctx, 0.4, jacobian="batched", chunk=chunk)
    chex.assert_trees_all_close(g_per, g_bat, atol=1e-6)


class _LogReg(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(x.reshape(x.shape[0], -1))


def test_logistic_regression_prunes_the_largest_inputs():
    # Fig 7 case: the defended layer is the only layer and r = X, so ∇_X rᵢ
    # is the unit vector eᵢ and the exact score |rᵢ|/1 zeroes the largest
    # |xᵢ| per example; the kernel gradient is x′ ⊗ ∂l/∂b.
    model = _LogReg()
    x = jax.random.normal(jax.random.key(3), (3, 2, 5, 1))
    params = model.init(jax.random.key(0), x)["params"]
    apply_fn = make_apply_fn(model)
    y = jnp.array([0, 2, 1])
    mask = jnp.ones(3)
    grad = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
    norms = jacobian_row_norms(apply_fn, params, x, ("Dense_0",))
    np.testing.assert_allclose(norms, 1.0, atol=1e-6)
    new, info = soteria_gradient(grad, _ctx(params, apply_fn, x, y, mask), 0.3)
    flat = np.abs(np.asarray(x).reshape(3, -1))
    for j in range(3):
        assert set(np.flatnonzero(np.asarray(info["keep"][j]) == 0)) == set(
            np.argsort(-flat[j])[:3].tolist())
    dldb = jax.nn.softmax(apply_fn(params, x)) - jax.nn.one_hot(y, 3)
    expected = (np.asarray(x).reshape(3, -1) * np.asarray(info["keep"])).T @ np.asarray(dldb) / 3
    np.testing.assert_allclose(new["Dense_0"]["kernel"], expected, atol=1e-6)


def test_sketched_norms_estimate_the_exact_norms():
    # The sketch is unbiased for ‖∇_X rᵢ‖²: with many probes it is close to
    # the exact norms; with few it is noisy (that is why it is opt-in).
    model, params, apply_fn, x, y, mask = _explicit_setup(B=3)
    exact = jacobian_row_norms(apply_fn, params, x, ("Dense_0",))
    many = jacobian_row_norms(apply_fn, params, x, ("Dense_0",), 64, "sketch",
                              key=jax.random.key(0), probes=4096)
    np.testing.assert_allclose(many, exact, rtol=0.1)
    few = jacobian_row_norms(apply_fn, params, x, ("Dense_0",), 8, "sketch",
                             key=jax.random.key(1), probes=4)
    assert few.shape == exact.shape and not np.allclose(few, exact, rtol=0.01)
    with pytest.raises(ValueError, match="key"):
        jacobian_row_norms(apply_fn, params, x, ("Dense_0",), method="sketch")
    d = build_defense("soteria", p_fc=0.3, jacobian="sketch", probes=8)
    grad = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
    out, _ = d.apply(grad, (), key=jax.random.key(2), context=_ctx(params, apply_fn, x, y, mask))
    chex.assert_tree_all_finite(out)
    np.testing.assert_array_equal(out["conv"]["kernel"], grad["conv"]["kernel"])


def test_only_the_batched_jacobian_is_defined_under_batch_statistics():
    from fedsim.hooks import chain, identity

    assert build_defense("soteria", p_fc=0.1).batch_statistics
    assert not build_defense("soteria", p_fc=0.1, jacobian="per_example").batch_statistics
    sketch = build_defense("soteria", p_fc=0.1, jacobian="sketch")
    assert not sketch.batch_statistics
    # A chain is defined there only where each of its parts is.
    assert chain(build_defense("soteria", p_fc=0.1), identity("layer")).batch_statistics
    assert not chain(sketch, identity("layer")).batch_statistics


def test_soteria_beside_an_example_stage_defense_is_refused():
    """Soteria rebuilds the FC kernel's gradient from the raw batch, so after
    DP-SGD (stage "example") that layer would be released unclipped and
    noise-free while the accountant still reported ε: refused, naming both."""
    from fedsim.client import LocalTraining, make_client_update
    from fedsim.config import ConfigError
    from fedsim.simulation import build_defenses

    specs = [{"name": "dp_gaussian", "noise_multiplier": 1.0, "clip_norm": 1.0},
             {"name": "soteria", "p_fc": 0.2}]
    with pytest.raises(ConfigError, match=r"'defenses'.*soteria.*dp_gaussian"):
        build_defenses(specs)
    # The same pair handed to the client update directly (no config).
    built = {"example": build_defense(**specs[0]), "layer": build_defense(**specs[1])}
    import optax
    with pytest.raises(ValueError, match="soteria.*discarding"):
        make_client_update(lambda p, x: x, optax.sgd(0.1), LocalTraining("fedavg", 1, 4, 8), built)
    # Chained at stage "layer": Soteria first is fine, after another defense it is not.
    from fedsim.hooks import chain
    noise = build_defense("update_gaussian", sigma=1e-3)._replace(stage="layer")
    assert chain(built["layer"], noise).discards_example_stage
    with pytest.raises(ValueError, match="put it first"):
        chain(noise, built["layer"])
    # Each alone is accepted.
    assert set(build_defenses(specs[1:])) == {"layer"}
    assert set(build_defenses(specs[:1])) == {"example"}


def test_layer_path_may_be_a_string():
    """representation / jacobian_row_norms take "Dense_0" as well as ("Dense_0",);
    a string used to be read as a tuple of one-letter module names."""
    from defenses.soteria import jacobian_row_norms
    _, params, apply_fn, x, _, _ = _explicit_setup(B=2)
    np.testing.assert_array_equal(representation(apply_fn, params, x, "Dense_0"),
                                  representation(apply_fn, params, x, ("Dense_0",)))
    np.testing.assert_array_equal(jacobian_row_norms(apply_fn, params, x, "Dense_0"),
                                  jacobian_row_norms(apply_fn, params, x, ("Dense_0",)))
    with pytest.raises(ValueError, match="'Dense_9' was called 0 times"):
        representation(apply_fn, params, x, "Dense_9")
