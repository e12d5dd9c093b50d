"""Float32 work that gives the same numbers with or without 64-bit JAX.

Under ``jax_enable_x64`` a Python float that meets an integer array becomes a
float64 array: optax's Adam, AdamW and Yogi compute their bias correction
``1 − β**count`` so (``count`` is int32) before casting it to the moment's
dtype, and L-BFGS's state holds float64 arrays (its memory's weights, its
line search's diagnostics). A float32 run therefore rounded otherwise
whenever anything in the process had turned x64 on (``JAX_ENABLE_X64=1``, or
``jax.config.update`` for another purpose), which breaks "same config and
seed, same numbers".

:func:`x64_invariant` traces such an optimizer as without x64 whenever every
array it is given is 32 bits wide or narrower, so its program is the one a
process without x64 builds; a float64 model (``training.dtype: float64``) is
left to x64 as it is. Without x64 the wrapper changes nothing, so no number
of a run without x64 moves. Giving optax float32 hyperparameters instead would
have made the two agree too, but on other numbers than today's: ``1 − β`` then
rounds once more (``float32(1 − float32(0.9)) ≠ float32(0.1)``).

:func:`x64_off` is the context it uses; :func:`fedsim.data.resize_images` and
:func:`attacks.metrics.ssim` compute under it too (``jax.image.resize`` and
dm-pix build float64 weights under x64).
"""

from __future__ import annotations

import contextlib

import jax
import numpy as np
import optax


def x64_off():
    """A context in which JAX traces and computes as with ``jax_enable_x64`` off."""
    enable = getattr(jax, "enable_x64", None)
    if callable(enable):  # JAX ≥ 0.6: jax.enable_x64(False) is a context manager
        return enable(False)
    from jax.experimental import disable_x64  # older JAX
    return disable_x64()


def only_32_bit(*trees) -> bool:
    """True when no array leaf of ``trees`` is wider than 32 bits (PRNG keys aside)."""
    for leaf in jax.tree_util.tree_leaves(trees):
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            continue  # Python scalars are weakly typed; functions carry no dtype
        dtype = np.dtype(dtype)
        width = dtype.itemsize // (2 if dtype.kind == "c" else 1)  # complex64: two float32
        if width > 4:
            return False
    return True


def _narrowed(trees):
    if jax.config.jax_enable_x64 and only_32_bit(*trees):
        return x64_off()
    return contextlib.nullcontext()


def x64_invariant(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx``, traced as without ``jax_enable_x64`` when it sees only 32-bit arrays.

    Args:
      tx: any optax transformation, with or without extra arguments (L-BFGS's
        ``value``, ``grad`` and ``value_fn``).

    Returns:
      A transformation of the same kind whose ``init`` and ``update`` run ``tx``'s
      under :func:`x64_off` when x64 is on and every array among their
      arguments is at most 32 bits wide; otherwise ``tx``'s as they are.
      L-BFGS calls ``value_fn`` inside ``update``, so under the same context:
      a ``value_fn`` that closes over float64 arrays while the parameters are
      float32 would be narrowed with it (the attacks' objectives close over
      float32 targets).
    """
    def init(params):
        with _narrowed((params,)):
            return tx.init(params)

    def update(updates, state, params=None, **extra_args):
        with _narrowed((updates, state, params, extra_args)):
            return tx.update(updates, state, params, **extra_args)

    if isinstance(tx, optax.GradientTransformationExtraArgs):
        return optax.GradientTransformationExtraArgs(init, update)
    return optax.GradientTransformation(init, update)
