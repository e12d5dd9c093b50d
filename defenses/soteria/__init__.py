"""Soteria: representation-perturbation defense (Sun et al. 2021, papers 003/004).

* :func:`soteria` — the registered "layer"-stage defense (Alg 1–2).
* :func:`soteria_gradient` — the same replacement as a plain function,
  returning r, r′ and the mask too (for benchmarks and attacks on one step).
* :func:`perturb_representation` — Alg 1 on given r and ‖∇_X rᵢ‖.
* :func:`certified_bound` — Thm 1's ‖r − r′‖/‖∇_X f‖ per example.
* :func:`representation`, :func:`representation_jacobian`,
  :func:`jacobian_row_norms` — r = f(X), ∇_X f and its row norms ‖∇_X rᵢ‖
  for the Dense layer at a param path, for any flax ``apply_fn``.
"""

from defenses.soteria._bound import certified_bound
from defenses.soteria._defense import soteria, soteria_gradient
from defenses.soteria._layer_io import (JACOBIAN_METHODS, jacobian_row_norms, parse_layer,
                                        representation, representation_jacobian)
from defenses.soteria._scores import (keep_mask, num_pruned_features, perturb_representation,
                                      prune_priority)

__all__ = ["JACOBIAN_METHODS", "certified_bound", "jacobian_row_norms", "keep_mask", "num_pruned_features", "parse_layer",
           "perturb_representation", "prune_priority", "representation",
           "representation_jacobian", "soteria", "soteria_gradient"]
