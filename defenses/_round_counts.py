"""Per-client counts that round callbacks carry through a checkpoint.

The DP accountant (participations) and the leakage ledger (channel steps)
both report, each round, a number that depends on every earlier round's
cohort. They save their counts as checkpoint callback state; this reads such
a state back.
"""

from __future__ import annotations

import numpy as np


def restored_counts(state, kind: str, key: str, like: np.ndarray,
                    who: str) -> tuple[np.ndarray, int] | None:
    """The counts and rounds counted in a callback ``state``, or None if it is not ours.

    Args:
      state: what the checkpoint holds for this callback's position.
      kind: the tag ``state_dict`` wrote (another callback's state has another).
      key: the field holding the per-client counts.
      like: the current counts (their shape must match).
      who: the callback's name, for the error.

    Returns:
      (counts as int64, rounds counted), or None for a state of another kind
      (the checkpoint pairs callbacks and states by position), which the
      caller ignores and replays from the cohorts instead.

    Raises:
      ValueError: the state counts another number of clients.
    """
    if not isinstance(state, dict) or state.get("kind") != kind:
        return None
    saved = np.asarray(state[key], dtype=np.int64)
    if saved.shape != like.shape:
        raise ValueError(f"{who}: the checkpoint's state has counts for {saved.size} clients, "
                         f"this simulation has {like.size}")
    return saved.copy(), int(state["rounds_counted"])
