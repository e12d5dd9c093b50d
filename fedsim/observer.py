"""The observer: what the server receives from chosen clients in chosen rounds.

The engine records, for each observed (client, round), the full
:class:`ObservedUpload`: the :class:`~fedsim.typing.Observation` with every
field filled, plus the client's true data (the ground truth an attack is
scored against, never handed to the attack). :func:`restrict` strips an
observation down to what a threat model grants, so attacks cannot read more.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedsim.typing import Observation

GRANTS = ("labels", "batch_size", "num_examples", "local_steps")


class ObservedUpload(NamedTuple):
    """One observed upload and the private ground truth behind it.

    Attributes:
      observation: everything the server could know, all optional fields set.
      x: float32 [n, ...] the client's real inputs (ground truth, for scoring).
      y: int32 [n] the client's real labels (ground truth, for scoring).
    """

    observation: Observation
    x: np.ndarray
    y: np.ndarray


def restrict(obs: Observation, grant: dict[str, bool] | None = None) -> Observation:
    """Keep only the optional fields the threat model grants.

    Args:
      obs: a full observation.
      grant: mapping of names in :data:`GRANTS` to bool; missing means False.

    Raises:
      ValueError: for a grant name that is not in :data:`GRANTS`.
    """
    grant = dict(grant or {})
    unknown = set(grant) - set(GRANTS)
    if unknown:
        raise ValueError(f"unknown threat-model grant(s) {sorted(unknown)}; allowed: {', '.join(GRANTS)}")
    return obs._replace(**{g: (getattr(obs, g) if grant.get(g, False) else None) for g in GRANTS})
