"""Per-client counts that round callbacks carry through a checkpoint.

The DP accountants (participations) and the leakage ledger (channel steps)
report, each round, a number that depends on every earlier round's cohort.
They count with :func:`count_through` and save their counts as checkpoint
callback state; :func:`restored_counts` reads such a state back.
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


def count_through(counts: np.ndarray, rounds_counted: int, round_idx: int, cohort_fn,
                  per_client=None) -> int:
    """Bring ``counts`` (rounds ``0 .. rounds_counted - 1``) to rounds ``0 .. round_idx``.

    Rounds not counted yet are replayed from their cohorts (after a resume
    from a checkpoint without the counts, the rounds before it), so
    ``cohort_fn`` must be a pure function of the round (as
    ``Simulation.cohort`` is). An earlier round than the last one counted means
    a new run on the same simulation: counting starts again from round 0.

    Args:
      counts: int64 per-client counts, updated in place.
      rounds_counted: how many rounds ``counts`` holds.
      round_idx: the round to count through.
      cohort_fn: ``cohort_fn(round) -> client ids``.
      per_client: what one participation adds per client (default 1).

    Returns:
      The new number of rounds counted.
    """
    if round_idx + 1 < rounds_counted:
        counts[:] = 0
        rounds_counted = 0
    for r in range(rounds_counted, round_idx + 1):
        ids = np.asarray(cohort_fn(r), dtype=np.int64)
        np.add.at(counts, ids, 1 if per_client is None else per_client[ids])
    return max(rounds_counted, round_idx + 1)
