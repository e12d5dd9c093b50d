"""Pruned FL (Chu et al. 2023, PriPrune) and magnitude pruning (GC).

Modules: :mod:`masks` ({0,1} pytree masks), :mod:`gc` (the shared GC /
magnitude-pruning defense, registered ``"gc"``), :mod:`global_mask` (the base
scheme's mask inside FL, Alg 1), :mod:`defense_prune` (Largest / Random / Mix
and Pseudo-Pruning, registered ``"prune_largest"``, ``"prune_random"``,
``"prune_mix"``), :mod:`schemes` (the six base schemes, registered for
configs' ``pruning.scheme``), :mod:`priprune` (PriPrune, registered
``"priprune"``).
"""

from defenses.pruning.defense_prune import prune_largest, prune_mix, prune_random
from defenses.pruning.gc import gc, magnitude_prune
from defenses.pruning.global_mask import apply_global_mask, masked_gradient, masked_upload
from defenses.pruning import schemes  # noqa: F401  (registers the base schemes)
from defenses.pruning.priprune import priprune
from defenses.pruning.masks import (apply_mask, density, flatten, magnitude_mask,
                                    mask_from_scores, num_params, ones_like, random_mask,
                                    unflatten)

__all__ = ["gc", "magnitude_prune", "apply_mask", "density", "flatten", "magnitude_mask",
           "mask_from_scores", "num_params", "ones_like", "random_mask", "unflatten",
           "prune_largest", "prune_mix", "prune_random", "priprune", "apply_global_mask",
           "masked_gradient", "masked_upload", "schemes"]
