"""The papers' models (flax.linen), built by name from a registry.

Every model maps NHWC float inputs to logits. Parameter counts depend on the
input shape and class count; ``tests/fedsim/test_models.py`` pins them.

* ``mlp``: 256→50→15→10, sigmoid, no bias (paper 001 §VI: 13,700 params on
  16×16×1 inputs). Flattens its input, so it needs 256 input features.
* ``lenet``: the DLG / Soteria LeNet (Zhu et al. 2019; paper 003 §6): four
  5×5 convs with 12 channels (strides 2, 2, 1, 1), sigmoid, one FC layer.
* ``lenet5``: the classic ReLU LeNet-5 (6, 16 channels; 120, 84 units); the
  engine's fast default for training on CPU.
* ``convnet``: the ConvNet of Geiping et al. (2020) used for GS in Soteria
  (paper 003 Table 3), width 32, ReLU, no batch norm (so a single example's
  gradient is well defined; stated deviation).
* ``conv2``: LEAF/FEMNIST Conv-2 (paper 002 §6): conv5×5·32, pool, conv5×5·64,
  pool, FC 2048, FC classes.
* ``alexnet``: a 32×32 AlexNet (5 convs 64-192-384-256-256, FC 4096-4096).
* ``vgg11`` / ``vgg16``: CIFAR VGG (Simonyan & Zisserman configs A/D) with a
  512→classes classifier and no batch norm.
* ``resnet10``: CIFAR ResNet with BasicBlocks [1, 1, 1, 1] (≈4.9 M params as
  in paper 000 Table 2); GroupNorm instead of BatchNorm so clients need no
  mutable batch statistics (stated deviation).
"""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

ModelFactory = Callable[..., nn.Module]
MODEL_REGISTRY: dict[str, ModelFactory] = {}


def register_model(name: str):
    def deco(factory):
        MODEL_REGISTRY[name] = factory
        return factory

    return deco


@register_model("mlp")
class MLP(nn.Module):
    """Paper 001's MLP: sigmoid hidden layers, no biases (13,700 params)."""

    num_classes: int = 10
    hidden: Sequence[int] = (50, 15)

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        for width in self.hidden:
            x = nn.sigmoid(nn.Dense(width, use_bias=False)(x))
        return nn.Dense(self.num_classes, use_bias=False)(x)


@register_model("lenet")
class LeNetDLG(nn.Module):
    """The DLG LeNet: 4 sigmoid 5×5 convs of 12 channels + one FC layer.

    ``init_scale`` > 0 draws every weight and bias from U(−s, s), the
    ``weights_init`` of the DLG / Soteria reference code (s = 0.5); with flax's
    default init (0, the default here) this sigmoid net stays at chance in
    FedAvg for 60+ rounds (``benchmarks/results/sun2021.md``).
    """

    num_classes: int = 10
    init_scale: float = 0.0

    @nn.compact
    def __call__(self, x):
        kw = {}
        if self.init_scale > 0:
            s = self.init_scale
            uniform = lambda key, shape, dtype=jnp.float32: jax.random.uniform(  # noqa: E731
                key, shape, dtype, -s, s)
            kw = {"kernel_init": uniform, "bias_init": uniform}
        for stride in (2, 2, 1, 1):
            x = nn.sigmoid(nn.Conv(12, (5, 5), strides=stride, padding=2, **kw)(x))
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(self.num_classes, **kw)(x)


@register_model("lenet5")
class LeNet5(nn.Module):
    """Classic ReLU LeNet-5 with max pooling."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(6, (5, 5), padding="SAME" if x.shape[1] < 32 else "VALID")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.Conv(16, (5, 5), padding="VALID")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(120)(x))
        x = nn.relu(nn.Dense(84)(x))
        return nn.Dense(self.num_classes)(x)


@register_model("convnet")
class ConvNet(nn.Module):
    """Geiping et al.'s ConvNet (width 32), ReLU, no batch norm."""

    num_classes: int = 10
    width: int = 32

    @nn.compact
    def __call__(self, x):
        w = self.width
        for ch in (w, 2 * w, 2 * w, 4 * w, 4 * w, 4 * w):
            x = nn.relu(nn.Conv(ch, (3, 3), padding=1)(x))
        x = nn.max_pool(x, (3, 3), strides=(3, 3))
        for ch in (4 * w, 4 * w):
            x = nn.relu(nn.Conv(ch, (3, 3), padding=1)(x))
        x = nn.max_pool(x, (3, 3), strides=(3, 3))
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(self.num_classes)(x)


@register_model("conv2")
class Conv2(nn.Module):
    """LEAF's FEMNIST CNN ("Conv-2" in paper 002)."""

    num_classes: int = 62

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(32, (5, 5), padding="SAME")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.Conv(64, (5, 5), padding="SAME")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(2048)(x))
        return nn.Dense(self.num_classes)(x)


@register_model("alexnet")
class AlexNet(nn.Module):
    """AlexNet sized for 32×32 inputs."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(64, (3, 3), strides=2, padding=1)(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.Conv(192, (3, 3), padding=1)(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.Conv(384, (3, 3), padding=1)(x))
        x = nn.relu(nn.Conv(256, (3, 3), padding=1)(x))
        x = nn.relu(nn.Conv(256, (3, 3), padding=1)(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(4096)(x))
        x = nn.relu(nn.Dense(4096)(x))
        return nn.Dense(self.num_classes)(x)


_VGG_CFG = {
    "vgg11": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
              512, 512, 512, "M"),
}


class VGG(nn.Module):
    """CIFAR-style VGG without batch norm."""

    cfg: tuple = _VGG_CFG["vgg11"]
    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        for item in self.cfg:
            if item == "M":
                if x.shape[1] >= 2:
                    x = nn.max_pool(x, (2, 2), strides=(2, 2))
            else:
                x = nn.relu(nn.Conv(item, (3, 3), padding=1)(x))
        x = jnp.mean(x, axis=(1, 2))  # global pool: works for 16/28/32 inputs
        return nn.Dense(self.num_classes)(x)


register_model("vgg11")(lambda num_classes=10: VGG(cfg=_VGG_CFG["vgg11"], num_classes=num_classes))
register_model("vgg16")(lambda num_classes=10: VGG(cfg=_VGG_CFG["vgg16"], num_classes=num_classes))


class _BasicBlock(nn.Module):
    channels: int
    stride: int

    @nn.compact
    def __call__(self, x):
        y = nn.Conv(self.channels, (3, 3), strides=self.stride, padding=1, use_bias=False)(x)
        y = nn.relu(nn.GroupNorm(num_groups=min(32, self.channels))(y))
        y = nn.Conv(self.channels, (3, 3), padding=1, use_bias=False)(y)
        y = nn.GroupNorm(num_groups=min(32, self.channels))(y)
        if self.stride != 1 or x.shape[-1] != self.channels:
            x = nn.Conv(self.channels, (1, 1), strides=self.stride, use_bias=False)(x)
            x = nn.GroupNorm(num_groups=min(32, self.channels))(x)
        return nn.relu(x + y)


@register_model("resnet10")
class ResNet10(nn.Module):
    """CIFAR ResNet-10 (BasicBlock ×[1,1,1,1]) with GroupNorm."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(64, (3, 3), padding=1, use_bias=False)(x)
        x = nn.relu(nn.GroupNorm(num_groups=32)(x))
        for channels, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            x = _BasicBlock(channels, stride)(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes)(x)


def build_model(name: str, num_classes: int = 10) -> nn.Module:
    """Build a registered model.

    Raises:
      ValueError: for an unknown model name (the message lists known names).
    """
    if name not in MODEL_REGISTRY:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(sorted(MODEL_REGISTRY))}")
    return MODEL_REGISTRY[name](num_classes=num_classes)


def init_params(model: nn.Module, input_shape: Sequence[int], key: jax.Array):
    """Initialise ``model`` for inputs of shape ``input_shape`` (no batch dim)."""
    return model.init(key, jnp.zeros((1, *input_shape), jnp.float32))["params"]


def make_apply_fn(model: nn.Module) -> Callable[[object, jax.Array], jax.Array]:
    """``apply_fn(params, x) -> logits`` for a batch x [B, ...]."""

    def apply_fn(params, x):
        return model.apply({"params": params}, x)

    return apply_fn


def count_params(params) -> int:
    return int(sum(p.size for p in jax.tree_util.tree_leaves(params)))
