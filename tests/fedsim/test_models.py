import jax
import numpy as np
import jax.numpy as jnp
import pytest

from fedsim.models import build_model, count_params, init_params, make_apply_fn

# (model, input shape, classes) -> parameter count. The MLP count is paper 001's
# 13,700; LeNet-5 on 32×32×3 is paper 000 Table 2's 6.20e4; ResNet-10 its 4.90e6;
# Conv-2 on 28×28 is LEAF's 6.6 M FEMNIST CNN.
EXPECTED = [
    ("mlp", (16, 16, 1), 10, 13_700),
    # McMahan et al. 2017 §3: the MNIST 2NN "(199,210 total parameters)".
    ("mlp_2nn", (28, 28, 1), 10, 199_210),
    ("lenet", (28, 28, 1), 10, 17_038),
    ("lenet", (32, 32, 3), 10, 19_438),
    ("lenet5", (28, 28, 1), 10, 61_706),
    ("lenet5", (32, 32, 3), 10, 62_006),
    ("lenet5_1998", (28, 28, 1), 10, 61_706),
    ("lenet5_1998", (32, 32, 3), 10, 62_006),
    ("convnet", (32, 32, 3), 10, 732_042),
    # + 4 per channel of its 800 (scale, bias, running mean and variance).
    ("convnet_bn", (32, 32, 3), 10, 735_242),
    ("conv2", (28, 28, 1), 62, 6_603_710),
    ("alexnet", (32, 32, 3), 10, 23_272_266),
    ("vgg11", (32, 32, 3), 10, 9_225_610),
    ("vgg16", (32, 32, 3), 10, 14_719_818),
    ("resnet10", (32, 32, 3), 10, 4_903_242),
]


@pytest.mark.parametrize("name,shape,classes,expected", EXPECTED)
def test_parameter_counts(name, shape, classes, expected):
    model = build_model(name, classes)
    # eval_shape: count without allocating the big models.
    params = jax.eval_shape(lambda k: init_params(model, shape, k), jax.random.key(0))
    assert count_params(params) == expected


@pytest.mark.parametrize("name,shape", [("mlp", (16, 16, 1)), ("mlp_2nn", (16, 16, 1)),
                                        ("lenet", (28, 28, 1)),
                                        ("lenet5", (28, 28, 1)), ("lenet5_1998", (28, 28, 1)),
                                        ("convnet", (32, 32, 3))])
def test_forward_shapes(name, shape):
    model = build_model(name, 10)
    params = init_params(model, shape, jax.random.key(0))
    logits = make_apply_fn(model)(params, jnp.zeros((3, *shape)))
    assert logits.shape == (3, 10)


def test_lenet5_1998_is_tanh_and_average_pooling():
    """LeCun et al. 1998's squashing and subsampling: the logits equal a hand-written
    tanh / 2×2-mean forward pass, and every input pixel moves them (no dead paths)."""
    model = build_model("lenet5_1998")
    params = init_params(model, (32, 32, 1), jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (2, 32, 32, 1))

    def conv(h, layer):
        out = jax.lax.conv_general_dilated(h, layer["kernel"], (1, 1), "VALID",
                                           dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return out + layer["bias"]

    def mean2x2(h):
        n, hh, ww, c = h.shape
        return h.reshape(n, hh // 2, 2, ww // 2, 2, c).mean(axis=(2, 4))

    h = mean2x2(jnp.tanh(conv(x, params["Conv_0"])))
    h = mean2x2(jnp.tanh(conv(h, params["Conv_1"]))).reshape(2, -1)
    for name in ("Dense_0", "Dense_1"):
        h = jnp.tanh(h @ params[name]["kernel"] + params[name]["bias"])
    ref = h @ params["Dense_2"]["kernel"] + params["Dense_2"]["bias"]
    apply_fn = make_apply_fn(model)
    np.testing.assert_allclose(np.asarray(apply_fn(params, x)), np.asarray(ref), atol=1e-5)
    g = jax.grad(lambda v: jnp.sum(apply_fn(params, v) ** 2))(x[:1])
    assert np.all(np.abs(np.asarray(g)) > 0)


def test_mlp_has_no_biases():
    params = init_params(build_model("mlp"), (16, 16, 1), jax.random.key(0))
    assert all("bias" not in k for layer in params.values() for k in layer)


def test_unknown_model_lists_known_ones():
    with pytest.raises(ValueError, match="known models:.*mlp"):
        build_model("nope")


def test_init_params_names_the_shape_it_cannot_take():
    # A shape given with its batch dim: Conv-2's Dense layer sees no features.
    with pytest.raises(ValueError, match=r"Conv2 cannot be initialised for input_shape "
                                         r"\(1, 28, 28, 1\).*no batch dimension"):
        init_params(build_model("conv2", 10), (1, 28, 28, 1), jax.random.key(0))


def _eager_init(model, shape, key):
    """``model.init`` op by op, as init_params ran before it was jitted."""
    return model.init(key, jnp.zeros((1, *shape), jnp.float32))["params"]


def _assert_bitwise_equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _torch_convnet():
    from fedsim.models import ConvNet
    return ConvNet(width=4, init_scheme="torch", input_standardise=(0.3, 0.25))


@pytest.mark.parametrize("make,shape", [
    (lambda: build_model("mlp"), (16, 16, 1)),
    (lambda: build_model("lenet"), (16, 16, 1)),
    (lambda: build_model("lenet5"), (28, 28, 1)),
    (_torch_convnet, (16, 16, 1)),
], ids=["mlp", "lenet", "lenet5", "convnet_torch"])
def test_jitted_init_gives_the_eager_parameters_bit_for_bit(make, shape):
    """init_params runs model.init as one program: XLA may fuse the initializers'
    arithmetic, and the committed results depend on these exact bits."""
    model = make()
    for seed in (0, 3):
        key = jax.random.key(seed)
        _assert_bitwise_equal(init_params(model, shape, key), _eager_init(model, shape, key))
    raw = jax.random.PRNGKey(5)  # a raw uint32 key as well as a typed one
    _assert_bitwise_equal(init_params(model, list(shape), raw), _eager_init(model, shape, raw))


@pytest.mark.slow
@pytest.mark.parametrize("name,shape,classes,expected", EXPECTED)
def test_jitted_init_gives_the_eager_parameters_bit_for_bit_for_every_model(
        name, shape, classes, expected):
    model = build_model(name, classes)
    key = jax.random.key(1)
    _assert_bitwise_equal(init_params(model, shape, key), _eager_init(model, shape, key))


def test_init_is_one_program_per_model_and_shape_and_an_unhashable_model_runs_eagerly():
    import flax.linen as nn

    from fedsim import models

    model, shape = build_model("mlp"), (21, 21, 1)  # a shape no other test uses
    program = models._init_jitted_cpu_options  # the program init_params runs on CPU
    before = program._cache_size()
    first = init_params(model, shape, jax.random.key(0))
    init_params(model, list(shape), jax.random.key(1))  # a list hits the same program
    init_params(build_model("mlp"), shape, jax.random.key(2))  # an equal model as well
    assert program._cache_size() == before + 1
    assert first["Dense_0"]["kernel"].shape == (21 * 21, 50)

    class ListWidths(nn.Module):  # a list field: not hashable, so not a static argument
        widths: list

        @nn.compact
        def __call__(self, x):
            return nn.Dense(self.widths[0])(x.reshape((x.shape[0], -1)))

    odd = ListWidths([3])
    with pytest.raises(TypeError):
        hash(odd)
    key = jax.random.key(4)
    _assert_bitwise_equal(init_params(odd, (2, 2, 1), key), _eager_init(odd, (2, 2, 1), key))
    assert program._cache_size() == before + 1


def test_init_inside_another_trace_gives_the_top_level_parameters():
    """JAX refuses a nested jit's compiler options (the CPU init's level 2) inside
    another trace; there init_params runs as part of the outer program, to the same bits."""
    model, shape = build_model("lenet5"), (28, 28, 1)
    top = init_params(model, shape, jax.random.key(6))
    # A traced key (jit's argument) and a concrete key closed over inside the trace.
    _assert_bitwise_equal(jax.jit(lambda k: init_params(model, shape, k))(jax.random.key(6)), top)
    _assert_bitwise_equal(jax.jit(lambda: init_params(model, shape, jax.random.key(6)))(), top)
    shapes = jax.eval_shape(lambda: init_params(model, shape, jax.random.key(6)))
    assert jax.tree.map(lambda a: a.shape, shapes) == jax.tree.map(lambda a: a.shape, top)


@pytest.mark.parametrize("window,size", [(2, 28), (2, 7), (3, 16)])
def test_max_pool_matches_flax_values_and_gradients(window, size):
    """The sliced max pool equals flax's reduce_window pool (ties aside)."""
    import flax.linen as nn

    from fedsim.models import max_pool

    x = jax.random.normal(jax.random.key(0), (3, size, size, 4))  # continuous: no ties
    ref = lambda x: nn.max_pool(x, (window, window), strides=(window, window))
    g = jax.random.normal(jax.random.key(1), ref(x).shape)
    np.testing.assert_array_equal(max_pool(x, window), ref(x))
    grad = lambda f: jax.vjp(f, x)[1](g)[0]
    np.testing.assert_array_equal(grad(lambda v: max_pool(v, window)), grad(ref))


def test_max_pool_gradient_is_the_same_jitted_behind_batch_norm():
    # JAX's rule for jnp.maximum finds each window's winner by equality with the
    # maximum; jitted, XLA compared separately fused copies of the batch-normalised
    # input, and convnet_bn's gradient here came out up to 0.79 away from the eager one.
    model = build_model("convnet_bn")
    params = init_params(model, (16, 16, 1), jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (5, 16, 16, 1))
    loss = lambda p: jnp.sum(jax.nn.logsumexp(make_apply_fn(model)(p, x), -1))
    eager, jitted = jax.grad(loss)(params), jax.jit(jax.grad(loss))(params)
    for a, b in zip(jax.tree_util.tree_leaves(eager), jax.tree_util.tree_leaves(jitted)):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_max_pool_takes_forward_mode_and_second_order_derivatives():
    # GraSP's Hessian-gradient product is a jvp of a gradient; attacks differentiate
    # gradients again. Both against flax's reduce_window pool.
    import flax.linen as nn

    from fedsim.models import max_pool

    x = jax.random.normal(jax.random.key(0), (2, 9, 8, 3))
    for k in (2, 3):
        ours = lambda v: jnp.sum(jnp.sin(max_pool(v, k)))
        ref = lambda v: jnp.sum(jnp.sin(nn.max_pool(v, (k, k), strides=(k, k))))
        t = jax.random.normal(jax.random.key(1), x.shape)
        np.testing.assert_allclose(jax.jvp(jax.grad(ours), (x,), (t,))[1],
                                   jax.jvp(jax.grad(ref), (x,), (t,))[1], atol=1e-6)
        again = lambda f: jax.grad(lambda v: jnp.sum(jax.grad(f)(v) ** 2 * v))(x)
        np.testing.assert_allclose(again(ours), again(ref), atol=1e-6)


@pytest.mark.parametrize("size,cin,padding", [(32, 1, "VALID"), (28, 1, "SAME"), (14, 6, "VALID"),
                                              (15, 2, "VALID")])
def test_conv_relu_maxpool_matches_plain_layers(size, cin, padding):
    """The phase-packed conv → ReLU → pool equals conv, ReLU, nn.max_pool (values, grads)."""
    import flax.linen as nn

    from fedsim.models import conv_relu_maxpool

    ks = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(ks[0], (2, size, size, cin))
    k = jax.random.normal(ks[1], (5, 5, cin, 7))
    b = jax.random.normal(ks[2], (7,))

    def ref(x, k, b):
        y = jax.lax.conv_general_dilated(x, k, (1, 1), padding,
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return nn.max_pool(jax.nn.relu(y + b), (2, 2), strides=(2, 2))

    out = conv_relu_maxpool(x, k, b, padding)
    np.testing.assert_allclose(out, ref(x, k, b), rtol=1e-5, atol=1e-5)
    g = jax.random.normal(ks[3], out.shape)
    got = jax.vjp(lambda *a: conv_relu_maxpool(*a, padding), x, k, b)[1](g)
    want = jax.vjp(ref, x, k, b)[1](g)
    for a, w in zip(got, want):
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4 * float(jnp.abs(w).max()))


def test_lenet5_params_unchanged_by_fused_layers():
    """LeNet-5 keeps nn.Conv's parameter tree and initial values (same key)."""
    import flax.linen as nn

    class PlainLeNet5(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.max_pool(nn.relu(nn.Conv(6, (5, 5), padding="VALID")(x)), (2, 2), (2, 2))
            x = nn.max_pool(nn.relu(nn.Conv(16, (5, 5), padding="VALID")(x)), (2, 2), (2, 2))
            x = x.reshape(x.shape[0], -1)
            x = nn.relu(nn.Dense(120)(x))
            x = nn.relu(nn.Dense(84)(x))
            return nn.Dense(10)(x)

    key = jax.random.key(3)
    params = init_params(build_model("lenet5"), (32, 32, 1), key)
    plain = PlainLeNet5().init(key, jnp.zeros((1, 32, 32, 1)))["params"]
    same = jax.tree_util.tree_map(lambda a, b: bool(jnp.array_equal(a, b)), params, plain)
    assert all(jax.tree_util.tree_leaves(same))
    x = jax.random.uniform(key, (4, 32, 32, 1))
    np.testing.assert_allclose(build_model("lenet5").apply({"params": params}, x),
                               PlainLeNet5().apply({"params": plain}, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["vgg11", "vgg16"])
def test_vgg_convolutions_are_he_normal(name):
    """He init (variance 2/fan-in, truncated normal as flax's he_normal draws it), not
    LeCun's 1/fan-in: the sample variance of each conv kernel sits near 2/fan-in and
    far from 1/fan-in (the smallest kernel, 3×3×3×64, has 1,728 entries)."""
    params = init_params(build_model(name, 10), (32, 32, 3), jax.random.key(0))
    convs = [k for k in params if k.startswith("Conv_")]
    assert len(convs) == (8 if name == "vgg11" else 13)
    for k in convs:
        w = np.asarray(params[k]["kernel"])
        fan_in = w.shape[0] * w.shape[1] * w.shape[2]
        assert np.var(w) * fan_in == pytest.approx(2.0, rel=0.15), k


def test_convnet_torch_init_draws_kernels_and_biases_from_pytorch_bound():
    """init_scheme="torch": every kernel and bias in U(±1/√fan_in), fan_in = the kernel's
    size without its output axis (PyTorch's Conv2d/Linear default), spread over
    the bound (a uniform's std is bound/√3); the default keeps zero biases."""
    from fedsim.models import ConvNet
    x = jnp.zeros((1, 16, 16, 1))
    torch_p = ConvNet(width=4, init_scheme="torch").init(jax.random.key(0), x)["params"]
    for name, layer in torch_p.items():
        bound = 1.0 / np.sqrt(np.prod(layer["kernel"].shape[:-1]))
        for leaf in (layer["kernel"], layer["bias"]):
            assert float(jnp.max(jnp.abs(leaf))) <= bound, name
        k = np.asarray(layer["kernel"]).ravel()
        if k.size >= 500:  # enough draws for the std to sit near bound/√3
            assert abs(k.std() - bound / np.sqrt(3)) < 0.1 * bound / np.sqrt(3), name
        assert float(jnp.max(jnp.abs(layer["bias"]))) > 0, name
    default_p = ConvNet(width=4).init(jax.random.key(0), x)["params"]
    assert all(float(jnp.max(jnp.abs(layer["bias"]))) == 0 for layer in default_p.values())
    with pytest.raises(ValueError, match="init_scheme 'xavier'"):
        ConvNet(width=4, init_scheme="xavier").init(jax.random.key(0), x)


def test_convnet_input_standardise_is_a_fixed_first_step():
    """input_standardise=(m, s): the logits equal the plain model's on (x − m)/s."""
    from fedsim.models import ConvNet
    x = jax.random.uniform(jax.random.key(1), (2, 16, 16, 1))
    plain = ConvNet(width=4)
    params = plain.init(jax.random.key(0), x)["params"]
    scaled = ConvNet(width=4, input_standardise=(0.3, 0.25))
    np.testing.assert_allclose(scaled.apply({"params": params}, x),
                               plain.apply({"params": params}, (x - 0.3) / 0.25),
                               rtol=1e-6, atol=1e-6)
    assert not np.allclose(scaled.apply({"params": params}, x),
                           plain.apply({"params": params}, x))
    for bad in ((0.3, 0.0), (0.3, float("nan")), (0.3,), "ab"):
        with pytest.raises(ValueError, match="input_standardise"):
            ConvNet(width=4, input_standardise=bad).apply({"params": params}, x)


@pytest.mark.parametrize("bad", ["10", 0, -1, 2.5, True, None])
def test_build_model_refuses_a_class_count_that_is_not_a_positive_integer(bad):
    # Before, build_model took it and init_params blamed the input shape.
    with pytest.raises(ValueError, match=r"num_classes must be an integer >= 1"):
        build_model("mlp", bad)
    assert build_model("mlp", np.int64(7)).num_classes == 7
