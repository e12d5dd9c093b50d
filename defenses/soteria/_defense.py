"""The Soteria defense: perturb the defended FC layer's representation (paper 003).

Implements Alg 2 (local training with the defense) for a flax model: at every
local step the batch gradient's defended-layer kernel gradient is replaced by

    ∇W′ = Σ_j w_j · r′_j ⊗ ∂l_j/∂b_j,      w_j = mask_j / Σ mask

i.e. ∂l/∂b · r′ᵀ of Alg 2 line 10 per example, averaged exactly as the
engine's masked-mean loss averages the clean gradient (so p_fc = 0 returns the
clean gradient). r′ comes from Alg 1 (:mod:`defenses.soteria._scores`), with
∇_X f computed by ``jax.jacrev`` (vectorised over features, mapped over
examples). All other leaves, including the layer's bias gradient (∂l/∂b does
not involve r), are returned unchanged.

Guarantee (Thm 1): any reconstruction X′ consistent with r′ satisfies
‖X − X′‖₂ ≥ ‖r − r′‖₂/‖∇_X f‖₂ (see :func:`defenses.soteria.certified_bound`);
FedAvg with the defense converges at O(1/T) under Thm 2's assumptions.

Deviations: ε is given as a rate p_fc (ε = round(p_fc·L) features) as in the
paper's experiments. The default ``score="exact"``, ``scope="example"`` is the
paper's Alg 1–2; ``score="code"``, ``scope="batch"`` is the authors' public
code (one mask per batch from summed ‖∇rᵢ‖/rᵢ). The replacement recomputes
∂l/∂b from the masked-mean cross-entropy, so it cannot be combined with an
"example"-stage defense (e.g. DP-SGD clipping) whose gradient it would
overwrite: the engine refuses the pair (``Defense.discards_example_stage``). With the exact Jacobian (default) the defense is deterministic and
the key is ignored; ``jacobian="sketch"`` (an approximation, see
:func:`defenses.soteria.jacobian_row_norms`) draws its probes from the key.

Under batch statistics (a model with batch norm, ``convnet_bn``), which the
paper does not treat: one example's r and ∂l/∂b depend on its whole batch, so
Alg 2's per-example gradient is not defined. With ``jacobian="batched"``
(``Defense.batch_statistics``) the engine runs it as the authors' code does
in its training mode: r, ∂l/∂b and the Jacobian row norms come from one
forward pass of the batch under its real examples' statistics, the norms
being those of each feature summed over the batch
(:func:`defenses.soteria.jacobian_row_norms`), and the kernel gradient is
still exactly ∂l/∂b · r′ᵀ, since the defended layer comes after every batch
norm (it is the last layer of ``convnet_bn``). ``"per_example"`` and
``"sketch"`` would run examples or probes through the batch's statistics
differently, so the engine refuses them there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from defenses.accounting._validation import check_positive_int
from defenses.dp._flat import check_mask
from defenses.soteria._layer_io import (JACOBIAN_METHODS, jacobian_row_norms, layer_params,
                                        parse_layer, replace_layer, run_with_layer)
from defenses.soteria._scores import SCOPES, SCORES, check_rate, perturb_representation
from fedsim.client import cross_entropy
from fedsim.hooks import Defense, DefenseContext, register_defense
from fedsim.typing import PyTree


def soteria_gradient(grad: PyTree, context: DefenseContext, p_fc: float, *,
                     layer: str = "Dense_0", score: str = "exact", scope: str = "example",
                     chunk: int = 32, jacobian: str = "batched", key=None,
                     probes: int = 16):
    """Replace the defended layer's kernel gradient by ∂l/∂b · r′ᵀ (Alg 2).

    Args:
      grad: the batch gradient (pytree like ``context.params``).
      context: needs ``params``, ``x`` [B, ...], ``y`` [B], ``mask`` [B] (None
        = all real) and ``apply_fn``.
      p_fc: fraction of the layer's input features zeroed, in [0, 1].
      layer: param path of the defended Dense layer ("Dense_0" = LeNet's FC).
      score: "exact" (paper) or "code" (authors' public code).
      scope: "example" (paper) or "batch" (authors' code).
      chunk: Jacobian rows (features) per ``lax.map`` chunk ("batched") or
        examples per chunk ("per_example"): a memory/speed knob only.
      jacobian: "batched" (one forward, L reverse passes over the batch) or
        "per_example" (``jacrev`` per example); same values, see
        :func:`defenses.soteria.representation_jacobian`; or "sketch", an
        approximation from ``probes`` random JVPs (needs ``key``; see
        :func:`defenses.soteria.jacobian_row_norms`).
      key: PRNG key, used only by ``jacobian="sketch"``.
      probes: random probes of the sketch.

    Returns:
      ``(grad′, info)``: the defended gradient and a dict with ``r`` [B, L],
      ``r_prime`` [B, L], ``keep`` (the {0,1} feature mask) and ``grad_norm``
      [B, L] (the row norms ‖∇_X rᵢ‖ the scores used; 0 on padding rows).
    """
    path = parse_layer(layer)
    for field in ("params", "x", "y", "apply_fn"):
        if getattr(context, field) is None:
            raise ValueError(f"soteria needs context.{field} (it runs at stage 'layer')")
    params, x, y = context.params, context.x, context.y
    batch = x.shape[0]
    # Shapes and dtypes only (static under jit): one-hot or float labels failed
    # in optax's dtype check, and a y or mask of another length in a broadcast.
    if jnp.ndim(y) != 1 or jnp.shape(y)[0] != batch or not jnp.issubdtype(
            jnp.result_type(y), jnp.integer):
        raise ValueError(f"soteria: context.y must be the batch's integer class labels, shape "
                         f"({batch},); got {jnp.result_type(y)} of shape {tuple(jnp.shape(y))}")
    check_mask(context.mask, batch, "soteria")
    kernel = layer_params(params, path)["kernel"]
    mask = jnp.ones(x.shape[:1], jnp.float32) if context.mask is None else context.mask
    num_out = kernel.shape[1]

    def loss_of_shift(shift):
        logits, r = run_with_layer(context.apply_fn, params, x, path, shift)
        losses = cross_entropy(logits, y)
        return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0), r

    # d(loss)/d(shift) row j = w_j · ∂l_j/∂b_j (one backward pass for the batch).
    (_, r), weighted_dldb = jax.value_and_grad(loss_of_shift, has_aux=True)(
        jnp.zeros((x.shape[0], num_out), kernel.dtype))
    grad_norm = jacobian_row_norms(context.apply_fn, params, x, path, chunk, jacobian,
                                   key=key, probes=probes, example_mask=mask)
    r_prime, keep = perturb_representation(r, grad_norm, p_fc, score=score, scope=scope,
                                           example_mask=mask)
    new_kernel = (r_prime.T @ weighted_dldb).astype(layer_params(grad, path)["kernel"].dtype)
    return replace_layer(grad, path, "kernel", new_kernel), {"r": r, "r_prime": r_prime,
                                                             "keep": keep,
                                                             "grad_norm": grad_norm}


@register_defense("soteria")
def soteria(p_fc: float, layer: str = "Dense_0", score: str = "exact",
            scope: str = "example", chunk: int = 32, jacobian: str = "batched",
            probes: int = 16) -> Defense:
    """Soteria (stage "layer"): prune the FC layer's input representation.

    Args:
      p_fc: pruning rate of the defended layer's input features, in [0, 1]
        (paper Table 2: 1–40 % vs DLG, 1–80 % vs GS).
      layer: param path of the defended Dense layer, "/"-separated.
      score: "exact" — the paper's ‖rᵢ(∇_X fᵢ)⁻¹‖₂ — or "code" — the
        approximation of the authors' public code.
      scope: "example" (Alg 2) or "batch" (authors' code).
      chunk: rows/examples per chunk of the Jacobian computation (memory).
      jacobian: "batched" (default) or "per_example" — how ∇_X f is computed
        (same values; ``benchmarks/results/soteria_speed.md`` times both), or
        "sketch" — an approximation of the norms from ``probes`` random JVPs
        (not the paper's; for CPU-budget training runs, uses the step key).
      probes: number of random probes of the sketch.

    Raises:
      ValueError: for a rate outside [0, 1] or an unknown score/scope.
    """
    p_fc = check_rate(p_fc)
    if score not in SCORES:
        raise ValueError(f"soteria score {score!r}; allowed: {', '.join(SCORES)}")
    if scope not in SCOPES:
        raise ValueError(f"soteria scope {scope!r}; allowed: {', '.join(SCOPES)}")
    # An integer >= 1: not a bool, a fraction (2.5 ran as 2) or an infinity
    # (an OverflowError before).
    chunk = check_positive_int("soteria chunk", chunk)
    if jacobian not in JACOBIAN_METHODS:
        raise ValueError(f"soteria jacobian {jacobian!r}; allowed: {', '.join(JACOBIAN_METHODS)}")
    probes = check_positive_int("soteria probes", probes)
    parse_layer(layer)

    def apply(grad, state, *, key=None, context=None):
        if context is None:
            raise ValueError("soteria needs a DefenseContext (it runs at stage 'layer')")
        grad, _ = soteria_gradient(grad, context, p_fc, layer=layer, score=score,
                                   scope=scope, chunk=int(chunk), jacobian=jacobian,
                                   key=key, probes=int(probes))
        return grad, state

    sketch = f",sketch{int(probes)}" if jacobian == "sketch" else ""
    # It rebuilds the defended kernel's gradient from the raw batch, so the
    # engine refuses it beside an "example" defense (DP-SGD) it would undo.
    return Defense(init=lambda params: (), apply=apply, stage="layer",
                   name=f"soteria(p_fc={p_fc:g},{score},{scope}{sketch})",
                   discards_example_stage=True,
                   # The batched Jacobian reads the batch only through apply_fn on
                   # all of it: defined under batch norm (see the module docstring).
                   batch_statistics=jacobian == "batched")
