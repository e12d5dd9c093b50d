"""Shared plumbing of the additive-noise data channels D̃ = D + ξ (000 §5.2)."""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from fedsim.hooks import Defense
from fedsim.keys import require_key

__all__ = ["additive_data_channel", "check_kappa"]


def check_kappa(kappa, who: str) -> float:
    if isinstance(kappa, (bool, np.bool_)):  # float(True) is 1.0
        raise ValueError(f"{who}: kappa must be a number > 0 (nats per step), got {kappa!r}")
    try:
        k = float(kappa)
    except (TypeError, ValueError):
        raise ValueError(f"{who}: kappa must be a number > 0 (nats per step), got {kappa!r}") from None
    if not np.isfinite(k) or k <= 0:
        raise ValueError(f"{who}: kappa must be a finite number > 0 (nats per step), got {kappa!r}")
    return k


def additive_data_channel(name: str, shape: tuple[int, ...],
                          sample: Callable[[jax.Array, int], jax.Array], *,
                          guarantee=None) -> Defense:
    """A stateless stage-"data" defense adding ξ = sample(key, B) [B, d] to x [B, *shape].

    ``guarantee`` (a :class:`~defenses.channels.ChannelGuarantee`) goes into the
    defense's ``guarantees``, where the leakage ledger finds it.

    Fresh noise every call (every local step: the engine passes a new key).
    Padding rows (``context.mask == 0``) get no noise, so they stay exactly 0.
    ``name`` may carry the channel's parameters (``natural_channel(kappa=10)``);
    errors name the channel without them, as its other errors do.
    """
    d = int(np.prod(shape))
    who = name.split("(")[0]

    def init(params):
        del params
        return ()

    def apply(x, state, *, key, context=None):
        if tuple(x.shape[1:]) != tuple(shape):
            raise ValueError(f"{who}: inputs have example shape {tuple(x.shape[1:])}, but the "
                             f"channel was calibrated for {tuple(shape)} (d = {d}); calibrate "
                             "it on inputs of the simulation's shape (with dataset=, give "
                             "image_size= the simulation's data.image_size)")
        require_key(key, name)
        b = x.shape[0]
        xi = sample(key, b).astype(x.dtype).reshape(x.shape)
        if context is not None and context.mask is not None:
            xi = xi * context.mask.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)
        return x + xi, state

    return Defense(init=init, apply=apply, stage="data", name=name,
                   guarantees=() if guarantee is None else (guarantee,))
