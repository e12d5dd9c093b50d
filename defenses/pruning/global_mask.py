"""The base-scheme global mask m inside pruned FL (Chu et al. 2023, Alg 1).

Alg 1: the server holds a global mask m; clients train the sparse model
w ⊙ m (line 6-8), upload their masked update, and the server averages and
applies m again (line 11). With a mask that is fixed within a round this is
three pure pieces:

* :func:`masked_gradient` (stage "layer"): the batch gradient ⊙ m, so local
  training never moves a pruned weight (SGD, momentum, Adam and decoupled
  weight decay all keep a zero weight with a zero gradient at zero);
* :func:`masked_upload` (stage "upload"): Δ ⊙ m, so a pruned coordinate is
  exactly 0 in what the server receives;
* :func:`apply_global_mask`: the server-side ``params ⊙ m`` after averaging
  (call it on the state after each round).

These close over m, so m is a constant of every compiled step and a new mask
needs a new ``Simulation``. :meth:`fedsim.simulation.Simulation.use_global_mask`
does the same with m as an input of the compiled steps (as configs'
``pruning`` does), for masks that change during training.
"""

from __future__ import annotations

from fedsim.defense_spec import describe
from fedsim.hooks import Defense, mask_defense
from defenses.pruning.masks import apply_mask


def masked_gradient(mask) -> Defense:
    """Layer-stage defense multiplying the batch gradient by the global mask
    (:func:`fedsim.hooks.mask_defense`, which configs' ``pruning`` also uses).

    Its ``spec`` carries a digest of ``mask``, so hand-built masks of different
    patterns are told apart in a checkpoint (the name is ``global_mask`` for all).
    """
    return mask_defense(mask, "layer")._replace(spec=f"masked_gradient(mask={describe(mask)})")


def masked_upload(mask) -> Defense:
    """Upload-stage defense multiplying Δ by the global mask
    (:func:`fedsim.hooks.mask_defense`); its ``spec`` carries a digest of ``mask``."""
    return mask_defense(mask, "upload")._replace(spec=f"masked_upload(mask={describe(mask)})")


def apply_global_mask(params, mask):
    """Alg 1 line 11: the server applies m to the averaged model."""
    return apply_mask(params, mask)
