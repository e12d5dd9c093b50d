"""Sparse Gradient Inversion (SGI; paper 002, PriPrune, Alg. 2).

Against pruned FL the upload is zero on pruned coordinates. SGI recovers the
client's mask from the zeros of the update (m = 1[Δ ≠ 0]) and runs the
cosine gradient-matching attack on the *masked* dummy gradient m ⊙ ∇θL(x̂, y)
against the observed sparse gradient, so pruned coordinates neither count in
the loss nor in the norms (paper 002 Alg. 2, lines 2–6). Everything else is
Inverting Gradients (:mod:`attacks.inverting_gradients`): TV prior, signed
Adam with step decay, box constraint, restarts, inferred or granted labels.

Deviation: iterations/lr default to ours (1000, 0.1); paper 002 does not give
them in the text we have. Guarantee: none (heuristic attack).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from attacks.api import Reconstruction, register_attack
from attacks.gradient_inversion import run_inversion
from attacks.inverting_gradients import DEFAULTS
from fedsim.typing import Observation


def run_many(observations: Sequence[Observation], config: Mapping[str, Any], key
             ) -> list[Reconstruction]:
    """SGI against several victims at once (one vmapped, jitted loop)."""
    return run_inversion(observations, config, key, DEFAULTS, cfg_overrides={"masked": True})


@register_attack("sgi")
def run(observation: Observation, config: Mapping[str, Any], key) -> Reconstruction:
    """SGI against one victim's (pruned) upload."""
    return run_many([observation], config, key)[0]


run.run_many = run_many
