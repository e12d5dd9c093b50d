"""Sparse Gradient Inversion (SGI), Chu et al. 2023 (PriPrune), "Privacy Attacks against Model Pruning in FL", Alg 2.

Against pruned FL the upload is sparse: pruned (and defence-withheld)
coordinates are exactly 0. Plain GI (Geiping et al. 2020) matches the dummy
batch's *dense* gradient to that sparse target, so the pruned coordinates act
as wrong targets and inflate the dummy gradient's norm in the cosine loss.
SGI (Alg 2):

1. recover the mask from the client's weights, m = 1[ŵ ≠ 0] (line 3), where
   the server knows ŵ = w_g + Δ (w_g: the global model it sent);
2. simulate the dummy batch's gradient of the *pruned* model, g(x̂) ⊙ m;
3. minimise the cosine loss between g(x̂) ⊙ m and the observed gradient ⊙ m
   (line 4; only the unmasked coordinates count) + TV, with the
   Inverting-Gradients optimiser (signed Adam, step decay, box, restarts) of
   :mod:`attacks.gradient_inversion`.

Deviations from Alg 2 as printed: the defaults are Inverting Gradients'
(signed Adam at lr 0.1, 1,000 iterations, dummies uniform on [0, 1], labels
inferred from the upload), where Alg 2 starts from D′ ~ N(0, 1) with random
labels and the paper runs lr 0.01 for 10,000 iterations ("Privacy Attack
Algorithm"). Sharing GI's defaults keeps the paper's SGI-vs-GI comparison
(Fig 7) one of masks only; ``attack.config`` sets lr and iterations.

Masks (``config["mask"]``):

* ``"model"`` (default, Alg 2 line 3): m = 1[w_g + Δ ≠ 0]. A pruned weight is
  0 in w_g and gets no change; a shared weight whose change is exactly 0 (the
  weights of a ReLU unit dead for the whole batch, of an input pixel that is
  0 in every image) stays in the loss with its target 0.
* ``"support"``: m = 1[Δ ≠ 0], the upload's zero pattern; it also drops every
  shared coordinate whose change is 0, and with it what that zero says about
  the data (test: on a bias-free MLP over black-bordered images it leaves the
  border free). The rule of this module until 2026-11-27, for replaying runs
  made with it.

Implementation: one route, the ``masked`` option of the shared core
(:class:`attacks.gradient_inversion.InversionConfig`; threat model: the server
sees only the upload and its own w_g). This module only sets it, so ``sgi``
and ``inverting_gradients`` with the same config and key differ in nothing
else (the paper's Fig 7 comparison, "GI" = Geiping et al.).

Weight uploads (the paper's semantics, ``config["upload"] = "weights"``):
the client uploads its masked weights ŵ; the engine carries them as the update
ŵ − w_g (:func:`defenses.pruning.masks.withhold`). SGI attacks
(ŵ − w_g) ⊙ m_rec (line 4): withheld weights (ŵ = 0, Δ = −w_g) leave the
target, and labels are inferred from that view. GI gets ŵ − w_g unmasked
(Alg 1 line 8). Update uploads: a weight a defense withholds keeps its global
value (Δ = 0, ŵ = w_g ≠ 0), so the ``model`` mask keeps it, with target 0 —
the server cannot tell it from an unchanged shared weight; ``support`` drops
both.

Labels: granted ones, else inferred from the upload by
:func:`attacks.labels.infer_labels` (as for GI).

Guarantee: none (a heuristic attack).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np

from attacks.api import Reconstruction, register_attack
from attacks.gradient_inversion import (AttackConfigError, check_inversion_config, config_keys,
                                        refuse_unknown_keys, run_inversion, support_mask)
from attacks.inverting_gradients import DEFAULTS
from attacks.labels import observed_gradient
from fedsim.typing import Observation


UPLOADS = ("update", "weights")
MASKS = ("model", "support")


def recover_mask(update) -> Any:
    """The ``support`` mask: the {0,1} mask of the upload's nonzero coordinates."""
    return support_mask(update)


def model_mask(obs: Observation) -> Any:
    """Alg 2 line 3, m = 1[ŵ ≠ 0] with ŵ = w_g + Δ: the client's weights, which the
    server knows from the w_g it sent (either upload semantics)."""
    return jax.tree_util.tree_map(lambda d, g: ((g + d) != 0).astype(d.dtype),
                                  obs.update, obs.params)


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
    refuse_unknown_keys(config, run.config_keys)  # upload and mask among them
    config = dict(config)
    upload = config.pop("upload", "update")
    if upload not in UPLOADS:
        raise AttackConfigError(f"attack.config.upload: {upload!r} is not allowed; allowed: "
                                f"{', '.join(UPLOADS)}")
    mask = config.pop("mask", "model")
    if mask not in MASKS:
        raise AttackConfigError(f"attack.config.mask: {mask!r} is not allowed; allowed: "
                                f"{', '.join(MASKS)}")
    check_inversion_config(config, DEFAULTS, grants, algorithm)


def run_many(observations: Sequence[Observation], config: Mapping[str, Any], key,
             uploads: Sequence[str] | None = None) -> list[Reconstruction]:
    """SGI against several victims at once (one vmapped, jitted loop).

    With the same ``config`` and ``key``, victims get the same labels and the
    same initial dummies as :func:`attacks.inverting_gradients.run_many`
    (paired comparison). ``uploads``: each victim's upload semantics, where
    they differ (else ``config["upload"]`` for all). ``key``: one for the call,
    or one per victim (:func:`attacks.gradient_inversion.victim_keys`).
    """
    check_config(config)
    config = dict(config)
    upload = config.pop("upload", "update")
    rule = config.pop("mask", "model")
    uploads = list(uploads) if uploads is not None else [upload] * len(observations)
    if len(uploads) != len(observations) or any(u not in UPLOADS for u in uploads):
        raise AttackConfigError(f"uploads: one of {', '.join(UPLOADS)} per observation, got "
                                f"{uploads!r} for {len(observations)}")
    masks = [model_mask(o) for o in observations] if rule == "model" else None
    observations = [from_weight_upload(o) if u == "weights" else o
                    for o, u in zip(observations, uploads)]
    if rule == "support":
        masks = [recover_mask(o.update) for o in observations]
        recs = run_inversion(observations, config, key, DEFAULTS,
                             cfg_overrides={"masked": True})
    else:
        by_victim = {id(o): m for o, m in zip(observations, masks)}
        recs = run_inversion(
            observations, config, key, DEFAULTS,
            target_fn=lambda o: {"gradient": observed_gradient(o), "mask": by_victim[id(o)]},
            cfg_overrides={"masked": True, "mask_in_target": True})
    out = []
    for m, r in zip(masks, recs):
        leaves = jax.tree_util.tree_leaves(m)
        density = float(sum(np.sum(np.asarray(l)) for l in leaves) / sum(l.size for l in leaves))
        out.append(r._replace(extras={**r.extras, "mask_density": density, "mask": rule}))
    return out


@register_attack("sgi")
def run(observation: Observation, config: Mapping[str, Any], key) -> Reconstruction:
    """SGI against one victim's sparse upload."""
    return run_many([observation], config, key)[0]


run.run_many = run_many
run.check_config = check_config
run.config_keys = {**config_keys(DEFAULTS), "upload": "update", "mask": "model"}
