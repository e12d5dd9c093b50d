"""Pruned FL (Chu et al. 2023, PriPrune) and magnitude pruning (GC).

Modules: :mod:`masks` ({0,1} pytree masks), :mod:`gc` (the shared GC /
magnitude-pruning defense, registered ``"gc"``).
"""

from defenses.pruning.gc import gc, magnitude_prune
from defenses.pruning.masks import (apply_mask, density, flatten, magnitude_mask,
                                    mask_from_scores, num_params, ones_like, random_mask,
                                    unflatten)

__all__ = ["gc", "magnitude_prune", "apply_mask", "density", "flatten", "magnitude_mask",
           "mask_from_scores", "num_params", "ones_like", "random_mask", "unflatten"]
