"""The papers' models (flax.linen), built by name from a registry.

Every model maps NHWC float inputs to logits. Parameter counts depend on the
input shape and class count; ``tests/fedsim/test_models.py`` pins them. The
convolutions are :class:`Conv` (``nn.Conv``'s parameters; on CPU at batch ≤
:data:`IM2COL_MAX_BATCH` an im2col GEMM, which makes vmapped gradient-inversion
attacks 2–24× faster: ``benchmarks/results/conv_im2col_cpu.md``; also where the
kernel exceeds the input, VGG's deep layers, 7–60× faster:
``benchmarks/results/conv_kernel_exceeds_input_cpu.md``), except
LeNet-5's fused conv → ReLU → pool blocks (:class:`ConvReLUMaxPool`).

* ``mlp``: 256→50→15→10, sigmoid, no bias (paper 001 §VI: 13,700 params on
  16×16×1 inputs). Flattens its input, so it needs 256 input features.
* ``lenet``: the DLG / Soteria LeNet (Zhu et al. 2019; paper 003 §6): four
  5×5 convs with 12 channels (strides 2, 2, 1, 1), sigmoid, one FC layer.
* ``lenet5``: the classic ReLU LeNet-5 (6, 16 channels; 120, 84 units); the
  engine's fast default for training on CPU.
* ``convnet``: the ConvNet of Geiping et al. (2020) that Soteria's public GS
  code attacks (inversefed's ``ConvNet``): eight 3×3 convolutions (width,
  2w, 2w, 4w, 4w, 4w, pool 3, 4w, 4w, pool 3), width 32, ReLU, no batch
  norm (so a single example's gradient is well defined; stated deviation;
  ``convnet_bn`` has it).
  Paper 003's Table 3 lists nine 5×5 convolutions instead; its ninth is the
  code's ``conv6`` written twice (a repeated key, which the code's
  OrderedDict keeps once), and we follow the code's 3×3 kernels, as the
  authors ran it. At 32×32 both give L = 1152 FC inputs. Flax's LeCun
  normal init by default; ``ConvNet(init_scheme="torch",
  input_standardise=(mean, std))`` is the model the authors attacked
  (PyTorch's default init, standardised input), from which GS converges
  where it does not from LeCun's (``benchmarks/results/gs_convnet_diagnosis.md``).
* ``convnet_bn``: the same ConvNet with batch norm after every convolution,
  as inversefed builds it (:class:`BatchNorm`: the running statistics are
  leaves of the parameters, so they travel with the upload and are averaged
  by the server; see :class:`BatchNorm`).
* ``conv2``: LEAF/FEMNIST Conv-2 (paper 002 §6): conv5×5·32, pool, conv5×5·64,
  pool, FC 2048, FC classes.
* ``alexnet``: a 32×32 AlexNet (5 convs 64-192-384-256-256, FC 4096-4096).
* ``vgg11`` / ``vgg16``: CIFAR VGG (Simonyan & Zisserman configs A/D) with a
  512→classes classifier, no batch norm, He-normal convolutions (see :class:`VGG`).
* ``resnet10``: CIFAR ResNet with BasicBlocks [1, 1, 1, 1] (≈4.9 M params as
  in paper 000 Table 2); GroupNorm instead of BatchNorm so clients need no
  mutable batch statistics (stated deviation).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Callable, ContextManager, Iterator, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedsim import random_draws
from fedsim.suggest import did_you_mean

ModelFactory = Callable[..., nn.Module]
MODEL_REGISTRY: dict[str, ModelFactory] = {}


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def max_pool(x: jax.Array, window: int) -> jax.Array:
    """Non-overlapping ``window``×``window`` max pooling (stride = window), NHWC.

    Same forward values as ``nn.max_pool(x, (k, k), strides=(k, k))`` (trailing
    rows/columns that do not fill a window are dropped, like "VALID"), but
    computed as an elementwise maximum over the k² strided slices. Why: on
    XLA:CPU the gradient of ``reduce_window`` (``select_and_scatter``) is slow: with
    it, LeNet-5's first layer (conv + pool, forward + gradient) took 1.2× as
    long (``benchmarks/results/control_flow_cpu.md``, first-layer table).

    Its derivative is a custom JVP: the slice that won each window (the
    first on a tie) is found once, beside the maximum, and the tangent of
    that slice is the output's; reverse mode transposes that selection, and
    forward mode (GraSP's Hessian-gradient product) and higher orders work as
    for any JAX function. Why not JAX's own rule for ``jnp.maximum``: it
    finds the winner by comparing each input with the maximum for equality,
    and under ``jit`` XLA may compute the two from separately fused copies of
    the input that round differently, so that no input equals the maximum
    and the window's gradient is lost. That happened behind batch norm:
    ``convnet_bn`` at batch 5 had jitted gradients up to 0.79 away from the
    eager ones with JAX's rule
    (``tests/fedsim/test_models.py::test_max_pool_gradient_is_the_same_jitted_behind_batch_norm``).
    The winner's cotangent is what ``select_and_scatter`` gives; where two
    inputs tie, the first takes it all (``jnp.maximum`` split it between
    them; ties among positive ReLU outputs have probability zero, and tied
    zeros get no gradient through the ReLU anyway).
    """
    return _max_pool_winner(x, window)[0]


def _max_pool_slices(x: jax.Array, k: int) -> list[jax.Array]:
    h, w = (x.shape[1] // k) * k, (x.shape[2] // k) * k
    x = x[:, :h, :w]
    return [x[:, i::k, j::k] for i in range(k) for j in range(k)]


def _max_pool_winner(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """(the pooled maximum, the index of the slice that holds it, first on a tie)."""
    slices = _max_pool_slices(x, k)
    out, winner = slices[0], jnp.zeros(slices[0].shape, jnp.int32)
    for t, s in enumerate(slices[1:], start=1):
        better = s > out
        out = jnp.where(better, s, out)
        winner = jnp.where(better, t, winner)
    return out, winner


@max_pool.defjvp
def _max_pool_jvp(window: int, primals, tangents):
    (x,), (dx,) = primals, tangents
    out, winner = _max_pool_winner(x, window)
    d_slices = _max_pool_slices(dx, window)
    d_out = d_slices[0]
    for t, d in enumerate(d_slices[1:], start=1):
        d_out = jnp.where(winner == t, d, d_out)
    return out, d_out


def _phase_kernel(kernel: jax.Array) -> jax.Array:
    """Rewrite a K×K stride-1 kernel for 2×2 space-to-depth inputs and outputs.

    Output pixel (2i+p, 2j+q) of a VALID conv reads input pixels
    (2i+p+u, 2j+q+v), which lie in input 2×2 blocks i..i+K//2; so the same
    conv on block-packed inputs (4·C channels, phase-major) producing
    block-packed outputs (4·O channels, one group of O per output phase) is a
    (K//2+1)×(K//2+1) VALID conv whose kernel holds W[2a+qi−pi, 2b+qj−pj]
    (zero where that falls outside the K×K window).
    """
    K, _, C, O = kernel.shape
    A = K // 2 + 1
    a, b, qi, qj, pi, pj = np.ix_(range(A), range(A), range(2), range(2), range(2), range(2))
    u, v = 2 * a + qi - pi, 2 * b + qj - pj
    inside = (u >= 0) & (u < K) & (v >= 0) & (v < K)
    flat = np.where(inside, np.clip(u, 0, K - 1) * K + np.clip(v, 0, K - 1), 0)
    g = kernel.reshape(K * K, C, O)[flat] * inside[..., None, None]  # a,b,qi,qj,pi,pj,C,O
    return g.transpose(0, 1, 2, 3, 6, 4, 5, 7).reshape(A, A, 4 * C, 4 * O)


def conv_relu_maxpool(x: jax.Array, kernel: jax.Array, bias: jax.Array,
                      padding: str = "VALID") -> jax.Array:
    """``max_pool(relu(conv(x, kernel) + bias), 2)`` for a stride-1 K×K conv, NHWC.

    On XLA:CPU, when the (padded) input height and width are even, computes it
    as one conv on 2×2 space-to-depth inputs whose output channels hold the
    four pooling phases (:func:`_phase_kernel`), followed by a max over the
    phases; since ReLU and "+ bias" are monotone and the bias is the same in
    every phase, ``relu(max + b)`` equals the max of ``relu(· + b)``. Why: a
    LeNet-5 first layer (1 input channel, 6 outputs) is a GEMM with K = 25,
    N = 6 that XLA:CPU runs far below its matmul rate; packed, the first
    layer's forward + weight gradient ran 2.2× faster than conv + sliced pool,
    and two LeNet-5 SGD steps 1.95× faster than with the plain flax layers
    (``benchmarks/results/control_flow_cpu.md``). Other backends and odd sizes use
    the plain conv → ReLU → :func:`max_pool`. Values agree to float rounding
    (tested against flax's ``nn.Conv`` + ``nn.max_pool``).
    """
    K = kernel.shape[0]
    if padding == "SAME":
        lo = (K - 1) // 2
        x = jnp.pad(x, ((0, 0), (lo, K - 1 - lo), (lo, K - 1 - lo), (0, 0)))
    elif padding != "VALID":
        raise ValueError(f"conv_relu_maxpool: padding must be 'SAME' or 'VALID', got {padding!r}")
    n, H, W, C = x.shape
    dn = ("NHWC", "HWIO", "NHWC")
    if jax.default_backend() != "cpu" or H % 2 or W % 2 or H < K or W < K:
        y = jax.lax.conv_general_dilated(x, kernel, (1, 1), "VALID", dimension_numbers=dn)
        return max_pool(jax.nn.relu(y + bias), 2)
    packed = x.reshape(n, H // 2, 2, W // 2, 2, C).transpose(0, 1, 3, 2, 4, 5)
    packed = packed.reshape(n, H // 2, W // 2, 4 * C)
    if _fused_uses_im2col(n):
        y = conv_im2col(packed, _phase_kernel(kernel), (1, 1), "VALID")
    else:
        y = jax.lax.conv_general_dilated(packed, _phase_kernel(kernel), (1, 1), "VALID",
                                         dimension_numbers=dn)
    y = y.reshape(y.shape[:3] + (4, kernel.shape[3]))
    return jax.nn.relu(jnp.max(y, axis=3) + bias)


# Largest batch (as the layer sees it: per example under ``vmap``) for which
# :class:`Conv` uses :func:`conv_im2col` on CPU; above it XLA's own convolution.
# Read off benchmarks/results/conv_im2col_cpu.md: im2col wins for attacks (second
# order, vmapped over victims/restarts: 2-24x) at dummy batches 1 and 4, while
# plain training steps at batch >= 8 take 1.1-1.6x as long with it on the DLG
# LeNet, ConvNet and Conv-2 (ConvNet 6 % at batch 4: the price of covering
# batch-4 attacks). Read at trace time: changing it does not affect functions
# already jitted. To force one implementation for a block, use conv_implementation.
IM2COL_MAX_BATCH = 4

# Which convolution :class:`Conv` traces on CPU: "auto" (the rule in
# :func:`uses_im2col`), "xla" or "im2col" at every layer. Set it with
# :func:`conv_implementation`.
CONV_IMPLEMENTATION = "auto"
CONV_IMPLEMENTATIONS = ("auto", "xla", "im2col")

# Largest per-instance batch for which :class:`Conv` uses im2col on CPU when
# it is traced inside :func:`vmapped_instances` (a ``vmap`` over instances:
# victims, restarts, clients). Under such a vmap the kernel, or its gradient,
# carries the instance axis, and XLA:CPU computes a convolution with a batched
# kernel as a grouped convolution, its slow path. Measured in
# benchmarks/results/vmapped_conv_cpu.md.
VMAPPED_IM2COL_MAX_BATCH = 64

# Whether the model is being traced inside vmapped_instances() (a depth, so
# blocks nest).
_VMAPPED_DEPTH = 0


def uses_im2col(batch: int, height: int, width: int, kh: int, kw: int) -> bool:
    """Whether :class:`Conv` computes a layer by im2col (on CPU, at trace time).

    Under ``"auto"``: when the layer sees a batch of at most
    :data:`IM2COL_MAX_BATCH`, or when its kernel is larger than its (unpadded)
    input in a spatial dimension. The second case is VGG's deep layers (a 3×3
    kernel on 2×2 or 1×1 maps): there XLA:CPU's convolution ran at 2–16
    GFLOP/s against im2col's 105–198, 7–60× slower at batches 20 and 500,
    and VGG-11 at 16×16 took 24× as long for a forward pass over 500 images
    and 13× for a training step at batch 20
    (``benchmarks/results/conv_kernel_exceeds_input_cpu.md``). At 4×4 and
    larger inputs neither implementation was more than 3× faster than the
    other, XLA's mostly the faster at batch 500.
    """
    if CONV_IMPLEMENTATION != "auto":
        return CONV_IMPLEMENTATION == "im2col"
    if _VMAPPED_DEPTH and batch <= VMAPPED_IM2COL_MAX_BATCH:
        return True
    return batch <= IM2COL_MAX_BATCH or kh > height or kw > width


def _fused_uses_im2col(batch: int) -> bool:
    """Whether :func:`conv_relu_maxpool`'s packed conv is an im2col GEMM (CPU).

    Only inside :func:`vmapped_instances` (per-instance batch ≤
    :data:`VMAPPED_IM2COL_MAX_BATCH`) or under ``conv_implementation("im2col")``:
    outside a vmap the packed XLA conv is the measured fast path
    (``benchmarks/results/control_flow_cpu.md``).
    """
    if CONV_IMPLEMENTATION != "auto":
        return CONV_IMPLEMENTATION == "im2col"
    return bool(_VMAPPED_DEPTH) and batch <= VMAPPED_IM2COL_MAX_BATCH


def vmapped_instances() -> ContextManager[None]:
    """Tell :class:`Conv` that what is traced inside runs under a ``vmap`` over instances.

    Instances are gradient-inversion victims and restarts, or a cohort's
    clients: each has its own kernel, or differentiates with respect to the
    kernel (a [V]-batched kernel gradient). XLA:CPU computes a convolution
    with a batched kernel as a grouped convolution, far below its dense rate,
    so inside the block :class:`Conv` uses im2col up to a per-instance batch
    of :data:`VMAPPED_IM2COL_MAX_BATCH`
    (``benchmarks/results/vmapped_conv_cpu.md``). Read at trace time,
    like :func:`im2col_max_batch`: wrap the function that ``jax.jit`` traces,
    not its call. Blocks nest; :func:`conv_implementation` overrides it.
    """
    return _module_setting("_VMAPPED_DEPTH", _VMAPPED_DEPTH + 1)


def trace_settings() -> tuple:
    """What :class:`Conv` reads when traced: :data:`CONV_IMPLEMENTATION`,
    :data:`IM2COL_MAX_BATCH`, :data:`VMAPPED_IM2COL_MAX_BATCH` and the
    :func:`vmapped_instances` depth.

    A function jitted once per model (a module-level ``jax.jit`` with a static
    ``apply_fn``) takes this as a static argument too, so that inside
    :func:`im2col_max_batch` or :func:`conv_implementation` it traces again
    instead of reusing the other implementation's executable.
    """
    return (CONV_IMPLEMENTATION, IM2COL_MAX_BATCH, VMAPPED_IM2COL_MAX_BATCH, _VMAPPED_DEPTH)


def conv_settings() -> dict:
    """The convolution rule :class:`Conv` traces under now, by name, for a results
    file: :data:`CONV_IMPLEMENTATION`, :data:`IM2COL_MAX_BATCH` and
    :data:`VMAPPED_IM2COL_MAX_BATCH`.

    The two paths add the same products in another order, and an attack's
    hundreds of iterations amplify that: part B of the chu2023 reproduction
    moved by up to 0.52 dB PSNR per victim between them
    (``benchmarks/results/chu2023_attack_drift.md``). The commit fixes the
    rule unless a caller overrides it (:func:`conv_implementation`), so
    reproductions record it beside the commit.
    """
    return {"implementation": CONV_IMPLEMENTATION, "im2col_max_batch": IM2COL_MAX_BATCH,
            "vmapped_im2col_max_batch": VMAPPED_IM2COL_MAX_BATCH}


def conv_implementation(name: str) -> ContextManager[None]:
    """Make :class:`Conv` trace ``name`` ("auto", "xla" or "im2col") inside the block.

    Like :func:`im2col_max_batch`, read when a model is traced: trace a fresh
    function inside the block. Restored on exit.

    Raises:
        ValueError: ``name`` is not one of :data:`CONV_IMPLEMENTATIONS`.
    """
    if name not in CONV_IMPLEMENTATIONS:
        raise ValueError(f"conv_implementation: name must be one of {CONV_IMPLEMENTATIONS}, "
                         f"got {name!r}")
    return _module_setting("CONV_IMPLEMENTATION", name)


def im2col_max_batch(limit: int) -> ContextManager[None]:
    """Set :data:`IM2COL_MAX_BATCH` to ``limit`` inside the block; restore it on exit.

    Under the default ``"auto"`` implementation (:func:`uses_im2col`), 0 makes
    :class:`Conv` use XLA's convolution at every batch except in layers whose
    kernel exceeds their input, a value above any batch makes it use im2col at
    every batch (on CPU); :func:`conv_implementation` forces one everywhere.
    The limit is read when a model is traced, so the block changes only what
    is traced inside it: a function jitted before the block keeps its
    implementation. Trace a fresh function there (``jax.jit(lambda *a: f(*a))``, a fresh
    ``make_apply_fn``), as ``benchmarks/conv_im2col_cpu.py`` does.

    Raises:
        ValueError: ``limit`` is not an integer >= 0.
    """
    return _module_setting("IM2COL_MAX_BATCH", _batch_limit("im2col_max_batch", limit))


def vmapped_im2col_max_batch(limit: int) -> ContextManager[None]:
    """Set :data:`VMAPPED_IM2COL_MAX_BATCH` to ``limit`` inside the block; restore it on exit.

    0 switches :func:`vmapped_instances` off (the batch rule alone decides, as
    before it existed); read at trace time, like :func:`im2col_max_batch`.

    Raises:
        ValueError: ``limit`` is not an integer >= 0.
    """
    return _module_setting("VMAPPED_IM2COL_MAX_BATCH",
                           _batch_limit("vmapped_im2col_max_batch", limit))


@contextlib.contextmanager
def _module_setting(name: str, value) -> Iterator[None]:
    """Set this module's setting ``name`` to ``value`` inside the block; restore it on exit."""
    before = globals()[name]
    globals()[name] = value
    try:
        yield
    finally:
        globals()[name] = before


def _batch_limit(name: str, limit) -> int:
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0:
        raise ValueError(f"{name}: limit must be an integer >= 0, got {limit!r}")
    return int(limit)


def _pairs(padding, in_hw, window, strides):
    """nn.Conv's ``padding`` (int, "SAME", "VALID" or (lo, hi) pairs) as (lo, hi) pairs."""
    if isinstance(padding, str):
        return jax.lax.padtype_to_pads(in_hw, window, strides, padding)
    if isinstance(padding, int):
        return [(padding, padding)] * len(window)
    return [(p, p) if isinstance(p, int) else tuple(p) for p in padding]


def conv_im2col(x: jax.Array, kernel: jax.Array, strides=(1, 1), padding="SAME") -> jax.Array:
    """2-D convolution (NHWC, HWIO, no bias) as one patch matrix times the kernel.

    The patch matrix is the K_h·K_w strided slices of the padded input,
    concatenated on the channel axis (kernel-position-major, like
    ``kernel.reshape(K_h·K_w·C, O)``); its gradient is slices and adds, and the
    product is one GEMM. Why: on XLA:CPU the convolution's gradients, and above
    all second-order gradients under ``vmap`` (gradient-inversion attacks
    vectorised over victims and restarts), run far below the matmul rate at
    small batch: see ``benchmarks/results/conv_im2col_cpu.md``. Same values as
    ``lax.conv_general_dilated`` to float rounding (tested).
    """
    if x.ndim != 4 or kernel.ndim != 4 or x.shape[-1] != kernel.shape[2]:
        raise ValueError(f"conv_im2col: needs x [N, H, W, C] and kernel [K_h, K_w, C, O] with "
                         f"the same C; got x {tuple(x.shape)}, kernel {tuple(kernel.shape)}")
    kh, kw, c, o = kernel.shape
    sh, sw = (strides, strides) if isinstance(strides, int) else tuple(strides)
    (ph, pw) = _pairs(padding, x.shape[1:3], (kh, kw), (sh, sw))
    xp = jnp.pad(x, ((0, 0), tuple(ph), tuple(pw), (0, 0)))
    if xp.shape[1] < kh or xp.shape[2] < kw:
        raise ValueError(f"conv_im2col: kernel {kh}×{kw} is larger than the padded input "
                         f"{xp.shape[1]}×{xp.shape[2]} (x {tuple(x.shape)}, padding {padding!r})")
    ho = (xp.shape[1] - kh) // sh + 1
    wo = (xp.shape[2] - kw) // sw + 1
    cols = [xp[:, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw, :]
            for i in range(kh) for j in range(kw)]
    patches = cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)
    return patches @ kernel.reshape(kh * kw * c, o)


class Conv(nn.Module):
    """Drop-in for ``nn.Conv`` (2-D, NHWC): same parameter names, shapes and initialisers.

    On CPU, for a batch of at most :data:`IM2COL_MAX_BATCH` (the batch the
    layer sees, i.e. per example under ``vmap``) or a kernel larger than the
    input (:func:`uses_im2col`), it computes :func:`conv_im2col`; otherwise
    ``lax.conv_general_dilated``. The choice is made when the model is traced.
    Named ``Conv`` so that flax names its instances ``Conv_i`` as it names
    ``nn.Conv``'s: a model switching to it keeps its parameter tree and,
    from the same key, its initial values (tested). Only 2-D convolutions without dilation or feature groups, which
    is all the registry uses.
    """

    features: int
    kernel_size: Sequence[int]
    strides: int | Sequence[int] = 1
    padding: object = "SAME"
    use_bias: bool = True
    kernel_init: Callable = nn.initializers.lecun_normal()
    bias_init: Callable = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x):
        ks = self.kernel_size
        kh, kw = (ks, ks) if isinstance(ks, int) else tuple(ks)
        kernel = self.param("kernel", self.kernel_init, (kh, kw, x.shape[-1], self.features),
                            jnp.float32)
        strides = (self.strides,) * 2 if isinstance(self.strides, int) else tuple(self.strides)
        if jax.default_backend() == "cpu" and uses_im2col(x.shape[0], x.shape[1], x.shape[2],
                                                          kh, kw):
            y = conv_im2col(x, kernel, strides, self.padding)
        else:
            pads = _pairs(self.padding, x.shape[1:3], (kh, kw), strides)
            y = jax.lax.conv_general_dilated(x, kernel, strides, pads,
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
        if self.use_bias:
            y = y + self.param("bias", self.bias_init, (self.features,), jnp.float32)
        return y


class ConvReLUMaxPool(nn.Module):
    """Conv (stride 1, with bias) → ReLU → 2×2 max pool; params as ``nn.Conv``'s.

    Same parameter names, shapes and initialisers as ``nn.Conv`` (so a model
    using it under the name ``Conv_i`` has the same parameter tree and, from
    the same key, the same initial values); computed by
    :func:`conv_relu_maxpool`.
    """

    features: int
    kernel_size: int
    padding: str = "VALID"

    @nn.compact
    def __call__(self, x):
        k = self.kernel_size
        kernel = self.param("kernel", nn.initializers.lecun_normal(),
                            (k, k, x.shape[-1], self.features), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
        return conv_relu_maxpool(x, kernel, bias, self.padding)


#: The leaves of a :class:`BatchNorm` that hold its running statistics: no
#: gradient reaches them; local training writes them (:func:`batch_norm_updates`).
RUNNING_STATS = ("running_mean", "running_var")
#: The collection a :class:`BatchNorm` in training mode writes its updated
#: running statistics to (same module path and leaf names as the parameters).
RUNNING_STATS_UPDATE = "running_stats_update"


class BatchNorm(nn.Module):
    """Batch normalisation (Ioffe & Szegedy 2015) over all axes but the last,
    with its running statistics kept as leaves of the parameters.

    Why parameters and not flax's ``batch_stats`` collection: in FL the running
    statistics are part of the model a client sends back (PyTorch FedAvg code
    averages its ``state_dict``, batch-norm buffers included). As leaves of the
    params pytree they are in the client's update Δ, so the server averages
    them like every weight (weighted as the updates), upload defenses act on
    them too (DP-FedAvg's clip and noise cover them: they are computed from the
    client's data), checkpoints and every cohort strategy carry them, and an
    observer sees them, as a server does. No gradient reaches them
    (``running_mean`` and ``running_var`` are not used in training mode and
    are behind ``stop_gradient`` in evaluation mode); local training
    overwrites them after each step with what this module wrote to
    :data:`RUNNING_STATS_UPDATE` (:func:`batch_norm_updates`), and the server
    applies their averaged Δ without its optimizer.

    Training mode (``train=True``, the default, what ``make_apply_fn`` and so
    the attacks see) normalises by the batch's mean and biased variance over
    the examples ``mask`` marks (all where None; padding must not move the
    statistics) and writes ``(1 − momentum)·running + momentum·batch`` with
    the unbiased batch variance, as ``torch.nn.BatchNorm2d`` does (momentum
    0.1, ε = 1e-5). Evaluation mode (``train=False``) normalises by the
    running statistics; a running variance that upload noise drove below 0 is
    read as 0 (PyTorch would give NaN).
    """

    momentum: float = 0.1
    epsilon: float = 1e-5

    @nn.compact
    def __call__(self, x, train: bool = True, mask=None):
        c = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones_init(), (c,), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros_init(), (c,), jnp.float32)
        running_mean = self.param("running_mean", nn.initializers.zeros_init(), (c,), jnp.float32)
        running_var = self.param("running_var", nn.initializers.ones_init(), (c,), jnp.float32)
        if train:
            w = jnp.ones(x.shape[:1], x.dtype) if mask is None else mask.astype(x.dtype)
            w = jnp.broadcast_to(w.reshape((-1,) + (1,) * (x.ndim - 2)), x.shape[:-1])[..., None]
            axes = tuple(range(x.ndim - 1))
            n = jnp.sum(w, axis=axes)
            mean = jnp.sum(w * x, axis=axes) / jnp.maximum(n, 1.0)
            var = jnp.sum(w * jnp.square(x - mean), axis=axes) / jnp.maximum(n, 1.0)
            unbiased = var * n / jnp.maximum(n - 1.0, 1.0)
            m = self.momentum
            self.sow(RUNNING_STATS_UPDATE, "running_mean",
                     jax.lax.stop_gradient((1 - m) * running_mean + m * mean))
            self.sow(RUNNING_STATS_UPDATE, "running_var",
                     jax.lax.stop_gradient((1 - m) * running_var + m * unbiased))
        else:
            mean = jax.lax.stop_gradient(running_mean)
            var = jnp.maximum(jax.lax.stop_gradient(running_var), 0.0)
        return (x - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias


def running_stats_mask(params) -> object:
    """A pytree like ``params``: True at the :data:`RUNNING_STATS` leaves."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: getattr(path[-1], "key", None) in RUNNING_STATS, params)


def has_batch_norm(params) -> bool:
    """Whether ``params`` hold any :class:`BatchNorm`'s running statistics."""
    return any(jax.tree_util.tree_leaves(running_stats_mask(params)))


def make_train_fn(model: nn.Module) -> Callable:
    """``train_fn(params, x, mask) -> (logits, updates)`` of a model with
    :class:`BatchNorm`: training mode over the examples ``mask`` marks, and
    the running statistics it wrote (:func:`batch_norm_updates` applies them)."""

    def train_fn(params, x, mask):
        logits, written = model.apply({"params": params}, x, train=True, mask=mask,
                                      mutable=[RUNNING_STATS_UPDATE])
        return logits, written.get(RUNNING_STATS_UPDATE, {})

    return train_fn


def batch_norm_updates(params, written):
    """``params`` with each running statistic replaced by what training wrote
    (``make_train_fn``'s second output, sown values at the same paths)."""
    from flax import traverse_util

    flat = traverse_util.flatten_dict(params)
    for path, values in traverse_util.flatten_dict(written).items():
        if path not in flat:
            raise ValueError(f"batch_norm_updates: {'/'.join(path)} is not a parameter")
        flat[path] = values[-1]  # sow appends: the one write of this forward pass
    return traverse_util.unflatten_dict(flat)


def make_eval_fn(model: nn.Module) -> Callable[[object, jax.Array], jax.Array]:
    """``eval_fn(params, x) -> logits``: a :class:`BatchNorm` model in
    evaluation mode (running statistics); any other model as ``make_apply_fn``."""

    def eval_fn(params, x):
        if has_batch_norm(params):
            return model.apply({"params": params}, x, train=False)
        return model.apply({"params": params}, x)

    return eval_fn


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


@register_model("mlp_2nn")
class MLP2NN(nn.Module):
    """McMahan et al. 2017's "2NN" (§3): two hidden layers of 200 ReLU units, with biases.

    199,210 parameters on 28×28 MNIST, the paper's count. The first layer is a
    biased fully connected layer on the raw pixels, the setting in which the
    input can be read off the gradient in closed form
    (:mod:`attacks.analytic`).
    """

    num_classes: int = 10
    hidden: Sequence[int] = (200, 200)

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_classes)(x)


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
            uniform = lambda key, shape, dtype=jnp.float32: random_draws.uniform(  # noqa: E731
                key, shape, dtype, -s, s)
            kw = {"kernel_init": uniform, "bias_init": uniform}
        for stride in (2, 2, 1, 1):
            x = nn.sigmoid(Conv(12, (5, 5), strides=stride, padding=2, **kw)(x))
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(self.num_classes, **kw)(x)


@register_model("lenet5")
class LeNet5(nn.Module):
    """Classic ReLU LeNet-5 with max pooling."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        # conv → ReLU → pool fused for speed on CPU; same params as nn.Conv.
        padding = "SAME" if x.shape[1] < 32 else "VALID"
        x = ConvReLUMaxPool(6, 5, padding, name="Conv_0")(x)
        x = ConvReLUMaxPool(16, 5, "VALID", name="Conv_1")(x)
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(120)(x))
        x = nn.relu(nn.Dense(84)(x))
        return nn.Dense(self.num_classes)(x)


@register_model("lenet5_1998")
class LeNet5LeCun(nn.Module):
    """LeNet-5 of LeCun et al. 1998 (paper 000's "LeNet [33]"): tanh, average pooling.

    C1 conv 6@5×5 → tanh → S2 2×2 average subsampling → C3 conv 16@5×5 → tanh
    → S4 → C5 120 → tanh → F6 84 → tanh → 10 logits: the 1998 layer sizes
    with the squashing function tanh and average subsampling (what ``lenet5``
    replaces by ReLU and max pooling). Deviations from 1998, as in common
    re-implementations: S2/S4 are plain averages (no trainable coefficient and
    bias per map), C3 connects to all 6 maps (no partial connection table), and
    the output is a dense layer, not RBF units. With full C3 the parameter count
    is 62,006 for 32×32×3 inputs, paper 000's "6.20e4" (Table 2); 28×28 inputs
    are padded ("SAME") in C1, as the 1998 net was fed 32×32 fields.
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        padding = "SAME" if x.shape[1] < 32 else "VALID"
        x = nn.avg_pool(jnp.tanh(Conv(6, (5, 5), padding=padding)(x)), (2, 2), (2, 2))
        x = nn.avg_pool(jnp.tanh(Conv(16, (5, 5), padding="VALID")(x)), (2, 2), (2, 2))
        x = x.reshape(x.shape[0], -1)
        x = jnp.tanh(nn.Dense(120)(x))
        x = jnp.tanh(nn.Dense(84)(x))
        return nn.Dense(self.num_classes)(x)


def _torch_default_inits(fan_in: int) -> dict:
    """PyTorch's default Conv2d/Linear init: kernel and bias from U(±1/√fan_in).

    (``kaiming_uniform_(a=√5)`` has exactly that bound; so has the bias rule.)
    """
    bound = 1.0 / float(fan_in) ** 0.5
    uniform = lambda key, shape, dtype=jnp.float32: random_draws.uniform(  # same bits
        key, shape, dtype, -bound, bound)
    return {"kernel_init": uniform, "bias_init": uniform}


CONVNET_INITS = ("lecun", "he", "torch")


@register_model("convnet")
class ConvNet(nn.Module):
    """Geiping et al.'s ConvNet (width 32), ReLU, batch norm where ``batch_norm``.

    As in inversefed's code, which Soteria's GS experiments use: eight 3×3
    convolutions. Paper 003 Table 3 lists nine 5×5 ones (module docstring).
    inversefed's ``construct_model("ConvNet")`` builds width 64; we default to
    Table 3's width 32.

    Attributes:
      init_scheme: ``"lecun"`` (flax's default: LeCun normal kernels, zero biases;
        the registry's ``convnet``), ``"he"`` (He normal kernels, zero
        biases) or ``"torch"`` (kernels and biases from U(±1/√fan_in),
        PyTorch's default, which the authors' inversefed ConvNet starts from).
      input_standardise: ``(mean, std)`` the model subtracts from and divides
        its input by before the first convolution, or None. inversefed feeds
        standardised images; doing it inside the model keeps an attack's
        dummy, its box constraint and the metrics in pixel space.
      batch_norm: a :class:`BatchNorm` after every convolution, before its
        ReLU, as inversefed's ConvNet has (the registry's ``convnet_bn``).
        Its call then takes ``train`` and ``mask`` (:class:`BatchNorm`).
    """

    num_classes: int = 10
    width: int = 32
    init_scheme: str = "lecun"
    input_standardise: tuple | None = None
    batch_norm: bool = False

    def _inits(self, fan_in: int) -> dict:
        if self.init_scheme == "lecun":
            return {}
        if self.init_scheme == "he":
            return {"kernel_init": nn.initializers.he_normal()}
        if self.init_scheme == "torch":
            return _torch_default_inits(fan_in)
        raise ValueError(f"ConvNet init_scheme {self.init_scheme!r}; allowed: "
                         f"{', '.join(CONVNET_INITS)}")

    @nn.compact
    def __call__(self, x, train: bool = True, mask=None):
        if self.input_standardise is not None:
            try:
                mean, std = (float(v) for v in self.input_standardise)
            except (TypeError, ValueError):
                raise ValueError("ConvNet input_standardise: expected (mean, std), got "
                                 f"{self.input_standardise!r}") from None
            if not (math.isfinite(mean) and math.isfinite(std) and std > 0):
                raise ValueError("ConvNet input_standardise: mean must be finite and std "
                                 f"finite and > 0, got {self.input_standardise!r}")
            x = (x - mean) / std
        w = self.width

        def block(x, ch):
            x = Conv(ch, (3, 3), padding=1, **self._inits(9 * x.shape[-1]))(x)
            if self.batch_norm:
                x = BatchNorm()(x, train, mask)
            return nn.relu(x)

        for ch in (w, 2 * w, 2 * w, 4 * w, 4 * w, 4 * w):
            x = block(x, ch)
        x = max_pool(x, 3)
        for ch in (4 * w, 4 * w):
            x = block(x, ch)
        x = max_pool(x, 3)
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(self.num_classes, **self._inits(x.shape[-1]))(x)


register_model("convnet_bn")(lambda num_classes=10: ConvNet(num_classes=num_classes,
                                                            batch_norm=True))


@register_model("conv2")
class Conv2(nn.Module):
    """LEAF's FEMNIST CNN ("Conv-2" in paper 002)."""

    num_classes: int = 62

    @nn.compact
    def __call__(self, x):
        x = nn.relu(Conv(32, (5, 5), padding="SAME")(x))
        x = max_pool(x, 2)
        x = nn.relu(Conv(64, (5, 5), padding="SAME")(x))
        x = max_pool(x, 2)
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(2048)(x))
        return nn.Dense(self.num_classes)(x)


@register_model("alexnet")
class AlexNet(nn.Module):
    """AlexNet sized for 32×32 inputs."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = nn.relu(Conv(64, (3, 3), strides=2, padding=1)(x))
        x = max_pool(x, 2)
        x = nn.relu(Conv(192, (3, 3), padding=1)(x))
        x = max_pool(x, 2)
        x = nn.relu(Conv(384, (3, 3), padding=1)(x))
        x = nn.relu(Conv(256, (3, 3), padding=1)(x))
        x = nn.relu(Conv(256, (3, 3), padding=1)(x))
        x = max_pool(x, 2)
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
    """CIFAR-style VGG without batch norm.

    Its convolutions start from He et al. (2015)'s normal init (variance
    2/fan-in, the ReLU forward case of their Eq. 10), not flax's default
    LeCun normal (1/fan-in), which halves the signal's variance at each of
    the 8 ReLU layers (the last conv's output variance at init: 1.9e-5
    against 4.9e-3). From LeCun's, VGG-11 on 16×16 Fashion-MNIST kept its
    loss at 2.17–2.30 (chance 2.30) and its test accuracy at 0.09–0.20
    through 60 SGD steps at batch 200 and lr 0.02, 0.1 and 0.5; from He's it
    reached 0.42 (lr 0.02) and 0.38 (lr 0.1)
    (``benchmarks/diagnose_vgg_init.py`` → ``benchmarks/results/vgg_init.md``).
    Before 2026-11-26 the registry's VGGs used LeCun normal.
    """

    cfg: tuple = _VGG_CFG["vgg11"]
    num_classes: int = 10
    kernel_init: Callable = nn.initializers.he_normal()

    @nn.compact
    def __call__(self, x):
        for item in self.cfg:
            if item == "M":
                if x.shape[1] >= 2:
                    x = max_pool(x, 2)
            else:
                x = nn.relu(Conv(item, (3, 3), padding=1, kernel_init=self.kernel_init)(x))
        x = jnp.mean(x, axis=(1, 2))  # global pool: works for 16/28/32 inputs
        return nn.Dense(self.num_classes)(x)


register_model("vgg11")(lambda num_classes=10: VGG(cfg=_VGG_CFG["vgg11"], num_classes=num_classes))
register_model("vgg16")(lambda num_classes=10: VGG(cfg=_VGG_CFG["vgg16"], num_classes=num_classes))


class _BasicBlock(nn.Module):
    channels: int
    stride: int

    @nn.compact
    def __call__(self, x):
        y = Conv(self.channels, (3, 3), strides=self.stride, padding=1, use_bias=False)(x)
        y = nn.relu(nn.GroupNorm(num_groups=min(32, self.channels))(y))
        y = Conv(self.channels, (3, 3), padding=1, use_bias=False)(y)
        y = nn.GroupNorm(num_groups=min(32, self.channels))(y)
        if self.stride != 1 or x.shape[-1] != self.channels:
            x = Conv(self.channels, (1, 1), strides=self.stride, use_bias=False)(x)
            x = nn.GroupNorm(num_groups=min(32, self.channels))(x)
        return nn.relu(x + y)


@register_model("resnet10")
class ResNet10(nn.Module):
    """CIFAR ResNet-10 (BasicBlock ×[1,1,1,1]) with GroupNorm."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = Conv(64, (3, 3), padding=1, use_bias=False)(x)
        x = nn.relu(nn.GroupNorm(num_groups=32)(x))
        for channels, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            x = _BasicBlock(channels, stride)(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes)(x)


def build_model(name: str, num_classes: int = 10) -> nn.Module:
    """Build a registered model.

    Raises:
      ValueError: for an unknown model name (the message lists known names), or
        a ``num_classes`` that is not an integer >= 1.
    """
    if name not in MODEL_REGISTRY:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(sorted(MODEL_REGISTRY))}"
                         f"{did_you_mean(name, MODEL_REGISTRY)}")
    if isinstance(num_classes, (bool, np.bool_)) or not isinstance(num_classes, (int, np.integer)) \
            or num_classes < 1:
        # Accepted before, and init_params then blamed the input shape.
        raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
    return MODEL_REGISTRY[name](num_classes=int(num_classes))


def init_params(model: nn.Module, input_shape: Sequence[int], key: jax.Array):
    """Initialise ``model`` for inputs of shape ``input_shape`` (no batch dim).

    The initialisation runs as one jitted program per (model, input shape),
    not op by op: eagerly every initializer and every layer of the forward
    pass on zeros compiles its own small program (LeNet-5 at 28×28: 66 XLA
    compiles), each too short for the persistent compilation cache. Jitted,
    a first initialisation takes 0.13–0.28× the time, and 0.06–0.43× with
    the cache warm (``benchmarks/results/init_time_cpu.md``). The parameters are
    bit for bit the ones ``model.init`` gives eagerly
    (``tests/fedsim/test_models.py``). A model whose fields cannot be hashed
    (so cannot be a static argument) is initialised eagerly, as before.

    On CPU the program is compiled at XLA's backend optimisation level 2, not
    its default 3: at level 3 LLVM spends seconds on the random-number code
    of every multi-dimensional draw (threefry over a reshaped counter), which
    made the initialisation's compile most of its time (a first init takes
    0.19–0.46× the time at level 2); the program runs once, so its run time
    does not matter. The bits are the same: the tests compare
    them with the eager ``model.init``'s, compiled at the default level.
    ``benchmarks/init_time_cpu.py`` times both levels side by side.

    Raises:
      ValueError: when the model cannot take inputs of that shape (the message
        names the model and the shape, e.g. a shape given with a batch dim).
    """
    shape = tuple(input_shape) if isinstance(input_shape, (list, tuple)) else input_shape
    try:
        hash((model, shape))
        init = _init_jitted_cpu if jax.default_backend() == "cpu" else _init_jitted
    except TypeError:
        init = _init_eager
    try:
        return init(model, shape, key)
    except (ZeroDivisionError, TypeError, ValueError) as e:
        raise ValueError(f"{type(model).__name__} cannot be initialised for input_shape "
                         f"{shape} (one example, no batch dimension, e.g. "
                         f"(28, 28, 1)): {type(e).__name__}: {e}") from e


def _init_eager(model: nn.Module, input_shape: Sequence[int], key: jax.Array):
    return model.init(key, jnp.zeros((1, *input_shape), jnp.float32))["params"]


#: XLA options for the CPU initialisation program (see ``init_params``).
INIT_CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 2}

# One executable per (model, input shape): flax modules hash by their fields.
# Other backends keep XLA's defaults: the level-3 cost was measured on XLA:CPU only.
_init_jitted = jax.jit(_init_eager, static_argnums=(0, 1))
_init_jitted_cpu_options = jax.jit(_init_eager, static_argnums=(0, 1),
                                   compiler_options=INIT_CPU_COMPILER_OPTIONS)


def _init_jitted_cpu(model: nn.Module, input_shape: tuple, key: jax.Array):
    try:
        return _init_jitted_cpu_options(model, input_shape, key)
    except ValueError as e:
        # Inside another trace (jax.eval_shape, an outer jit) JAX refuses a nested
        # jit's compiler options; there the init is part of the outer program,
        # compiled at that program's options, so the plain jit is the same thing.
        if "compiler_options" not in str(e):
            raise
        return _init_jitted(model, input_shape, key)


def make_apply_fn(model: nn.Module) -> Callable[[object, jax.Array], jax.Array]:
    """``apply_fn(params, x) -> logits`` for a batch x [B, ...]."""

    def apply_fn(params, x):
        return model.apply({"params": params}, x)

    return apply_fn


def count_params(params) -> int:
    return int(sum(p.size for p in jax.tree_util.tree_leaves(params)))
