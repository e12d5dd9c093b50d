"""Pure defenses over parameter pytrees, plus privacy accounting and bounds.

Importing the package registers every defense factory in
:data:`fedsim.hooks.DEFENSE_REGISTRY` (configs name them).
"""

import importlib as _importlib

from fedsim.hooks import Defense, DefenseContext, chain, identity, register_defense

# Each area is a subpackage that registers its defenses on import; one not
# written yet is skipped (ModuleNotFoundError for that module only).
for _name in ("accounting", "bounds", "dp", "channels", "pruning", "soteria"):
    try:
        _importlib.import_module(f"defenses.{_name}")
    except ModuleNotFoundError as _e:
        if _e.name != f"defenses.{_name}":
            raise

__all__ = ["Defense", "DefenseContext", "chain", "identity", "register_defense"]
