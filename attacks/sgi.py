"""Sparse Gradient Inversion (SGI), Chu et al. 2023 (PriPrune), §4 Alg 2.

Against pruned FL the upload is sparse: pruned (and defence-withheld)
coordinates are exactly 0. Plain GI (Geiping et al. 2020) matches the dummy
batch's *dense* gradient to that sparse target, so the pruned coordinates act
as wrong targets and inflate the dummy gradient's norm in the cosine loss.
SGI (Alg 2):

1. recover the mask from the upload's zero pattern, m = 1[Δ ≠ 0];
2. simulate the dummy batch's gradient of the *pruned* model, g(x̂) ⊙ m;
3. minimise the cosine loss between g(x̂) ⊙ m and the observed gradient (only
   the unmasked coordinates count) + TV, with the Inverting-Gradients
   optimiser (signed Adam, step decay, box, restarts) of
   :mod:`attacks.gradient_inversion`.

Implementation: one route. Steps 1–2 are the ``masked`` option of the shared
core (:class:`attacks.gradient_inversion.InversionConfig`; the mask is
:func:`attacks.gradient_inversion.support_mask` of the target, recomputed
inside the jitted loss from the observation alone — threat model: the server
sees only the upload). This module only sets it, so ``sgi`` and
``inverting_gradients`` with the same config and key differ in nothing else
(the paper's Fig 7 comparison, "GI" = Geiping et al.).

Weight uploads (the paper's semantics, ``config["upload"] = "weights"``):
the client uploads its masked weights ŵ; the engine carries them as the update
ŵ − w_g (:func:`defenses.pruning.masks.withhold`). SGI then reads the mask off
ŵ's zeros, m_rec = 1[w_g + Δ ≠ 0] (Alg 2 line 3), and attacks
(ŵ − w_g) ⊙ m_rec (line 4): withheld weights (ŵ = 0, Δ = −w_g) leave the
target. GI gets ŵ − w_g unmasked (Alg 1 line 8). Coordinates shared with a
zero change are also left out (the core's mask is the target's support), as
for update uploads.

Labels: granted ones, else inferred from the upload by
:func:`attacks.labels.infer_labels` (as for GI).

Guarantee: none (a heuristic attack).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np

from attacks.api import Reconstruction, register_attack
from attacks.gradient_inversion import (AttackConfigError, check_inversion_config, run_inversion,
                                        support_mask)
from attacks.inverting_gradients import DEFAULTS
from fedsim.typing import Observation


UPLOADS = ("update", "weights")


def recover_mask(update) -> Any:
    """Alg 2 line 2: the {0,1} mask of the upload's nonzero coordinates."""
    return support_mask(update)


def from_weight_upload(obs: Observation) -> Observation:
    """The SGI view of a weight upload carried as Δ = ŵ − w_g (Alg 2 lines 3–4).

    Returns the observation with ``update`` = Δ ⊙ 1[w_g + Δ ≠ 0]: the change
    of the shared weights only, withheld (ŵ = 0) coordinates set to 0.
    """
    masked = jax.tree_util.tree_map(lambda d, g: d * ((g + d) != 0).astype(d.dtype),
                                    obs.update, obs.params)
    return obs._replace(update=masked)


def check_config(config: Mapping[str, Any], grants: Mapping[str, bool] | None = None,
                 algorithm: str | None = None) -> None:
    """Raise :class:`~attacks.gradient_inversion.AttackConfigError` for a bad
    ``config``, or one the threat model's ``grants`` (where given) leave short
    for uploads of ``algorithm`` (``training.algorithm``, where given), before
    any victim is observed (``fedsim attack`` calls it first)."""
    config = dict(config)
    upload = config.pop("upload", "update")
    if upload not in UPLOADS:
        raise AttackConfigError(f"attack.config.upload: {upload!r} is not allowed; allowed: "
                                f"{', '.join(UPLOADS)}")
    check_inversion_config(config, DEFAULTS, grants, algorithm)


def run_many(observations: Sequence[Observation], config: Mapping[str, Any], key
             ) -> list[Reconstruction]:
    """SGI against several victims at once (one vmapped, jitted loop).

    With the same ``config`` and ``key``, victims get the same labels and the
    same initial dummies as :func:`attacks.inverting_gradients.run_many`
    (paired comparison).
    """
    check_config(config)
    config = dict(config)
    upload = config.pop("upload", "update")
    if upload == "weights":
        observations = [from_weight_upload(o) for o in observations]
    recs = run_inversion(observations, config, key, DEFAULTS, cfg_overrides={"masked": True})
    out = []
    for obs, r in zip(observations, recs):
        leaves = jax.tree_util.tree_leaves(recover_mask(obs.update))
        density = float(sum(np.sum(np.asarray(l)) for l in leaves) / sum(l.size for l in leaves))
        out.append(r._replace(extras={**r.extras, "mask_density": density}))
    return out


@register_attack("sgi")
def run(observation: Observation, config: Mapping[str, Any], key) -> Reconstruction:
    """SGI against one victim's sparse upload."""
    return run_many([observation], config, key)[0]


run.run_many = run_many
run.check_config = check_config
