"""The command line's persistent compilation cache (fedsim.compile_cache)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from fedsim.cli import main
from fedsim.compile_cache import (MAX_CACHE_BYTES, MIN_COMPILE_SECS, default_dir,
                                  enable_persistent_cache)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def restore_jax_cache_config():
    saved = (jax.config.jax_compilation_cache_dir, jax.config.jax_compilation_cache_max_size,
             jax.config.jax_persistent_cache_min_compile_time_secs)
    yield
    jax.config.update("jax_compilation_cache_dir", saved[0])
    jax.config.update("jax_compilation_cache_max_size", saved[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[2])


def test_enabled_under_fedsim_cache_dir(tmp_path, monkeypatch, restore_jax_cache_config):
    monkeypatch.setenv("FEDSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FEDSIM_COMPILE_CACHE", raising=False)
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    jax.config.update("jax_compilation_cache_dir", None)
    jax.config.update("jax_compilation_cache_max_size", -1)
    path = enable_persistent_cache()
    assert path == str(tmp_path / "xla") == str(default_dir())
    assert (tmp_path / "xla").is_dir()
    assert jax.config.jax_compilation_cache_dir == path
    assert jax.config.jax_compilation_cache_max_size == MAX_CACHE_BYTES
    assert jax.config.jax_persistent_cache_min_compile_time_secs == MIN_COMPILE_SECS == 0.0


def test_the_environments_compile_time_threshold_is_kept(tmp_path, monkeypatch,
                                                         restore_jax_cache_config):
    monkeypatch.setenv("FEDSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FEDSIM_COMPILE_CACHE", raising=False)
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "2.5")
    jax.config.update("jax_compilation_cache_dir", None)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.5)  # as JAX read it
    assert enable_persistent_cache() == str(tmp_path / "xla")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.5


def test_off_and_user_setting_kept(tmp_path, monkeypatch, restore_jax_cache_config):
    monkeypatch.setenv("FEDSIM_CACHE_DIR", str(tmp_path))
    jax.config.update("jax_compilation_cache_dir", None)
    monkeypatch.setenv("FEDSIM_COMPILE_CACHE", "0")
    assert enable_persistent_cache() is None
    assert jax.config.jax_compilation_cache_dir is None
    assert not (tmp_path / "xla").exists()
    monkeypatch.setenv("FEDSIM_COMPILE_CACHE", "1")
    mine = str(tmp_path / "mine")
    jax.config.update("jax_compilation_cache_dir", mine)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    assert enable_persistent_cache() == mine
    assert jax.config.jax_compilation_cache_dir == mine
    # the user's cache keeps JAX's settings, the threshold included
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0
    assert not (tmp_path / "xla").exists()


def test_bad_flag_is_a_named_error(monkeypatch, capsys, restore_jax_cache_config):
    monkeypatch.setenv("FEDSIM_COMPILE_CACHE", "yes")
    with pytest.raises(ValueError, match="FEDSIM_COMPILE_CACHE must be 0 or 1, got 'yes'"):
        enable_persistent_cache()
    assert main(["run", "configs/does-not-matter.yaml"]) == 2
    assert "FEDSIM_COMPILE_CACHE must be 0 or 1" in capsys.readouterr().err


def test_second_process_loads_the_executables_with_the_same_numbers(tmp_path):
    """Two `fedsim run` processes sharing a cache: the second writes nothing (every
    executable it needed was loaded, however short its compile: the command line's
    threshold is 0 s) and ends at the same numbers."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: cc\nseed: 3\ndata: {dataset: synthetic, num_clients: 4, image_size: 8, "
                   "max_train: 200, max_test: 50}\nmodel: {name: mlp}\n"
                   "training: {rounds: 2, clients_per_round: 2, client_parallelism: loop}\n"
                   "output: {progress: false, plots: false}\n")
    env = {**os.environ, "FEDSIM_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.pop("FEDSIM_COMPILE_CACHE", None)
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    summaries, entries = [], []
    for i in range(2):
        out = tmp_path / f"run{i}"
        subprocess.run([sys.executable, "-m", "fedsim", "run", str(cfg), "--quiet", "--set",
                        f"output.dir={out}"], check=True, env=env, cwd=ROOT,
                       capture_output=True)
        summaries.append(json.loads((out / "summary.json").read_text()))
        # JAX writes an entry only on a miss: a load leaves the *-cache files
        # untouched (it only updates their *-atime companions, for eviction).
        entries.append(sorted((p.name, p.stat().st_mtime_ns)
                              for p in (tmp_path / "cache" / "xla").glob("*-cache")))
    # an MLP's programs compile in well under JAX's default 1 s: several entries
    # mean the short compiles were kept
    assert len(entries[0]) > 3, f"the first process wrote {len(entries[0])} cache entries"
    assert entries[1] == entries[0]
    for key in ("final_train_loss", "test_accuracy", "test_loss"):
        assert summaries[1][key] == summaries[0][key]


def test_uncapped_without_filelock(tmp_path, monkeypatch, restore_jax_cache_config):
    # JAX refuses every entry of a capped cache when filelock is missing.
    import fedsim.compile_cache as cc
    monkeypatch.setenv("FEDSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FEDSIM_COMPILE_CACHE", raising=False)
    monkeypatch.setattr(cc, "_has_filelock", lambda: False)
    jax.config.update("jax_compilation_cache_dir", None)
    jax.config.update("jax_compilation_cache_max_size", -1)
    assert enable_persistent_cache() == str(tmp_path / "xla")
    assert jax.config.jax_compilation_cache_max_size == -1
