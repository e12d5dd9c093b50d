"""What an example-stage DP defense tells the accountant about itself."""

from __future__ import annotations

from typing import NamedTuple


class DPParameters(NamedTuple):
    """The privacy-relevant hyper-parameters of a DP defense.

    Attributes:
      mechanism: "gauss" (Gaussian, incl. DP-PSAC), "vmf", or "clip" (no noise).
      noise_multiplier: σ (Gaussian); 0 for "clip".
      kappa: κ (VMF), else None.
      clip_norm: C, the clipping norm as configured: one example's L2
        sensitivity with whole-gradient clipping, per layer with
        ``clipping="per_layer"`` (the total is then C·√R over R layers;
        ``noise_multiplier`` is relative to that total). Informational: the
        accountants read only σ or κ.
      dim: p, the number of model parameters (VMF accounting), else None.
    """

    mechanism: str
    noise_multiplier: float = 0.0
    kappa: float | None = None
    clip_norm: float = 1.0
    dim: int | None = None


def tag(apply_fn, params: DPParameters):
    """Attach ``params`` to a defense's apply function (read by the accountant)."""
    apply_fn.dp_parameters = params
    return apply_fn


def dp_parameters(defense) -> DPParameters | None:
    """The :class:`DPParameters` of a DP defense, or None for any other defense."""
    return getattr(defense.apply, "dp_parameters", None)
