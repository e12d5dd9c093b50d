"""fedsim.models against independent references: numpy forward passes written from
the papers' layer lists, BatchNorm's and GroupNorm's formulas by hand, and the
DLG / Soteria reference code's weight init.

Each numpy reference is float64 and built only from the layer list in the
module docstring / the papers (kernel, stride, padding, activation, pooling,
widths), never from the code under test: a convolution is a cross-correlation
over ``sliding_window_view`` windows, a max pool a reshape-and-max.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from fedsim.models import BatchNorm, LeNetDLG, build_model, init_params, make_apply_fn


def _np(a):
    return np.asarray(a, np.float64)


def _conv(x, layer, stride, pad):
    """Cross-correlation NHWC × HWIO (+ bias) with symmetric zero padding ``pad``."""
    k = _np(layer["kernel"])
    x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    win = sliding_window_view(x, k.shape[:2], axis=(1, 2))[:, ::stride, ::stride]
    out = np.einsum("nyxcij,ijco->nyxo", win, k)
    return out + _np(layer["bias"]) if "bias" in layer else out


def _dense(x, layer):
    out = x @ _np(layer["kernel"])
    return out + _np(layer["bias"]) if "bias" in layer else out


def _pool(x, k):
    n, h, w, c = x.shape
    h, w = h // k * k, w // k * k
    return x[:, :h, :w].reshape(n, h // k, k, w // k, k, c).max(axis=(2, 4))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _relu(x):
    return np.maximum(x, 0.0)


def _flat(x):
    return x.reshape(x.shape[0], -1)


# Each reference: (params, x) -> logits, from the layer list the docstring / paper gives.
def _mlp(p, x):
    """Paper 001 §VI: 256→50→15→10, sigmoid, no bias."""
    h = _sigmoid(_dense(_flat(x), p["Dense_0"]))
    h = _sigmoid(_dense(h, p["Dense_1"]))
    return _dense(h, p["Dense_2"])


def _lenet_dlg(p, x):
    """Zhu et al. 2019 / paper 003 §6: four 5×5 convs, 12 channels, padding 2,
    strides 2, 2, 1, 1, sigmoid after each; one FC layer."""
    for i, s in enumerate((2, 2, 1, 1)):
        x = _sigmoid(_conv(x, p[f"Conv_{i}"], s, 2))
    return _dense(_flat(x), p["Dense_0"])


def _lenet5(p, x):
    """ReLU LeNet-5 on 28×28: conv 6@5×5 (padded 2) → ReLU → pool 2, conv 16@5×5 →
    ReLU → pool 2, FC 120 → ReLU → 84 → ReLU → classes."""
    x = _pool(_relu(_conv(x, p["Conv_0"], 1, 2)), 2)
    x = _pool(_relu(_conv(x, p["Conv_1"], 1, 0)), 2)
    x = _relu(_dense(_flat(x), p["Dense_0"]))
    x = _relu(_dense(x, p["Dense_1"]))
    return _dense(x, p["Dense_2"])


def _convnet(p, x):
    """Geiping et al.'s ConvNet (inversefed): eight 3×3 convs, padding 1, ReLU, widths
    w, 2w, 2w, 4w, 4w, 4w, pool 3, 4w, 4w, pool 3, FC."""
    for i in range(6):
        x = _relu(_conv(x, p[f"Conv_{i}"], 1, 1))
    x = _pool(x, 3)
    for i in (6, 7):
        x = _relu(_conv(x, p[f"Conv_{i}"], 1, 1))
    return _dense(_flat(_pool(x, 3)), p["Dense_0"])


def _conv2(p, x):
    """LEAF FEMNIST CNN (paper 002 §6): conv 5×5·32 SAME, ReLU, pool 2, conv 5×5·64
    SAME, ReLU, pool 2, FC 2048 ReLU, FC classes."""
    x = _pool(_relu(_conv(x, p["Conv_0"], 1, 2)), 2)
    x = _pool(_relu(_conv(x, p["Conv_1"], 1, 2)), 2)
    return _dense(_relu(_dense(_flat(x), p["Dense_0"])), p["Dense_1"])


def _alexnet(p, x):
    """32×32 AlexNet: 3×3 convs 64 (stride 2), pool, 192, pool, 384, 256, 256, pool
    (padding 1, ReLU after each), FC 4096, 4096 (ReLU), classes."""
    x = _pool(_relu(_conv(x, p["Conv_0"], 2, 1)), 2)
    x = _pool(_relu(_conv(x, p["Conv_1"], 1, 1)), 2)
    for i in (2, 3, 4):
        x = _relu(_conv(x, p[f"Conv_{i}"], 1, 1))
    x = _flat(_pool(x, 2))
    x = _relu(_dense(x, p["Dense_0"]))
    x = _relu(_dense(x, p["Dense_1"]))
    return _dense(x, p["Dense_2"])


REFERENCES = [
    ("mlp", (16, 16, 1), 10, _mlp),
    ("lenet", (28, 28, 1), 10, _lenet_dlg),
    ("lenet5", (28, 28, 1), 10, _lenet5),
    ("convnet", (16, 16, 1), 10, _convnet),
    ("conv2", (28, 28, 1), 62, _conv2),
    ("alexnet", (32, 32, 3), 10, _alexnet),
]


@pytest.mark.parametrize("name,shape,classes,ref", REFERENCES, ids=[r[0] for r in REFERENCES])
def test_forward_pass_equals_a_numpy_reference_of_the_papers_layer_list(name, shape, classes,
                                                                       ref):
    """The logits equal a float64 numpy forward pass written from the layer list
    (activation, kernel, stride, padding, pool window, widths).

    Kills: an activation swapped (DLG LeNet's or the MLP's sigmoid → ReLU, Conv-2's
    FC ReLU → sigmoid, the ConvNet's ReLU → sigmoid), a ReLU dropped (AlexNet's conv
    384), the DLG LeNet's strides reordered (2, 1, 2, 1) or its padding 2 → "SAME"
    (asymmetric (1, 2) at stride 2) — none changes a parameter count, so
    test_models.py's counts cannot see them. References: paper 001 §VI (MLP), Zhu
    et al. 2019 / paper 003 §6 (DLG LeNet), paper 002 §6 (Conv-2), inversefed's
    ConvNet, the module docstring's AlexNet.
    """
    model = build_model(name, classes)
    if name == "lenet":  # DLG's U(±0.5) init: larger pre-activations than flax's default
        model = LeNetDLG(classes, init_scale=0.5)
    params = init_params(model, shape, jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (2, *shape))
    got = _np(make_apply_fn(model)(params, x))
    want = ref(jax.tree_util.tree_map(np.asarray, params), _np(x))
    assert got.shape == (2, classes)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)


def test_dlg_lenet_init_scale_draws_every_weight_and_bias_from_symmetric_uniform():
    """init_scale=s: every kernel and bias from U(−s, s), the DLG / Soteria reference
    code's ``weights_init`` (``uniform_(-0.5, 0.5)``).

    Kills: the lower bound dropped (U(0, s)). Checks the bound, a mean near 0 and
    the std near s/√3 (a uniform's std) over all 17,038 draws.
    """
    s = 0.5
    params = init_params(LeNetDLG(10, init_scale=s), (28, 28, 1), jax.random.key(2))
    leaves = np.concatenate([np.asarray(v).ravel() for v in jax.tree_util.tree_leaves(params)])
    assert leaves.size == 17_038
    assert np.abs(leaves).max() <= s
    assert abs(leaves.mean()) < 0.02  # se of the mean: (s/√3)/√17038 ≈ 0.0022
    assert leaves.std() == pytest.approx(s / np.sqrt(3), rel=0.03)
    assert (leaves < -0.4).mean() == pytest.approx(0.1, abs=0.02)


def test_batch_norm_defaults_are_torchs_momentum_and_epsilon():
    """BatchNorm() with its defaults normalises by (x − μ)/√(σ² + 1e-5) (biased σ²) and
    writes 0.9·running + 0.1·batch (unbiased σ² for the variance): torch.nn.BatchNorm2d's
    momentum 0.1 and eps 1e-5, Ioffe & Szegedy 2015 Alg. 1.

    Kills: the default momentum changed (0.01) or epsilon changed (1e-3): the
    inputs' variance (~1e-4) is small enough for ε to matter, and the running
    statistics start away from the batch's. (test_batch_norm.py passes momentum
    explicitly and uses variances ~9, where ε = 1e-3 is within its tolerance.)
    """
    x = jax.random.normal(jax.random.key(1), (5, 3, 3, 2)) * 0.01 + 0.5
    layer = BatchNorm()
    params = layer.init(jax.random.key(0), x)["params"]
    params = {**params, "running_mean": jnp.array([1.0, -1.0]), "running_var": jnp.array([2.0, 3.0])}
    out, written = layer.apply({"params": params}, x, True, None, mutable=["running_stats_update"])
    flat = _np(x).reshape(-1, 2)
    mu, var = flat.mean(0), flat.var(0)
    np.testing.assert_allclose(_np(out), (_np(x) - mu) / np.sqrt(var + 1e-5), rtol=2e-3, atol=2e-3)
    w = written["running_stats_update"]
    np.testing.assert_allclose(w["running_mean"][0], 0.9 * np.array([1.0, -1.0]) + 0.1 * mu,
                               rtol=1e-5)
    np.testing.assert_allclose(w["running_var"][0],
                               0.9 * np.array([2.0, 3.0]) + 0.1 * flat.var(0, ddof=1), rtol=1e-5)
    ev = layer.apply({"params": params}, x, False)
    np.testing.assert_allclose(_np(ev), (_np(x) - [1.0, -1.0]) / np.sqrt(np.array([2.0, 3.0]) + 1e-5),
                               rtol=1e-5)


def _group_norm(x, groups, eps=1e-6):
    n, h, w, c = x.shape
    g = x.reshape(n, h, w, groups, c // groups)
    mu = g.mean(axis=(1, 2, 4), keepdims=True)
    var = g.var(axis=(1, 2, 4), keepdims=True)
    return ((g - mu) / np.sqrt(var + eps)).reshape(x.shape)


def test_resnet10_group_norms_have_32_groups_and_blocks_end_in_relu():
    """ResNet-10 (paper 000 Table 2) with GroupNorm(32) (Wu & He 2018, Eq. 1 with
    S_i = the C/32 channels of i's group × H × W) and BasicBlocks that end in
    relu(shortcut + residual) (He et al. 2016, Fig. 2).

    Kills: the stem's or a block's group count changed (16: same parameter count,
    other statistics) and the block's final ReLU dropped. The stem's GroupNorm
    output is checked against the formula applied to the stem conv's output by
    hand; every GroupNorm (scale 1, bias 0 at init) must give each
    (example, group of C/32 channels) mean 0 and variance ≈ 1; every block's
    output is ≥ 0 with some exact zeros.
    """
    model = build_model("resnet10", 10)
    params = init_params(model, (8, 8, 3), jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (2, 8, 8, 3))
    # Jitted: eagerly every layer compiles its own program (twice the time).
    _, state = jax.jit(lambda p, v: model.apply({"params": p}, v,
                                                capture_intermediates=True))(params, x)
    inter = state["intermediates"]
    stem = _np(inter["Conv_0"]["__call__"][0])
    np.testing.assert_allclose(_np(inter["GroupNorm_0"]["__call__"][0]), _group_norm(stem, 32),
                               rtol=1e-3, atol=1e-3)
    norms = [(k, _np(v["__call__"][0])) for k, v in inter.items() if k.startswith("GroupNorm")]
    for b in range(4):
        block = inter[f"_BasicBlock_{b}"]
        norms += [(f"block{b}/{k}", _np(v["__call__"][0]))
                  for k, v in block.items() if k.startswith("GroupNorm")]
        out = _np(block["__call__"][0])
        assert out.min() >= 0.0, b
        assert (out == 0).any(), b
    assert len(norms) == 1 + 2 + 3 * 3  # stem; 2 in block 0; 3 (with shortcut) in blocks 1-3
    for k, y in norms:
        n, h, w, c = y.shape
        g = y.reshape(n, h * w, 32, c // 32)
        np.testing.assert_allclose(g.mean(axis=(1, 3)), 0.0, atol=1e-3, err_msg=k)
        np.testing.assert_allclose(g.var(axis=(1, 3)), 1.0, atol=2e-2, err_msg=k)
