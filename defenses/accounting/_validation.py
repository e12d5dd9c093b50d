"""Argument checks shared by the accountants, the bounds and the CLI.

Each check raises ``ValueError`` whose message starts with the argument name
and states the allowed range, so that the CLI can print it verbatim as a
one-line error.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
        "check_positive",
        "check_nonnegative",
        "check_open_unit",
        "check_rate",
        "check_dim",
        "check_positive_int",
]


def _as_float(name: str, value: Any) -> float:
    # float(True) is 1.0: a YAML ``clip_norm: true`` would have run as C = 1.
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if math.isnan(out):
        raise ValueError(f"{name} must be a real number, got nan")
    return out


def check_positive(name: str, value: Any, *, allow_inf: bool = False) -> float:
    """Returns ``float(value)``; raises ValueError unless value > 0."""
    out = _as_float(name, value)
    if not out > 0 or (math.isinf(out) and not allow_inf):
        raise ValueError(f"{name} must be in (0, inf), got {value!r}")
    return out


def check_nonnegative(name: str, value: Any) -> float:
    """Returns ``float(value)``; raises ValueError unless 0 <= value < inf."""
    out = _as_float(name, value)
    if not 0 <= out < math.inf:
        raise ValueError(f"{name} must be in [0, inf), got {value!r}")
    return out


def check_open_unit(name: str, value: Any) -> float:
    """Returns ``float(value)``; raises ValueError unless 0 < value < 1."""
    out = _as_float(name, value)
    if not 0 < out < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return out


def check_rate(name: str, value: Any) -> float:
    """Returns ``float(value)``; raises ValueError unless 0 < value <= 1."""
    out = _as_float(name, value)
    if not 0 < out <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return out


def check_positive_int(name: str, value: Any) -> int:
    """Returns ``int(value)``; raises ValueError unless it is an integer >= 1."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    try:
        out = int(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}") from None
    if out != value or out < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return out


def check_dim(name: str, value: Any) -> int:
    """Returns ``int(value)``; raises ValueError unless it is an integer >= 2."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer >= 2, got {value!r}")
    try:
        out = int(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be an integer >= 2, got {value!r}") from None
    if out != value or out < 2:
        raise ValueError(f"{name} must be an integer >= 2, got {value!r}")
    return out
