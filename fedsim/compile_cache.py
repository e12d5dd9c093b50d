"""JAX's persistent compilation cache for the ``fedsim`` command line.

On XLA:CPU compiling a round step costs more than running it: the quickstart's
LeNet-5 round compiles for tens of seconds and then runs in about half a
second, because the local steps are unrolled (see
:class:`fedsim.client.LocalTraining`). JAX can keep compiled executables on
disk (``jax_compilation_cache_dir``) so that the next process running the same
program loads it instead of compiling it again; the numbers are those of the
same executable, so nothing about the results changes
(``benchmarks/compile_time_cpu.py`` measures what it saves).

The command line turns it on under ``$FEDSIM_CACHE_DIR/xla`` (default
``~/.cache/fedsim/xla``, beside the calibration cache). The library does not:
code that imports :mod:`fedsim` keeps whatever JAX configuration its author
chose. ``FEDSIM_COMPILE_CACHE=0`` turns it off; a cache directory the user set
for JAX (``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``) is kept as it is,
with JAX's settings.

In its own directory the command line keeps every executable, however short
its compile (:data:`MIN_COMPILE_SECS`), where JAX keeps only those that took a
second or more: on XLA:CPU a run's evaluation, initialisation and random
draws compile in under a second each. Loading them too shortened a warm
quickstart process from 16.8 to 14.7 s (loop) and from 18.8 to 15.4 s
(``auto``), and cost a cold one nothing measurable
(``benchmarks/results/compile_time_cli_threshold/``).
``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` in the environment sets
another threshold.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import jax

from fedsim.calibrate import cache_file

#: Cap on the cache's size on disk; JAX evicts the least recently used entries
#: (its eviction locks the directory with the ``filelock`` package).
MAX_CACHE_BYTES = 2 * 1024**3

#: Compile seconds from which the command line's cache keeps an executable
#: (JAX's default: 1 s). Unless ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``
#: is set.
MIN_COMPILE_SECS = 0.0


def default_dir() -> Path:
    """``$FEDSIM_CACHE_DIR/xla`` (default ``~/.cache/fedsim/xla``)."""
    return cache_file().parent / "xla"


def enable_persistent_cache() -> str | None:
    """Turn on JAX's on-disk compilation cache unless told not to.

    Returns:
      The directory in use, or None when it is off (``FEDSIM_COMPILE_CACHE=0``).

    Raises:
      ValueError: ``FEDSIM_COMPILE_CACHE`` is neither ``0`` nor ``1``.
    """
    flag = os.environ.get("FEDSIM_COMPILE_CACHE", "1").strip()
    if flag not in ("0", "1"):
        raise ValueError(f"environment variable FEDSIM_COMPILE_CACHE must be 0 or 1, got {flag!r}")
    if flag == "0":
        return None
    current = jax.config.jax_compilation_cache_dir
    if current:  # the user's own setting wins
        return str(current)
    path = default_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # an unwritable cache only costs compile time
    jax.config.update("jax_compilation_cache_dir", str(path))
    if jax.config.jax_compilation_cache_max_size == -1 and _has_filelock():
        # Without filelock (a dependency of fedsim) JAX refuses every cache entry
        # once a cap is set: better uncapped than a cache that never hits.
        jax.config.update("jax_compilation_cache_max_size", MAX_CACHE_BYTES)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECS)
    return str(path)


def _has_filelock() -> bool:
    return importlib.util.find_spec("filelock") is not None
