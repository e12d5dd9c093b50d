"""Reconstruction and inference attacks on what the server sees.

Importing the package registers every attack in
:data:`attacks.api.ATTACK_REGISTRY`.
"""

import importlib as _importlib

from attacks.api import ATTACK_REGISTRY, Reconstruction, register_attack, run_attack

# Each area's modules register themselves on import; a module not written yet
# is skipped (ModuleNotFoundError for that module only).
for _name in ("metrics", "labels", "gradient_inversion", "dlg", "inverting_gradients",
              "fedavg_inversion", "model_inversion", "representation", "membership", "sgi", "analytic"):
    try:
        _importlib.import_module(f"attacks.{_name}")
    except ModuleNotFoundError as _e:
        if _e.name != f"attacks.{_name}":
            raise

__all__ = ["ATTACK_REGISTRY", "Reconstruction", "register_attack", "run_attack"]
