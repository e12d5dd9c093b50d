"""What the diagnostic scripts share: their ``--models`` list and their run record."""

from __future__ import annotations

import argparse
import platform

import jax



def checked_models(ap: argparse.ArgumentParser, text: str) -> list[str]:
    """The comma-separated registry names of ``--models``; ``ap.error`` names unknown ones."""
    from fedsim.models import MODEL_REGISTRY

    models = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODEL_REGISTRY]
    if not models or unknown:
        ap.error(f"--models: unknown model(s) {unknown or text!r}; known: "
                 f"{', '.join(sorted(MODEL_REGISTRY))}")
    return models


def run_record(rows: list, module: str, models: list[str], default: tuple[str, ...],
               seconds: float, commit: str) -> dict:
    """The results JSON: rows, ``commit`` (:func:`git_commit` read when the run
    started, so a commit made while it ran is not recorded), seconds, device, and
    the command that reruns it."""
    return {"rows": rows, "commit": commit, "seconds": seconds,
            "device": f"{jax.devices()[0].platform} ({platform.machine()})",
            "command": f"python -m benchmarks.{module}"
                       + ("" if models == list(default) else f" --models {','.join(models)}")}
