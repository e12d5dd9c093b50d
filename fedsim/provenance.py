"""Where a run's or a benchmark's numbers came from: the commit, whether the
code differed from it, and the software and device they ran on.

``fedsim run`` and ``fedsim attack`` record :func:`environment` in their
summaries; every benchmark script that writes a results JSON records
:func:`git_commit` (through ``benchmarks.provenance``): the reproductions,
their diagnostics, and the attack, engine and CPU timing benchmarks. One
implementation, so that every JSON that has a "commit" means the same by it:
the HEAD of the checkout that ran it, with ``-dirty`` appended where files
outside ``benchmarks/results`` differed from HEAD: changed tracked files, or
untracked ones git does not ignore (a new script not yet committed). A result
file rewritten by an earlier run of a chain does not change the code a later
run loads, so ``benchmarks/results`` is left out.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# The checkout holding the fedsim package (and benchmarks/), when it is one.
ROOT = Path(__file__).resolve().parents[1]


def git_state(root: Path | None = None) -> dict:
    """``{"commit": HEAD or None, "dirty": bool or None}`` of the checkout at ``root``
    (default: the one holding this file). ``dirty``: files outside
    ``benchmarks/results`` differ from HEAD or are untracked and not ignored.
    Both None where git cannot tell."""
    root = root or ROOT
    if not (root / ".git").exists():
        # Not the top of a checkout: e.g. fedsim installed into a virtual
        # environment that sits inside some other repository, whose HEAD is
        # not this code's.
        return {"commit": None, "dirty": None}
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                  "--untracked-files=normal", "--", ".", ":!benchmarks/results"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": bool(changed)}


SOURCE_COMMIT_ENV = "FEDSIM_SOURCE_COMMIT"


def git_commit(root: Path | None = None) -> str:
    """:func:`git_state` as one string: HEAD, + ``-dirty`` where the code differed;
    ``"unknown"`` where git cannot tell.

    Where git cannot tell (a copy of the tree without ``.git``, such as the one
    a lent GPU machine gets), ``$FEDSIM_SOURCE_COMMIT`` names the commit the
    copy was made from, recorded as ``<commit>-declared`` so that a reader
    knows git did not check it there."""
    state = git_state(root)
    if state["commit"] is None:
        declared = os.environ.get(SOURCE_COMMIT_ENV, "").strip()
        return f"{declared}-declared" if declared else "unknown"
    return state["commit"] + ("-dirty" if state["dirty"] else "")


def short_commit(commit: str) -> str:
    """A :func:`git_commit` string for markdown: the hash's first 7 characters, with
    ``-dirty`` or ``-declared`` kept (``"unknown"`` stays as it is)."""
    for suffix in ("-dirty", "-declared"):
        if commit.endswith(suffix):
            return commit[:7] + suffix
    return commit[:7]


def environment() -> dict:
    """What a run's numbers depend on besides its config and seed.

    The code (:func:`git_commit` of the checkout holding fedsim, ``"unknown"``
    for an installed copy, and the package version), the JAX and jaxlib
    versions, the backend, its device kind and counts, and the convolution
    rule (:func:`fedsim.models.conv_settings`; the same attack moved by up to
    0.5 dB PSNR per victim between two rules,
    ``benchmarks/results/chu2023_attack_drift.md``).
    """
    import platform
    from importlib import metadata

    import jax
    import jaxlib

    from fedsim import models

    try:
        version = metadata.version("fedsim")
    except metadata.PackageNotFoundError:
        version = None
    devices = jax.local_devices()
    return {"commit": git_commit(), "fedsim": version, "python": platform.python_version(),
            "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "backend": jax.default_backend(), "device_kind": devices[0].device_kind,
            "local_devices": len(devices), "processes": jax.process_count(),
            "convolution": models.conv_settings()}
