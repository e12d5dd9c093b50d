"""The attacks' formulas against independent closed forms.

Each test recomputes what a module docstring (or the paper it cites) states,
written here from that statement, and compares with the code:

* SSIM (attacks/metrics.py): Wang et al. 2004 in numpy;
* count-based label inference (attacks/labels.py): n_c = B·(s_c − b_c)/(a_c − b_c)
  with a_c = mean ‖h‖₁(p_c − 1), b_c = mean ‖h‖₁ p_c;
* the gradient-matching losses (attacks/gradient_inversion.py): DLG's Σ‖g − t‖²
  and Geiping et al.'s whole-vector cosine;
* Soteria's Alg. 4 (attacks/representation.py): the M largest-|b′| rows.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attacks import gradient_inversion as GI
from attacks import labels as L
from attacks import metrics as M
from attacks import representation as R

# ---------------------------------------------------------------- SSIM


def _gaussian_window(size: int, sigma: float = 1.5) -> np.ndarray:
    """2-D Gaussian window of side ``size`` centred on its middle, summing to 1."""
    t = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
    g = np.exp(-0.5 * (t / sigma) ** 2)
    w = np.outer(g, g)
    return w / w.sum()


def _filter_valid(img: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted local means of a 2-D image, valid positions only (no padding)."""
    win = np.lib.stride_tricks.sliding_window_view(img, w.shape)
    return np.einsum("ijkl,kl->ij", win, w)


def _ssim_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """SSIM of Wang et al. (2004), as attacks/metrics.py's docstring states it.

    11×11 Gaussian window σ = 1.5 (the image's side when smaller), no padding,
    C1 = (0.01·L)², C2 = (0.03·L)², L = 1; the SSIM map's mean over positions,
    then over channels. Written in float64 numpy, independent of dm-pix.
    """
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    h, wdt, ch = x.shape[-3:]
    w = _gaussian_window(min(11, h, wdt))
    flat_x = x.reshape(-1, h, wdt, ch)
    flat_y = y.reshape(-1, h, wdt, ch)
    out = np.zeros(flat_x.shape[0])
    for n in range(flat_x.shape[0]):
        per_channel = []
        for c in range(ch):
            a, b = flat_x[n, :, :, c], flat_y[n, :, :, c]
            mu_a, mu_b = _filter_valid(a, w), _filter_valid(b, w)
            var_a = _filter_valid(a * a, w) - mu_a ** 2
            var_b = _filter_valid(b * b, w) - mu_b ** 2
            cov = _filter_valid(a * b, w) - mu_a * mu_b
            smap = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)
                    / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2)))
            per_channel.append(smap.mean())
        out[n] = np.mean(per_channel)
    return out.reshape(x.shape[:-3])


@pytest.mark.parametrize("shape", [(3, 16, 16, 1), (2, 24, 24, 3), (2, 9, 9, 1), (1, 10, 12, 2)])
def test_ssim_matches_a_numpy_wang_2004_ssim(shape):
    # Compared to: _ssim_reference, Wang et al. 2004 written in numpy from the
    # metrics docstring (11×11 Gaussian σ 1.5, window = image side if smaller).
    rng = np.random.default_rng(sum(shape))
    x = rng.random(shape).astype(np.float32)
    # Correlated second image so SSIM is far from 0 and the window matters.
    y = np.clip(x + 0.25 * rng.standard_normal(shape), 0, 1).astype(np.float32)
    got = M.ssim(x, y)
    want = _ssim_reference(x, y)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    # Unrelated pair too.
    z = rng.random(shape).astype(np.float32)
    np.testing.assert_allclose(M.ssim(x, z), _ssim_reference(x, z), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- label counts


def _ce(logits, y):
    """Mean softmax cross-entropy with integer labels (written here, not fedsim's)."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))


def _two_layer(num_in, hidden, num_classes, seed, out_scale, bias):
    """ReLU hidden layer (non-negative features h) then a Dense last layer."""
    rng = np.random.default_rng(seed)
    first = rng.standard_normal((num_in, hidden)) / np.sqrt(num_in)
    params = {"hidden": {"kernel": jnp.asarray(first, jnp.float32),
                         "bias": jnp.asarray(0.1 * rng.standard_normal(hidden), jnp.float32)},
              "out": {"kernel": jnp.asarray(out_scale * rng.standard_normal((hidden, num_classes)),
                                            jnp.float32)}}
    if bias:
        params["out"]["bias"] = jnp.asarray(out_scale * rng.standard_normal(num_classes),
                                            jnp.float32)

    def apply_fn(p, x):
        h = jax.nn.relu(x.reshape(x.shape[0], -1) @ p["hidden"]["kernel"] + p["hidden"]["bias"])
        out = h @ p["out"]["kernel"]
        return out + p["out"]["bias"] if "bias" in p["out"] else out

    return apply_fn, params


@pytest.mark.parametrize("out_scale", [0.0, 1e-4])
def test_count_inference_is_exact_on_a_near_uniform_softmax(out_scale):
    # Compared to: the true multiset. With the last layer's weights ~0 every
    # example has p = 1/K, so the bias gradient is s_c = 1/K − n_c/B and the
    # docstring's a_c = 1/K − 1, b_c = 1/K give B(s_c − b_c)/(a_c − b_c) = n_c
    # exactly: the rule must return the counts {3: 4, 7: 3, 1: 1} themselves.
    apply_fn, params = _two_layer(16, 12, 10, seed=0, out_scale=out_scale, bias=True)
    y = jnp.asarray([3, 7, 3, 1, 3, 7, 3, 7], jnp.int32)
    x = jnp.asarray(np.random.default_rng(1).random((8, 4, 4, 1)), jnp.float32)
    grad = jax.grad(lambda p: _ce(apply_fn(p, x), y))(params)
    counts = L.infer_label_counts(grad, apply_fn, params, 8, (4, 4, 1), 10, jax.random.key(0),
                                  num_dummy=16)
    want = np.bincount(np.asarray(y), minlength=10)
    np.testing.assert_array_equal(counts, want)


def test_count_inference_estimate_on_a_handmade_signal():
    # Compared to: n_c = B·(s_c − b_c)/(a_c − b_c) by hand for a bias-free last
    # layer with zero kernel (p = 1/K for every input, h ≥ 0). The signal
    # s_c = ‖h‖(1/K − n_c/B) is built for a victim whose ‖h‖ equals the dummies'
    # mean, so the estimate is n_c exactly, for a batch of 12 with counts
    # {0: 6, 4: 3, 2: 2, 5: 1}.
    apply_fn, params = _two_layer(16, 12, 6, seed=3, out_scale=0.0, bias=False)
    a, b = (np.asarray(v, np.float64) for v in
            L._impacts(apply_fn, params, (4, 4, 1), 6, jax.random.key(5), 32, None))
    hbar = float(b.sum())  # Σ_c ‖h‖ p_c = mean ‖h‖
    n = np.array([6, 0, 2, 0, 3, 1])
    s = hbar * (1 / 6 - n / 12)
    grad = {"hidden": {"kernel": jnp.zeros((16, 12))},
            "out": {"kernel": jnp.asarray(np.outer(np.full(12, 1 / 12), s), jnp.float32)}}
    counts = L.infer_label_counts(grad, apply_fn, params, 12, (4, 4, 1), 6, jax.random.key(5),
                                  num_dummy=32)
    np.testing.assert_array_equal(counts, n)


@pytest.mark.parametrize("bias", [False, True])
def test_impacts_match_their_closed_form_for_input_free_features(bias):
    # Compared to: the docstring's a_c = ‖h‖₁(p_c − 1), b_c = ‖h‖₁·p_c (kernel
    # column sums) or a_c = p_c − 1, b_c = p_c (bias gradient), computed in
    # numpy for a model whose features h₀ and so p = softmax(h₀W + β) are the
    # same for every dummy input.
    rng = np.random.default_rng(7)
    h0 = rng.random(5) + 0.1
    kernel = rng.standard_normal((5, 4))
    beta = rng.standard_normal(4) if bias else np.zeros(4)
    params = {"out": {"kernel": jnp.asarray(kernel, jnp.float32)}}
    if bias:
        params["out"]["bias"] = jnp.asarray(beta, jnp.float32)

    def apply_fn(p, x):
        h = jnp.asarray(h0, jnp.float32)[None] + 0.0 * x.reshape(x.shape[0], -1)[:, :1]
        out = h @ p["out"]["kernel"]
        return out + p["out"]["bias"] if "bias" in p["out"] else out

    logits = h0 @ kernel + beta
    p = np.exp(logits - logits.max())
    p /= p.sum()
    scale = 1.0 if bias else h0.sum()
    a, b = L._impacts(apply_fn, params, (3, 3, 1), 4, jax.random.key(0), 8, None)
    np.testing.assert_allclose(np.asarray(a), scale * (p - 1.0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(b), scale * p, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bias", [False, True])
def test_impacts_obey_the_closed_form_identities_on_noise(bias):
    # Compared to: identities of a_c = mean ‖hᵢ‖₁(p_ic − 1), b_c = mean ‖hᵢ‖₁ p_ic
    # (labels.py docstring) that hold for any dummies: b_c − a_c = mean ‖h‖₁ for
    # every c, and Σ_c b_c = mean ‖h‖₁ (Σ_c p_ic = 1). With a bias the factor
    # ‖h‖₁ is 1. ReLU features keep h ≥ 0, so column sums are ‖h‖₁(p − e_y).
    apply_fn, params = _two_layer(9, 7, 5, seed=11, out_scale=1.0, bias=bias)
    a, b = (np.asarray(v, np.float64) for v in
            L._impacts(apply_fn, params, (3, 3, 1), 5, jax.random.key(4), 16, None))
    hbar = b.sum()
    if bias:
        assert hbar == pytest.approx(1.0, rel=1e-5)
    assert hbar > 0.1
    np.testing.assert_allclose(b - a, np.full(5, hbar), rtol=1e-5)


# ---------------------------------------------------------------- matching losses


def _tree(rng, scale=1.0):
    return {"conv": {"kernel": jnp.asarray(scale * rng.standard_normal((3, 3, 1, 2)), jnp.float32),
                     "bias": jnp.asarray(scale * rng.standard_normal(2), jnp.float32)},
            "dense": {"kernel": jnp.asarray(scale * rng.standard_normal((5, 4)), jnp.float32)}}


def _flat(tree):
    return np.concatenate([np.asarray(v, np.float64).ravel()
                           for v in jax.tree_util.tree_leaves(tree)])


@pytest.mark.parametrize("seed", [0, 1])
def test_matching_losses_match_numpy(seed):
    # Compared to: numpy on the flattened pytrees, from the module docstring:
    # "l2" = Σ‖g − t‖² (DLG Eq. 4), "cosine" = 1 − ⟨g, t⟩/(‖g‖‖t‖) over all
    # layers jointly (Geiping et al. 2020 Eq. 4).
    rng = np.random.default_rng(seed)
    g, t = _tree(rng), _tree(rng, scale=0.5)
    fg, ft = _flat(g), _flat(t)
    l2 = np.sum((fg - ft) ** 2)
    cos = 1.0 - fg @ ft / (np.linalg.norm(fg) * np.linalg.norm(ft))
    assert float(GI.matching_loss(g, t, "l2")) == pytest.approx(l2, rel=1e-5)
    assert float(GI.matching_loss(g, t, "cosine")) == pytest.approx(cos, rel=1e-5, abs=1e-6)
    # Differences all inside (-1, 1): a squared loss is below the absolute one.
    small = jax.tree_util.tree_map(lambda v: v + 0.1, g)
    l2_small = np.sum((_flat(small) - fg) ** 2)
    assert float(GI.matching_loss(small, g, "l2")) == pytest.approx(l2_small, rel=1e-4)
    assert l2_small == pytest.approx(0.01 * fg.size, rel=1e-4)


# ---------------------------------------------------------------- Alg. 4


def test_alg4_takes_the_largest_magnitude_entries_negative_ones_included():
    # Compared to: Alg. 4 by hand (paper 003 App. A; representation.py
    # docstring): the M entries of b′ with the largest |b′_k|, here the two
    # negative ones (−5 and −3), and the sum of those columns of ∇W.
    kernel = np.arange(20, dtype=np.float64).reshape(4, 5)
    b = np.array([0.1, -5.0, 0.2, -3.0, 1.0])
    got = R.previous_layer_representation(kernel, b, 2)
    np.testing.assert_allclose(got, kernel[:, 1] + kernel[:, 3])
    got3 = R.previous_layer_representation(kernel, b, 3)
    np.testing.assert_allclose(got3, kernel[:, 1] + kernel[:, 3] + kernel[:, 4])


def test_infer_representations_chains_alg4_through_a_negative_label_row():
    # Compared to: Alg. 3 + Alg. 4 by hand. A gradient's label row is mostly
    # negative; the class-2 representation at the last layer's input is the
    # column last[:, 2] = [-4, 0.5, -6, 1], whose two largest magnitudes are at
    # 2 and 0, so the previous layer's r̂ = first[:, 2] + first[:, 0].
    rng = np.random.default_rng(0)
    first = rng.standard_normal((6, 4))
    last = rng.standard_normal((4, 3)) * 0.1
    last[:, 2] = [-4.0, 0.5, -6.0, 1.0]
    reps = R.infer_representations([first, last], num_top=2, classes=[2])
    np.testing.assert_allclose(reps[2][1], last[:, 2])
    np.testing.assert_allclose(reps[2][0], first[:, 2] + first[:, 0])
