"""Per-example gradient clipping, flat (whole model) and per layer.

Implements line 7 of Algorithm 1 of Biswas et al. (001):
ḡ(xᵢ) = g(xᵢ) / max(1, ‖g(xᵢ)‖₂ / C), either on the whole flattened gradient
("flat", Abadi et al. 2016) or on each layer tensor separately ("per_layer",
the Opacus per-layer mode that 001 Table II calls "clip").

Guarantee: after flat clipping every per-example gradient has ‖ḡ‖₂ ≤ C; after
per-layer clipping every layer has norm ≤ C, so the whole gradient has norm
≤ C·√R for R layer tensors (Opacus uses the same total, ‖(C,…,C)‖₂, as the
noise scale's sensitivity).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

CLIPPING_MODES = ("flat", "per_layer")


def clip_rows(matrix: jax.Array, clip_norm: float) -> tuple[jax.Array, jax.Array]:
    """Clip each row of [B, P] to L2 norm ≤ ``clip_norm``.

    Returns:
      (clipped [B, P], the original row norms [B]).
    """
    norms = jnp.sqrt(jnp.sum(matrix * matrix, axis=1))
    scale = 1.0 / jnp.maximum(1.0, norms / clip_norm)
    return matrix * scale[:, None], norms


def clip_rows_per_layer(matrix: jax.Array, segments: jax.Array, num_layers: int,
                        clip_norm: float) -> tuple[jax.Array, jax.Array]:
    """Clip each (row, layer) block of [B, P] to L2 norm ≤ ``clip_norm``.

    Args:
      matrix: [B, P] flattened per-example gradients.
      segments: int32 [P], layer index of each coordinate.
      num_layers: R, the number of layer tensors.
      clip_norm: C, the per-layer bound.

    Returns:
      (clipped [B, P], per-layer norms [B, R]).
    """
    sq = jax.vmap(lambda row: jax.ops.segment_sum(row * row, segments, num_layers))(matrix)
    norms = jnp.sqrt(sq)
    scale = 1.0 / jnp.maximum(1.0, norms / clip_norm)  # [B, R]
    return matrix * scale[:, segments], norms


def check_clipping(mode: str) -> None:
    if mode not in CLIPPING_MODES:
        raise ValueError(f"clipping={mode!r}; allowed: {', '.join(CLIPPING_MODES)}")


def check_positive(name: str, value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value
