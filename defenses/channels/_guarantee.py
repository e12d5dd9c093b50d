"""What a channel defense promises, where the leakage ledger finds it."""

from __future__ import annotations

from typing import NamedTuple

from defenses.channels._statistics import DataStatistics


class ChannelGuarantee(NamedTuple):
    """A channel's per-use capacity, listed in its :attr:`fedsim.hooks.Defense.guarantees`.

    Every local step is one use of the channel, so n steps leak at most n·κ
    nats about the data (000 Thm 2 with the data-processing inequality, Eq. 16);
    :class:`defenses.channels.LeakageLedger` reports that sum per round.

    Attributes:
      kappa: κ, nats per use of the channel.
      statistics: the Σ_D the channel was calibrated on (the data-space
        channels), which the ledger's Thm 1 floor uses for h(D); None for the
        parameter channel, which calibrates on each step's gradients (the
        ledger then estimates Σ_D from the simulation's training inputs).
    """

    kappa: float
    statistics: DataStatistics | None = None
