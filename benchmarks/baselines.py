"""``--baseline LABEL=PATH``: other checkouts a benchmark runs alongside this one."""

from __future__ import annotations

import argparse
from pathlib import Path


def code_trees(ap: argparse.ArgumentParser, specs: list[str], root: Path) -> dict[str, Path]:
    """``{"this": root, LABEL: PATH, ...}`` from ``--baseline`` values, in order.

    Calls ``ap.error`` (exit 2, naming the value) for a value that is not a new
    ``LABEL=PATH`` with PATH a checkout holding ``fedsim/``.
    """
    trees = {"this": root}
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not Path(path, "fedsim").is_dir() or label in trees:
            ap.error(f"--baseline {spec!r}: expected a new LABEL=PATH, PATH a checkout "
                     "with fedsim/")
        trees[label] = Path(path).resolve()
    return trees
