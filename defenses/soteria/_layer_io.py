"""Read and perturb one Dense layer inside any flax model's ``apply_fn``.

Soteria (Sun et al. 2021, paper 003 §4) needs, per example, the representation
r = f(X) entering the defended fully connected layer and the loss gradient
∂l/∂b with respect to that layer's output b = Wᵀr + bias. The engine only
hands a defense ``apply_fn(params, x) -> logits`` (a closure over a flax
module), so we reach inside it with :func:`flax.linen.intercept_methods`: the
interceptor sees every module call made while ``apply_fn`` runs, records the
input of the module at ``layer`` and optionally adds a (zero) perturbation to
its output. Differentiating the loss with respect to that zero perturbation
gives the per-example ∂l/∂b in ONE backward pass, for any position of the
layer in the network (not only the last layer).
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedsim import random_draws
from fedsim.typing import PyTree


def parse_layer(layer: str | tuple[str, ...]) -> tuple[str, ...]:
    """``"Dense_0"`` or ``"Block_1/Dense_0"`` -> the flax module path tuple."""
    if isinstance(layer, str):
        path = tuple(part for part in layer.split("/") if part)
    else:
        path = tuple(layer)
    if not path or not all(isinstance(p, str) for p in path):
        raise ValueError(f"soteria layer: expected a param path like 'Dense_0', got {layer!r}")
    return path


def layer_params(params: PyTree, path: tuple[str, ...]) -> dict:
    """The parameter dict of the module at ``path`` (must hold a 2-D ``kernel``).

    Raises:
      ValueError: if the path is absent or is not a Dense-like layer.
    """
    node = params
    for i, part in enumerate(path):
        if not isinstance(node, dict) or part not in node:
            where = "/".join(path[:i]) or "<root>"
            known = sorted(node) if isinstance(node, dict) else []
            raise ValueError(
                f"soteria layer {'/'.join(path)!r}: no {part!r} under {where}; "
                f"available: {known}")
        node = node[part]
    if not isinstance(node, dict) or "kernel" not in node or jnp.ndim(node["kernel"]) != 2:
        raise ValueError(
            f"soteria layer {'/'.join(path)!r} is not a fully connected layer "
            f"(needs a 2-D 'kernel'; got keys {sorted(node) if isinstance(node, dict) else node})")
    return node


def replace_layer(tree: PyTree, path: tuple[str, ...], name: str, value: jax.Array) -> PyTree:
    """A copy of ``tree`` with ``tree[path][name] = value`` (other leaves shared)."""
    if not path:
        out = dict(tree)
        out[name] = value
        return out
    out = dict(tree)
    out[path[0]] = replace_layer(tree[path[0]], path[1:], name, value)
    return out


def run_with_layer(apply_fn: Callable, params: PyTree, x: jax.Array,
                   path: str | tuple[str, ...], output_shift: jax.Array | None = None):
    """Run ``apply_fn(params, x)``, capturing the input of the layer at ``path``.

    Args:
      apply_fn: ``apply_fn(params, x) -> logits`` built on a flax module.
      params: model parameters.
      x: [B, ...] inputs.
      path: module path of the defended Dense layer: a tuple such as
        ``("Dense_0",)`` or a string such as ``"Dense_0"`` / ``"Block_1/Dense_0"``
        (:func:`parse_layer`).
      output_shift: optional [B, K] array added to that layer's output (used
        with zeros to differentiate the loss w.r.t. the layer output).

    Returns:
      ``(logits, r)`` with r [B, L] the layer input (the representation).

    Raises:
      ValueError: if the layer is never called or its input is not [B, L].
    """
    # A plain string would otherwise be read as a tuple of one-letter names.
    path = parse_layer(path)
    captured = []

    def interceptor(next_fun, args, kwargs, context):
        if context.method_name == "__call__" and context.module.path == path:
            captured.append(args[0])
            out = next_fun(*args, **kwargs)
            return out if output_shift is None else out + output_shift
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
        logits = apply_fn(params, x)
    if len(captured) != 1:
        raise ValueError(
            f"soteria layer {'/'.join(path)!r} was called {len(captured)} times in one "
            "forward pass; it must be called exactly once (check the layer path)")
    r = captured[0]
    if r.ndim != 2 or r.shape[0] != x.shape[0]:
        raise ValueError(
            f"soteria layer {'/'.join(path)!r}: its input has shape {r.shape}; expected "
            f"[batch={x.shape[0]}, features] (a Dense layer on flattened features)")
    return logits, r


def representation(apply_fn: Callable, params: PyTree, x: jax.Array,
                   path: str | tuple[str, ...]) -> jax.Array:
    """r = f(X): the [B, L] input of the defended layer (``path`` as in
    :func:`run_with_layer`)."""
    return run_with_layer(apply_fn, params, x, path)[1]


JACOBIAN_METHODS = ("batched", "per_example", "sketch")


def representation_jacobian(apply_fn: Callable, params: PyTree, x: jax.Array,
                            path: str | tuple[str, ...], chunk: int = 8,
                            method: str = "batched") -> jax.Array:
    """Per-example Jacobians ∇_X f of the representation: [B, L, N], N = input size.

    Two exact ways, same values (tested):

    * ``"batched"`` (default): ONE forward pass of the whole batch and L
      reverse passes (``jax.vmap`` over one-hot cotangents, ``chunk``
      features at a time). Row i of example j is ∂(Σ_b r_{b,i})/∂x_j, which
      equals ∂r_{j,i}/∂x_j where examples do not interact in the forward
      pass (every fedsim model but those with batch norm, such as
      ``convnet_bn``; see :func:`jacobian_row_norms` for those).
    * ``"per_example"``: ``jax.jacrev`` of each example (L rows in one
      vectorised reverse pass), mapped over examples in chunks of ``chunk``
      with ``lax.map``; needs no independence assumption.

    Raises:
      ValueError: for an unknown method.
    """
    if method == "sketch":
        raise ValueError("representation_jacobian: 'sketch' estimates only the row norms; "
                         "use jacobian_row_norms")
    if method == "per_example":
        def one(xj):
            def rep(v):
                return representation(apply_fn, params, v[None], path)[0]

            jac = jax.jacrev(rep)(xj)
            return jac.reshape(jac.shape[0], -1)

        return jax.lax.map(one, x, batch_size=min(chunk, x.shape[0]))
    if method != "batched":
        raise ValueError(f"soteria jacobian method {method!r}; allowed: "
                         f"{', '.join(JACOBIAN_METHODS)}")
    r, vjp = jax.vjp(lambda v: representation(apply_fn, params, v, path), x)
    num_features = r.shape[1]

    def rows(i):
        # Cotangent e_i for every example: the VJP is example j's row i.
        cot = jnp.zeros_like(r).at[:, i].set(1.0)
        (gx,) = vjp(cot)
        return gx.reshape(x.shape[0], -1)

    jac = jax.lax.map(rows, jnp.arange(num_features),
                      batch_size=max(1, min(chunk, num_features)))  # [L, B, N]
    return jnp.swapaxes(jac, 0, 1)


def jacobian_row_norms(apply_fn: Callable, params: PyTree, x: jax.Array,
                       path: str | tuple[str, ...], chunk: int = 8,
                       method: str = "batched", *, key: jax.Array | None = None,
                       probes: int = 16, example_mask: jax.Array | None = None) -> jax.Array:
    """‖∇_X rᵢ‖₂ per example and feature, [B, L], without keeping [B, L, N].

    ``"batched"`` and ``"per_example"`` give the exact row norms of
    :func:`representation_jacobian` (which documents them); with
    ``"batched"`` the norms are taken inside the map, so only ``chunk`` rows of
    the Jacobian exist at a time. Their cost is L reverse passes per batch
    (~100× a plain step for LeNet/ConvNet, ``benchmarks/results/soteria_speed.md``).

    Under batch statistics (a model with batch norm, whose ``apply_fn``
    normalises by the batch) examples interact, and ``"batched"`` gives the
    norm of ∂(Σ_b r_{b,i})/∂x_j, the sum over the batch's real examples b
    (``example_mask``): what the authors' public code computes (one backward
    pass of feature i summed over its batch), not the paper's per-example
    ∇_X fᵢ, which batch statistics leave undefined. ``example_mask`` [B]
    (``"batched"`` only; default all real) leaves padding rows out of that
    sum; their own norms are then 0. Without batch statistics it changes no
    real example's norm.

    ``"sketch"`` is an APPROXIMATION (not in the paper or the authors' code),
    for budget-limited training runs: since
    E_v[(∇_X rᵢ · v)²] = ‖∇_X rᵢ‖² for v ~ N(0, I_N), so ``probes`` forward-mode
    JVPs (all L features at once) estimate every squared norm; the relative
    error of a norm is about 1/√(2·probes) (18 % at 16 probes), which can
    change which features rank in the top ε. Needs ``key``.
    """
    if example_mask is not None and tuple(jnp.shape(example_mask)) != (x.shape[0],):
        raise ValueError(f"jacobian_row_norms: example_mask must have shape ({x.shape[0]},), "
                         f"one entry per row of x, got {tuple(jnp.shape(example_mask))}")
    if method == "sketch":
        if key is None:
            raise ValueError("soteria jacobian='sketch' needs a PRNG key")
        if int(probes) < 1:
            raise ValueError(f"soteria sketch probes must be >= 1, got {probes}")
        rep = lambda v: representation(apply_fn, params, v, path)  # noqa: E731
        vs = random_draws.normal(key, (int(probes), *x.shape), x.dtype)  # flat: compiles faster
        jv = jax.lax.map(lambda v: jax.jvp(rep, (x,), (v,))[1], vs,
                         batch_size=max(1, min(chunk, int(probes))))  # [k, B, L]
        return jnp.sqrt(jnp.mean(jv ** 2, axis=0))
    if method != "batched":
        jac = representation_jacobian(apply_fn, params, x, path, chunk, method)
        return jnp.sqrt(jnp.sum(jac ** 2, axis=-1))
    r, vjp = jax.vjp(lambda v: representation(apply_fn, params, v, path), x)
    num_features = r.shape[1]
    real = (jnp.ones(r.shape[:1], r.dtype) if example_mask is None
            else (example_mask > 0).astype(r.dtype))

    def row_norms(i):
        cot = jnp.zeros_like(r).at[:, i].set(real)
        (gx,) = vjp(cot)
        return jnp.sqrt(jnp.sum(gx.reshape(x.shape[0], -1) ** 2, axis=-1))

    norms = jax.lax.map(row_norms, jnp.arange(num_features),
                        batch_size=max(1, min(chunk, num_features)))  # [L, B]
    return norms.T
