"""fedsim.models.Conv / conv_im2col: same values, gradients and parameters as nn.Conv."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedsim import models
from fedsim.models import Conv, build_model, conv_im2col, init_params, make_apply_fn

DN = ("NHWC", "HWIO", "NHWC")


@pytest.mark.parametrize("kernel,strides,padding", [
    ((5, 5), (2, 2), 2),                # the DLG LeNet's strided layers
    ((5, 5), (1, 1), "SAME"),           # Conv-2
    ((3, 3), (1, 1), 1),                # ConvNet, VGG
    ((3, 3), (2, 2), "SAME"),           # asymmetric SAME padding at stride 2
    ((5, 5), (1, 1), "VALID"),
    ((3, 2), (2, 1), ((1, 0), (0, 2))),  # rectangular kernel, explicit pairs
    ((1, 1), (2, 2), "VALID"),          # ResNet shortcut
])
def test_conv_im2col_matches_lax_conv_and_its_gradients(kernel, strides, padding):
    ks = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(ks[0], (3, 11, 10, 4))
    w = jax.random.normal(ks[1], kernel + (4, 6))
    pads = padding
    if isinstance(padding, int):
        pads = ((padding, padding), (padding, padding))

    def ref(x, w):
        return jax.lax.conv_general_dilated(x, w, strides, pads, dimension_numbers=DN)

    want, vjp_want = jax.vjp(ref, x, w)
    got, vjp_got = jax.vjp(lambda x, w: conv_im2col(x, w, strides, padding), x, w)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    g = jax.random.normal(ks[2], want.shape)
    for a, b in zip(vjp_got(g), vjp_want(g)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_conv_im2col_names_bad_shapes():
    with pytest.raises(ValueError, match=r"same C; got x \(2, 8, 8, 3\), kernel \(3, 3, 4, 5\)"):
        conv_im2col(jnp.zeros((2, 8, 8, 3)), jnp.zeros((3, 3, 4, 5)))
    with pytest.raises(ValueError, match="needs x"):
        conv_im2col(jnp.zeros((8, 8, 3)), jnp.zeros((3, 3, 3, 5)))
    with pytest.raises(ValueError, match="kernel 5×5 is larger than the padded input 3×3"):
        conv_im2col(jnp.zeros((1, 3, 3, 1)), jnp.zeros((5, 5, 1, 2)), padding="VALID")


def test_conv_module_keeps_nn_conv_parameters_and_values():
    """Same parameter tree and initial values as nn.Conv from the same key, same outputs
    through either implementation (batch above and below the im2col limit)."""
    class Plain(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.sigmoid(nn.Conv(5, (5, 5), strides=2, padding=2)(x))
            return nn.Conv(7, (3, 3), padding="SAME", use_bias=False)(x)

    class Ours(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.sigmoid(Conv(5, (5, 5), strides=2, padding=2)(x))
            return Conv(7, (3, 3), padding="SAME", use_bias=False)(x)

    key = jax.random.key(1)
    x0 = jnp.zeros((1, 12, 12, 3))
    plain, ours = Plain().init(key, x0)["params"], Ours().init(key, x0)["params"]
    assert jax.tree.structure(plain) == jax.tree.structure(ours)
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)),
                                            plain, ours)))
    for batch in (1, models.IM2COL_MAX_BATCH, models.IM2COL_MAX_BATCH + 3):
        x = jax.random.uniform(jax.random.fold_in(key, batch), (batch, 12, 12, 3))
        np.testing.assert_allclose(Ours().apply({"params": ours}, x),
                                   Plain().apply({"params": plain}, x), rtol=1e-5, atol=1e-6)


def _count_convolutions(fn, *args):
    # A fresh wrapper: jit caches traces per function, and Conv chooses at trace time.
    text = jax.jit(lambda *a: fn(*a)).lower(*args).as_text()
    return text.count("stablehlo.convolution")


def test_conv_chooses_im2col_by_the_batch_the_layer_sees(monkeypatch):
    """On CPU: im2col (no HLO convolution) up to IM2COL_MAX_BATCH, XLA's conv above;
    under vmap the layer sees the per-instance batch."""
    if jax.default_backend() != "cpu":
        pytest.skip("the im2col path is CPU-only")
    model = build_model("lenet", 10)
    apply_fn = make_apply_fn(model)
    params = init_params(model, (32, 32, 3), jax.random.key(0))
    monkeypatch.setattr(models, "IM2COL_MAX_BATCH", 4)
    small = jnp.zeros((4, 32, 32, 3))
    large = jnp.zeros((5, 32, 32, 3))
    assert _count_convolutions(apply_fn, params, small) == 0
    assert _count_convolutions(apply_fn, params, large) == 4
    per_example = jax.vmap(lambda p, x: apply_fn(p, x[None]), (None, 0))
    assert _count_convolutions(per_example, params, jnp.zeros((64, 32, 32, 3))) == 0
    monkeypatch.setattr(models, "IM2COL_MAX_BATCH", 0)
    assert _count_convolutions(apply_fn, params, small) == 4


def test_second_order_gradient_same_through_both_implementations(monkeypatch):
    """DLG's objective (gradient of a gradient distance w.r.t. the input) agrees between
    XLA's conv and im2col, vmapped over instances as the attacks run it."""
    model = build_model("lenet", 10)
    apply_fn = make_apply_fn(model)
    params = init_params(model, (16, 16, 1), jax.random.key(0))
    y = jnp.array([3])

    def param_grad(p, x):
        return jax.grad(lambda q: jnp.mean(
            -jax.nn.log_softmax(apply_fn(q, x))[jnp.arange(1), y]))(p)

    target = param_grad(params, jax.random.uniform(jax.random.key(1), (1, 16, 16, 1)))

    def match(x):
        g = param_grad(params, x)
        return sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(g),
                                                          jax.tree.leaves(target)))

    dummies = jax.random.uniform(jax.random.key(2), (3, 1, 16, 16, 1))
    results = []
    for limit in (0, 10**9):
        monkeypatch.setattr(models, "IM2COL_MAX_BATCH", limit)
        results.append(jax.jit(jax.vmap(jax.grad(match)))(dummies))
    scale = float(jnp.max(jnp.abs(results[0])))
    assert scale > 0
    np.testing.assert_allclose(results[1], results[0], rtol=0, atol=1e-4 * scale)


def test_im2col_max_batch_block_sets_the_limit_and_restores_it():
    before = models.IM2COL_MAX_BATCH
    with models.im2col_max_batch(0):
        assert models.IM2COL_MAX_BATCH == 0
    assert models.IM2COL_MAX_BATCH == before
    with pytest.raises(RuntimeError, match="inside"):
        with models.im2col_max_batch(7):
            assert models.IM2COL_MAX_BATCH == 7
            raise RuntimeError("inside")
    assert models.IM2COL_MAX_BATCH == before
    for bad in (-1, 2.5, True, "4", None):
        with pytest.raises(ValueError, match="integer >= 0"):
            with models.im2col_max_batch(bad):
                pass
    assert models.IM2COL_MAX_BATCH == before


def test_im2col_max_batch_block_changes_what_is_traced_inside_it():
    if jax.default_backend() != "cpu":
        pytest.skip("the im2col path is CPU-only")
    model = build_model("lenet", 10)
    apply_fn = make_apply_fn(model)
    params = init_params(model, (32, 32, 3), jax.random.key(0))
    x = jnp.zeros((1, 32, 32, 3))
    with models.im2col_max_batch(0):
        assert _count_convolutions(apply_fn, params, x) == 4
    with models.im2col_max_batch(10**9):
        assert _count_convolutions(apply_fn, params, jnp.zeros((64, 32, 32, 3))) == 0


def test_uses_im2col_rule_batch_or_kernel_larger_than_input(monkeypatch):
    monkeypatch.setattr(models, "IM2COL_MAX_BATCH", 4)
    assert models.uses_im2col(4, 32, 32, 3, 3)        # small batch
    assert not models.uses_im2col(5, 32, 32, 3, 3)    # large batch, large input
    assert not models.uses_im2col(500, 3, 3, 3, 3)    # kernel = input: XLA
    assert models.uses_im2col(500, 2, 2, 3, 3)        # VGG's 2×2 maps
    assert models.uses_im2col(500, 1, 1, 3, 3)        # and 1×1
    assert models.uses_im2col(500, 8, 2, 1, 3)        # one dimension is enough
    assert not models.uses_im2col(500, 2, 2, 1, 1)    # 1×1 kernel on 2×2
    with models.conv_implementation("xla"):
        assert not models.uses_im2col(1, 1, 1, 3, 3)
    with models.conv_implementation("im2col"):
        assert models.uses_im2col(500, 32, 32, 3, 3)


def test_vgg_deep_layers_use_im2col_at_large_batch_and_agree_with_xla():
    """VGG-11 at 16×16: the 2×2 and 1×1 layers (kernel > input) go through im2col
    at a batch far above IM2COL_MAX_BATCH, the others through XLA's conv; the
    logits and the gradient equal those of XLA's conv at every layer."""
    if jax.default_backend() != "cpu":
        pytest.skip("the im2col path is CPU-only")
    model = build_model("vgg11", 10)
    apply_fn = make_apply_fn(model)
    params = init_params(model, (16, 16, 1), jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (16, 16, 16, 1))
    # 8 convs: 16×16, 8×8, 4×4 (2) by XLA; 2×2 (2) and 1×1 (2) by im2col.
    assert _count_convolutions(apply_fn, params, x) == 4
    with models.conv_implementation("xla"):
        assert _count_convolutions(apply_fn, params, x) == 8
    with models.conv_implementation("im2col"):
        assert _count_convolutions(apply_fn, params, x) == 0
    y = jnp.arange(16) % 10

    def loss(p, fn):
        return jnp.mean(-jax.nn.log_softmax(fn(p, x))[jnp.arange(16), y])

    outs = {}
    for impl in ("auto", "xla"):
        with models.conv_implementation(impl):
            fn = make_apply_fn(model)  # fresh: the implementation is chosen at trace time
            outs[impl] = (jax.jit(fn)(params, x), jax.jit(jax.grad(loss), static_argnums=1)(
                params, fn))
    np.testing.assert_allclose(outs["auto"][0], outs["xla"][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(outs["auto"][1]), jax.tree.leaves(outs["xla"][1])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(jnp.max(jnp.abs(b))))


def test_conv_implementation_block_sets_and_restores_and_rejects_bad_names():
    before = models.CONV_IMPLEMENTATION
    with pytest.raises(RuntimeError, match="inside"):
        with models.conv_implementation("xla"):
            assert models.CONV_IMPLEMENTATION == "xla"
            raise RuntimeError("inside")
    assert models.CONV_IMPLEMENTATION == before == "auto"
    # What a results file records follows the block.
    assert models.conv_settings()["implementation"] == "auto"
    with models.conv_implementation("xla"), models.im2col_max_batch(7):
        assert models.conv_settings() == {"implementation": "xla", "im2col_max_batch": 7,
                                          "vmapped_im2col_max_batch":
                                              models.VMAPPED_IM2COL_MAX_BATCH}
    for bad in ("XLA", "lax", None, 0):
        with pytest.raises(ValueError, match="conv_implementation: name must be one of"):
            with models.conv_implementation(bad):
                pass
    assert models.CONV_IMPLEMENTATION == before


@pytest.mark.parametrize("name,shape,convs", [("lenet", (32, 32, 3), 4),
                                              ("lenet5", (16, 16, 1), 2)])
def test_vmapped_instances_takes_im2col_above_the_batch_rule_and_restores(name, shape, convs):
    """Inside vmapped_instances() Conv and the fused conv→ReLU→pool block trace im2col
    at a per-instance batch above IM2COL_MAX_BATCH (8 here); outside, or with the hint's
    limit below the batch, or under conv_implementation("xla"), XLA's convolution."""
    if jax.default_backend() != "cpu":
        pytest.skip("the im2col path is CPU-only")
    model = build_model(name, 10)
    apply_fn = make_apply_fn(model)
    params = init_params(model, shape, jax.random.key(0))
    x = jnp.zeros((8,) + shape)
    assert 8 > models.IM2COL_MAX_BATCH
    assert _count_convolutions(apply_fn, params, x) == convs
    with models.vmapped_instances():
        assert _count_convolutions(apply_fn, params, x) == 0
        with models.vmapped_instances():  # nested blocks
            assert _count_convolutions(apply_fn, params, x) == 0
        assert _count_convolutions(apply_fn, params, x) == 0
        with models.vmapped_im2col_max_batch(7):
            assert _count_convolutions(apply_fn, params, x) == convs
        with models.vmapped_im2col_max_batch(8):
            assert _count_convolutions(apply_fn, params, x) == 0
        with models.conv_implementation("xla"):
            assert _count_convolutions(apply_fn, params, x) == convs
    assert models._VMAPPED_DEPTH == 0
    assert _count_convolutions(apply_fn, params, x) == convs


@pytest.mark.parametrize("name", ["conv2", "lenet5"])
def test_vmapped_instances_gives_the_gradients_of_xla_convolutions(name):
    """Clients with their own parameters, vmapped: the gradients traced under the hint
    (im2col) equal those of the batch rule alone (XLA's grouped convolution)."""
    model = build_model(name, 10)
    apply_fn = make_apply_fn(model)
    shape = (16, 16, 1)
    params = jax.vmap(lambda k: init_params(model, shape, k))(
        jax.random.split(jax.random.key(0), 3))
    x = jax.random.uniform(jax.random.key(1), (3, 6) + shape)
    y = jax.random.randint(jax.random.key(2), (3, 6), 0, 10)

    def loss(p, x, y):
        return jnp.mean(-jax.nn.log_softmax(apply_fn(p, x))[jnp.arange(6), y])

    step = jax.vmap(jax.grad(loss))
    plain = jax.jit(lambda *a: step(*a))(params, x, y)

    def hinted(*a):
        with models.vmapped_instances():
            return step(*a)

    if jax.default_backend() == "cpu":
        assert _count_convolutions(hinted, params, x, y) == 0
        assert _count_convolutions(step, params, x, y) > 0
    got = jax.jit(hinted)(params, x, y)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(plain)):
        scale = float(jnp.max(jnp.abs(b)))
        assert scale > 0
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale)


def test_vmapped_im2col_max_batch_block_sets_the_limit_and_rejects_bad_ones():
    before = models.VMAPPED_IM2COL_MAX_BATCH
    with models.vmapped_instances():
        assert models.uses_im2col(5, 32, 32, 3, 3)
        assert not models.uses_im2col(before + 1, 32, 32, 3, 3)
        with models.vmapped_im2col_max_batch(0):
            assert models.VMAPPED_IM2COL_MAX_BATCH == 0
            assert not models.uses_im2col(5, 32, 32, 3, 3)  # off: the batch rule decides
            assert models.uses_im2col(4, 32, 32, 3, 3)
    assert models.VMAPPED_IM2COL_MAX_BATCH == before
    assert not models.uses_im2col(5, 32, 32, 3, 3)
    for bad in (-1, 2.5, True, "4", None):
        with pytest.raises(ValueError, match="vmapped_im2col_max_batch: limit must be an integer"):
            with models.vmapped_im2col_max_batch(bad):
                pass
    assert models.VMAPPED_IM2COL_MAX_BATCH == before
