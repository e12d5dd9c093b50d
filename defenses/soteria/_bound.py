"""Soteria's certified robustness bound (paper 003 §4.3, Thm 1, Eq 9).

    ‖X − X′‖₂ ≥ ‖r − r′‖₂ / ‖∇_X f‖₂

for the reconstruction X′ an attacker obtains from the perturbed
representation r′ (under Assumption 1, f invertible near r). We report it per
example with ‖∇_X f‖₂ the operator (spectral) norm of the L×N Jacobian, the
norm for which f's first-order Lipschitz step ‖r − r′‖ ≤ ‖∇f‖·‖X − X′‖ holds;
``norm="frobenius"`` gives the looser (smaller) bound with the Frobenius norm,
which upper-bounds the spectral norm.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from defenses.soteria._layer_io import parse_layer, representation, representation_jacobian
from fedsim.typing import PyTree


def certified_bound(apply_fn: Callable, params: PyTree, x: jax.Array, r_prime: jax.Array,
                    layer: str = "Dense_0", norm: str = "spectral") -> jax.Array:
    """Thm 1's lower bound on ‖X − X′‖₂, one value per example: [B].

    Args:
      apply_fn: ``apply_fn(params, x) -> logits`` (flax).
      params: model parameters.
      x: [B, ...] inputs.
      r_prime: [B, L] perturbed representations (e.g. from
        :func:`defenses.soteria.perturb_representation`).
      layer: param path of the defended Dense layer.
      norm: "spectral" (operator 2-norm) or "frobenius".

    Raises:
      ValueError: for an unknown norm or mismatched shapes.
    """
    path = parse_layer(layer)
    r = representation(apply_fn, params, x, path)
    if r_prime.shape != r.shape:
        raise ValueError(f"certified_bound: r_prime shape {r_prime.shape} != r shape {r.shape}")
    jac = representation_jacobian(apply_fn, params, x, path)
    if norm == "spectral":
        jac_norm = jnp.linalg.norm(jac, ord=2, axis=(-2, -1))
    elif norm == "frobenius":
        jac_norm = jnp.sqrt(jnp.sum(jac ** 2, axis=(-2, -1)))
    else:
        raise ValueError(f"certified_bound norm {norm!r}; allowed: spectral, frobenius")
    dist = jnp.linalg.norm(r - r_prime, axis=-1)
    return dist / jnp.maximum(jac_norm, jnp.finfo(jac_norm.dtype).tiny)
