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

Implementation: the shared core is reused unchanged. The attacked model's
parameters become ``{"w": w, "m": m}`` and its apply function uses
``w ⊙ sg(m) + sg(w ⊙ (1 − m))``: the forward pass is the global model (exactly,
since m ∈ {0, 1}), the gradient w.r.t. ``w`` is g ⊙ m, and the gradient
w.r.t. ``m`` is 0 (matched to a zero target, it changes neither the dot
product nor the norms of the cosine loss). The mask is recovered from the
observation alone (threat model: the server sees only the upload).

Labels: granted ones, else inferred from the (original, unwrapped) upload by
:func:`attacks.labels.infer_labels` before the wrapping.

Guarantee: none (a heuristic attack). Defaults are those of
``inverting_gradients`` so that ``sgi`` vs ``inverting_gradients`` isolates
the masking (the paper's Fig 7 comparison, "GI" = Geiping et al.).
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp

from attacks.api import Reconstruction, register_attack
from attacks.gradient_inversion import run_inversion, victim_batch_size
from attacks.inverting_gradients import DEFAULTS
from attacks.labels import infer_labels
from fedsim.typing import Observation


def recover_mask(update) -> Any:
    """Alg 2 line 2: the {0,1} mask of the upload's nonzero coordinates."""
    return jax.tree_util.tree_map(lambda u: (u != 0).astype(jnp.float32), update)


@functools.lru_cache(maxsize=16)
def masked_apply(apply_fn):
    """``apply(q, x)`` of the pruned model, ``q = {"w": params, "m": mask}``.

    Cached per ``apply_fn`` so the attack core's jit cache (keyed on the apply
    function) is hit across calls.
    """

    def apply(q, x):
        w, m = q["w"], jax.lax.stop_gradient(q["m"])
        eff = jax.tree_util.tree_map(
            lambda a, b: a * b + jax.lax.stop_gradient(a * (1.0 - b)), w, m)
        return apply_fn(eff, x)

    return apply


def sparse_observation(obs: Observation, labels) -> Observation:
    """The observation with the recovered mask folded into the attacked model."""
    mask = recover_mask(obs.update)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, mask)
    return obs._replace(params={"w": obs.params, "m": mask},
                        update={"w": obs.update, "m": zeros},
                        apply_fn=masked_apply(obs.apply_fn), labels=labels)


def run_many(observations: Sequence[Observation], config: Mapping[str, Any], key
             ) -> list[Reconstruction]:
    """SGI against several victims at once (one vmapped, jitted loop)."""
    config = dict(config)
    joint = config.get("label_mode", DEFAULTS["label_mode"]) == "joint"
    wrapped = []
    for i, obs in enumerate(observations):
        labels = obs.labels
        if labels is None and not joint:
            bs = victim_batch_size(obs, config)
            labels = infer_labels(obs, bs, jax.random.fold_in(key, 1000 + i),
                                  name=config.get("last_layer"))
        wrapped.append(sparse_observation(obs, labels))
    config.pop("last_layer", None)
    recs = run_inversion(wrapped, config, key, DEFAULTS)
    return [r._replace(extras={**r.extras, "labels_inferred": observations[i].labels is None,
                               "mask_density": float(sum(
                                   jnp.sum(m) for m in jax.tree_util.tree_leaves(
                                       wrapped[i].params["m"])) / sum(
                                   m.size for m in jax.tree_util.tree_leaves(
                                       wrapped[i].params["m"])))})
            for i, r in enumerate(recs)]


@register_attack("sgi")
def run(observation: Observation, config: Mapping[str, Any], key) -> Reconstruction:
    """SGI against one victim's sparse upload."""
    return run_many([observation], config, key)[0]


run.run_many = run_many
