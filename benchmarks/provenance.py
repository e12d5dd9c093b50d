"""Where a benchmark's numbers came from: :mod:`fedsim.provenance`, under the
name every benchmark script imports (the commit, and whether the code differed
from it)."""

from fedsim.provenance import (ROOT, SOURCE_COMMIT_ENV, environment, git_commit, git_state,
                               short_commit)

__all__ = ["ROOT", "SOURCE_COMMIT_ENV", "environment", "git_commit", "git_state",
           "short_commit"]
