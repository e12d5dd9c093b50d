"""``fedsim list``: what a config can name, read from the registries.

Models, datasets and base pruning schemes come from the engine; defenses from
:mod:`defenses` (which the engine loads for configs anyway); every other
section from a package that contributes one through the ``fedsim.listings``
entry-point group (``attacks`` does), so the engine never imports the attack
package. A section is a list of ``(name, description)`` pairs.
"""

from __future__ import annotations

import sys
from importlib import metadata

#: Where each dataset comes from (``fedsim.data.load_dataset``).
DATASET_SOURCES = {
    "synthetic": "made in memory from the seed (tests, quick checks)",
    "fashion_mnist": "offline from the IDX files of Debian's dataset-fashion-mnist "
                     "(FEDSIM_FASHION_MNIST_DIR), else tensorflow-datasets",
}
TFDS_SOURCE = "tensorflow-datasets (a network once, or a prepared copy in data.data_dir)"


def first_line(obj) -> str:
    """The first line of ``obj``'s docstring ("" without one)."""
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def engine_sections() -> dict[str, list[tuple[str, str]]]:
    """The engine's own sections, defenses included."""
    from fedsim.data import KNOWN_DATASETS
    from fedsim.hooks import (DEFENSE_REGISTRY, MASK_SCHEMES, _load_defenses, _parameters,
                              mask_schemes)
    from fedsim.models import MODEL_REGISTRY

    _load_defenses()
    return {
        # A factory's docstring, else the built model's (vgg11 is a partial of VGG).
        "models": [(n, first_line(f) or first_line(f(num_classes=10)))
                   for n, f in sorted(MODEL_REGISTRY.items())],
        "datasets": [(n, DATASET_SOURCES.get(n, TFDS_SOURCE)) for n in KNOWN_DATASETS],
        "schemes": [(n, first_line(MASK_SCHEMES[n])) for n in mask_schemes()],
        "defenses": [(f"{n}({_parameters(f)})", first_line(f))
                     for n, f in sorted(DEFENSE_REGISTRY.items())],
    }


def plugin_sections() -> dict[str, list[tuple[str, str]]]:
    """Sections other packages contribute (``fedsim.listings`` entry points); one
    that cannot be loaded is left out with a warning, as a broken command is."""
    try:
        eps = list(metadata.entry_points(group="fedsim.listings"))
    except Exception:  # pragma: no cover
        return {}
    out = {}
    for ep in eps:
        try:
            out[ep.name] = list(ep.load()())
        except ModuleNotFoundError:
            continue  # the package providing it is not installed
        except Exception as e:
            print(f"fedsim: warning: listing {ep.name!r} unavailable: {e}", file=sys.stderr)
    return out


def sections() -> dict[str, list[tuple[str, str]]]:
    """Every section: the engine's, then the contributed ones."""
    return {**engine_sections(), **plugin_sections()}


#: How a config names an entry of each section.
CONFIG_KEYS = {"models": "model.name",
               "datasets": "data.dataset; any other tensorflow-datasets image dataset too",
               "schemes": "pruning.scheme",
               "defenses": "defenses: [{name: NAME, PARAM: VALUE}]; --set 'defenses[i].PARAM=VALUE'",
               "attacks": "attack: {name: NAME, config: {...}}"}


def render(found: dict[str, list[tuple[str, str]]]) -> str:
    """The sections as text: a header naming the config key, then one entry a line
    (its description indented below it)."""
    lines = []
    for section, entries in found.items():
        key = CONFIG_KEYS.get(section)
        lines.append(f"{section}" + (f" ({key}):" if key else ":"))
        for name, description in entries:
            lines.append(f"  {name}")
            if description:
                lines.append(f"      {description}")
        lines.append("")
    return "\n".join(lines)
