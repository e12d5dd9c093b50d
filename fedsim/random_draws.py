"""``jax.random`` draws that give the same bits and compile faster on XLA:CPU.

With ``jax_threefry_partitionable`` on (JAX's default), a draw of a
multi-dimensional shape builds its threefry counters from every dimension, and
XLA:CPU at its default backend optimisation level (3) spends 0.5–1.2 s longer
compiling it than the same values drawn as one flat vector and reshaped:
2.6–4.3× a draw alone, 2.0× the ten draws of LeNet-5's parameters
(``benchmarks/results/random_draw_compile_cpu.md``; at level 2, or with
partitionability off, the two compile alike). The values do not change: element
i of either draw comes from counter i, its row-major index, so the flat draw
reshaped is the multi-dimensional draw bit for bit, for every key
implementation (``tests/fedsim/test_random_draws.py`` checks each function here,
under ``jit`` and ``vmap`` and with partitionability on and off).

Use these where a program draws a multi-dimensional shape (a dummy image batch,
per-coordinate noise of a kernel, Gumbel pairs); a 0- or 1-dimensional shape
is passed to ``jax.random`` as it is.
"""

from __future__ import annotations

import math
import operator

import jax


def _flat_then_reshape(draw, key, shape, *args, **kwargs):
    try:  # integers only, as jax.random: 2.5 must not become 2
        shape = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise TypeError(f"fedsim.random_draws: a shape is a sequence of integers, got "
                        f"{shape!r}") from None
    if len(shape) < 2:
        return draw(key, shape, *args, **kwargs)
    return draw(key, (math.prod(shape),), *args, **kwargs).reshape(shape)


def normal(key, shape=(), dtype=None) -> jax.Array:
    """``jax.random.normal(key, shape, dtype)``, drawn flat (same bits)."""
    return _flat_then_reshape(jax.random.normal, key, shape, dtype)


def uniform(key, shape=(), dtype=None, minval=0.0, maxval=1.0) -> jax.Array:
    """``jax.random.uniform(key, shape, dtype, minval, maxval)``, drawn flat (same bits).

    ``minval`` and ``maxval`` must be scalars here (``jax.random.uniform`` also
    broadcasts arrays of the output's shape, which a flat draw cannot).
    """
    if jax.numpy.ndim(minval) or jax.numpy.ndim(maxval):
        raise ValueError("fedsim.random_draws.uniform takes scalar minval and maxval, got "
                         f"shapes {jax.numpy.shape(minval)} and {jax.numpy.shape(maxval)}")
    return _flat_then_reshape(jax.random.uniform, key, shape, dtype, minval, maxval)


def gumbel(key, shape=(), dtype=None) -> jax.Array:
    """``jax.random.gumbel(key, shape, dtype)``, drawn flat (same bits)."""
    return _flat_then_reshape(jax.random.gumbel, key, shape, dtype)
