"""Where a benchmark's numbers came from: the commit, and whether the code
differed from it.

Every benchmark script that writes a results JSON records these in it: the
reproductions, their diagnostics, and the attack, engine and CPU timing
benchmarks. One implementation, so that every JSON that has a
"commit" means the same by it: the HEAD of the
checkout that ran it, with ``-dirty`` appended where files outside
``benchmarks/results`` differed from HEAD: changed tracked files, or untracked
ones git does not ignore (a new script not yet committed). A result file
rewritten by an earlier run of a chain does not change the code a later run
loads, so ``benchmarks/results`` is left out.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_state(root: Path | None = None) -> dict:
    """``{"commit": HEAD or None, "dirty": bool or None}`` of the checkout at ``root``
    (default: the one holding this file). ``dirty``: files outside
    ``benchmarks/results`` differ from HEAD or are untracked and not ignored.
    Both None where git cannot tell."""
    root = root or ROOT
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
