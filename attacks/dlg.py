"""Deep Leakage from Gradients (Zhu et al., NeurIPS 2019) with iDLG labels.

Implements Zhu et al. Alg. 1: minimise ‖∇θL(x̂, ŷ) − g‖² (Eq. 4) with L-BFGS
(``optax.lbfgs``, zoom line search), 300 iterations by default (as in paper
003 §6). ``label_mode``: ``"infer"`` (default; iDLG, Zhao et al. 2020, labels
from the last layer's gradient), ``"joint"`` (the original DLG: dummy label
logits optimised jointly, ŷ = softmax), or the granted labels when the threat
model grants them.

Deviation: the box constraint x̂ ∈ [0, 1] is off by default (Zhu et al. have
none); turn it on with ``box: true`` (projection after each L-BFGS step).
Guarantee: none (a heuristic attack).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from attacks.api import Reconstruction, register_attack
from attacks.gradient_inversion import config_checker, config_keys, run_inversion
from fedsim.typing import Observation

DEFAULTS = {"loss": "l2", "tv": 0.0, "optimizer": "lbfgs", "lr": 1.0, "iterations": 300,
            "restarts": 1, "signed": False, "decay": False, "box": False, "init": "uniform",
            "label_mode": "infer"}


check_config = config_checker(DEFAULTS)


def run_many(observations: Sequence[Observation], config: Mapping[str, Any], key
             ) -> list[Reconstruction]:
    """Attack several victims at once (one vmapped, jitted loop).

    ``key``: one for the call, or one per victim (then victim i gets what it
    gets alone with ``key[i]``; :func:`attacks.gradient_inversion.victim_keys`).
    """
    return run_inversion(observations, config, key, DEFAULTS)


@register_attack("dlg")
def run(observation: Observation, config: Mapping[str, Any], key) -> Reconstruction:
    """DLG against one victim's upload."""
    return run_many([observation], config, key)[0]


run.run_many = run_many
run.check_config = check_config
run.config_keys = config_keys(DEFAULTS)
