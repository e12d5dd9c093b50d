"""The record every (epsilon, delta) accountant in this package returns."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional


@dataclasses.dataclass(frozen=True)
class PrivacyGuarantee:
    """An (epsilon, delta)-DP guarantee and how it was obtained.

    Attributes:
      epsilon: the epsilon reported (the best over the methods tried).
      delta: the target delta it holds for.
      approach: which method won: ``"1"`` / ``"2"`` (001 §III-A approaches),
        ``"rdp"`` or ``"pld"`` (dp_accounting accountants).
      alpha: the Rényi order at which the winning bound was attained (``None``
        for PLD; for approach 1 the order used in the RDP->DP conversion of a
        single, non-subsampled step).
      convention: ``"per-step"`` or ``"per-epoch (paper 001 convention)"``.
      count: number of compositions (steps or epochs, per ``convention``).
      candidates: epsilon of every method tried, by name.
    """

    epsilon: float
    delta: float
    approach: str
    alpha: Optional[float]
    convention: str
    count: int
    candidates: dict[str, float] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON view (used by the CLI)."""
        return dataclasses.asdict(self)
