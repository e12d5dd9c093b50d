"""Run `reproduce_chu2023 --combine` with only this worktree's packages importable.

Used for the committed results: the shared venv's editable install of /work/main
resolved `defenses.dp` (absent here) into /work/main, whose dp needs a newer
`fedsim.hooks`. Run as `PYTHONPATH=. python benchmarks/_combine_isolated.py`.
"""
import sys, runpy
# The shared venv's editable finder for /work/main resolves defenses.<missing subpackage>
# into /work/main; drop it so only this worktree's packages are imported.
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path_hooks = [h for h in sys.path_hooks if "editable" not in repr(h).lower()]
sys.path_importer_cache.clear()
sys.argv = ["reproduce_chu2023", "--combine"]
runpy.run_module("benchmarks.reproduce_chu2023", run_name="__main__")
