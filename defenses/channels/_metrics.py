"""Defense-capability metrics of Tan et al. (000, §6.1): IMP_MIA, IMP_DRA, GDC."""

from __future__ import annotations

import math

__all__ = ["imp_mia", "imp_dra", "gdc"]


def _pos(name, v):
    v = float(v)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    return v


def _auc(name, v):
    v = _pos(name, v)
    if v > 1.0:  # e.g. a percentage: the ratio would look plausible and mean nothing
        raise ValueError(f"{name} must be an AUC in (0, 1], got {v!r}")
    return v


def imp_mia(auc: float, auc_without_defense: float) -> float:
    """IMP_MIA = (AUC_without_def − AUC) / AUC_without_def (000 §6.1); AUCs in (0, 1]."""
    base = _auc("auc_without_defense", auc_without_defense)
    return (base - _auc("auc", auc)) / base


def imp_dra(mse: float, mse_without_defense: float) -> float:
    """IMP_DRA = (1/MSE_without_def − 1/MSE) / (1/MSE_without_def) = 1 − MSE_w/o / MSE."""
    base = _pos("mse_without_defense", mse_without_defense)
    return 1.0 - base / _pos("mse", mse)


def gdc(imp_mia_value: float, imp_dra_value: float) -> float:
    """General defense capability GDC = (IMP_MIA + IMP_DRA) / 2 (000 §6.1).

    Raises:
      ValueError: an improvement that is NaN or infinite.
    """
    for name, v in (("imp_mia_value", imp_mia_value), ("imp_dra_value", imp_dra_value)):
        if not math.isfinite(float(v)):
            raise ValueError(f"{name} must be finite, got {v!r}")
    return 0.5 * (float(imp_mia_value) + float(imp_dra_value))
