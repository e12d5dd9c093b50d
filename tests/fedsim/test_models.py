import jax
import jax.numpy as jnp
import pytest

from fedsim.models import build_model, count_params, init_params, make_apply_fn

# (model, input shape, classes) -> parameter count. The MLP count is paper 001's
# 13,700; LeNet-5 on 32×32×3 is paper 000 Table 2's 6.20e4; ResNet-10 its 4.90e6;
# Conv-2 on 28×28 is LEAF's 6.6 M FEMNIST CNN.
EXPECTED = [
    ("mlp", (16, 16, 1), 10, 13_700),
    ("lenet", (28, 28, 1), 10, 17_038),
    ("lenet", (32, 32, 3), 10, 19_438),
    ("lenet5", (28, 28, 1), 10, 61_706),
    ("lenet5", (32, 32, 3), 10, 62_006),
    ("convnet", (32, 32, 3), 10, 732_042),
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


@pytest.mark.parametrize("name,shape", [("mlp", (16, 16, 1)), ("lenet", (28, 28, 1)),
                                        ("lenet5", (28, 28, 1)), ("convnet", (32, 32, 3))])
def test_forward_shapes(name, shape):
    model = build_model(name, 10)
    params = init_params(model, shape, jax.random.key(0))
    logits = make_apply_fn(model)(params, jnp.zeros((3, *shape)))
    assert logits.shape == (3, 10)


def test_mlp_has_no_biases():
    params = init_params(build_model("mlp"), (16, 16, 1), jax.random.key(0))
    assert all("bias" not in k for layer in params.values() for k in layer)


def test_unknown_model_lists_known_ones():
    with pytest.raises(ValueError, match="known models:.*mlp"):
        build_model("nope")
