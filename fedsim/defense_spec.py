"""What a defense was built from, written out in full: its *spec*.

A :class:`~fedsim.hooks.Defense`'s ``name`` is for people (logs, results
rows) and carries only the hyper-parameters that tell runs apart at a glance
(``natural_channel(kappa=10)``). Where a defense must stand for itself in a
record that outlives the process (a checkpoint's ``hand_defense_specs``, a
calibration key), the name is not enough: two natural channels calibrated on
different data, two global masks of different pattern, or two PriPrunes of
different λ share a name. The spec is the factory's name and *every* argument
it was called with, defaults filled in, with arrays written as their shape,
dtype and a SHA-256 of their bytes, so that two defenses built alike have one
spec and two built differently (up to a hash collision) have two.

:func:`fedsim.hooks.register_defense` fills the spec in for every registered
factory, and :func:`fedsim.hooks.mask_defense` for the global mask; a
:class:`~fedsim.hooks.Defense` built by hand has none (``""``), and its name
stands for it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

__all__ = ["describe", "factory_spec"]


def describe(value: Any) -> str:
    """A canonical text for ``value``: equal values, equal texts.

    Numbers, strings, ``None`` and booleans are written with ``repr``, so an
    int and a float of one value (``1`` and ``1.0``) are written apart: a
    hand-given defense built with the one does not resume a checkpoint of the
    other (a config's defenses do, :func:`fedsim.checkpoint.config_fingerprint`); arrays
    (NumPy or JAX) as ``array[shape]dtype#sha256-prefix`` of their bytes;
    mappings (keys sorted), sequences, NamedTuples and dataclasses field by
    field; a function by its qualified name. Anything else by its type and
    ``repr`` (an object whose ``repr`` is its address describes one object,
    so two such objects never pass for each other).
    """
    if value is None or isinstance(value, (bool, int, float, str, complex)):
        return repr(value)
    if isinstance(value, np.generic):
        return repr(value.item())
    if _is_array(value):
        return _describe_array(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        return _fields(type(value).__name__, zip(value._fields, value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _fields(type(value).__name__,
                       ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value)))
    if isinstance(value, Mapping):
        items = sorted(((describe(k), describe(v)) for k, v in value.items()))
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(value)
    if not (len(leaves) == 1 and leaves[0] is value):  # a registered pytree container
        return f"{type(value).__name__}<{treedef}>(" + ", ".join(map(describe, leaves)) + ")"
    return f"{type(value).__name__}:{value!r}"


def factory_spec(name: str, factory: Callable, args: tuple, kwargs: dict) -> str:
    """``name(arg=value, ...)``: every argument ``factory`` was called with, by
    parameter name, defaults filled in, values :func:`describe`-d.

    Falls back to the arguments as given where the call does not bind to the
    signature (the factory raises for it itself).
    """
    try:
        bound = inspect.signature(factory).bind(*args, **kwargs)
        bound.apply_defaults()
        items = list(bound.arguments.items())
    except (TypeError, ValueError):
        items = [(str(i), a) for i, a in enumerate(args)] + sorted(kwargs.items())
    return f"{name}(" + ", ".join(f"{k}={describe(v)}" for k, v in items) + ")"


def _describe_array(value) -> str:
    import jax

    if isinstance(value, jax.core.Tracer):  # inside a trace: no bytes to hash
        return f"traced{list(value.shape)}{value.dtype}"
    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        return "key" + _describe_array(jax.random.key_data(value))
    a = np.ascontiguousarray(np.asarray(value))
    digest = hashlib.sha256(a.tobytes()).hexdigest()[:16]
    return f"array{list(a.shape)}{a.dtype}#{digest}"


def _fields(type_name: str, pairs) -> str:
    return f"{type_name}(" + ", ".join(f"{k}={describe(v)}" for k, v in pairs) + ")"


def _is_array(value) -> bool:
    if isinstance(value, np.ndarray):
        return True
    try:
        import jax
    except ImportError:  # pragma: no cover - jax is a dependency
        return False
    return isinstance(value, jax.Array)
