import jax
import numpy as np
import pytest

from fedsim import memory
from fedsim.simulation import Simulation

from .helpers import small_config, small_dataset


def _write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


MEMINFO = "MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   8000000 kB\n"


def test_host_memory_is_meminfo_or_the_cgroup_headroom_whichever_is_smaller(tmp_path):
    plain = _write(tmp_path / "a", {"proc/meminfo": MEMINFO})
    assert memory.host_available_bytes(plain) == 8_000_000 * 1024
    # cgroup v2 with a limit below what the kernel reports free: the limit wins.
    v2 = _write(tmp_path / "b", {"proc/meminfo": MEMINFO,
                                 "sys/fs/cgroup/memory.max": "3000000000\n",
                                 "sys/fs/cgroup/memory.current": "1000000000\n"})
    assert memory.host_available_bytes(v2) == 2_000_000_000
    unlimited = _write(tmp_path / "c", {"proc/meminfo": MEMINFO,
                                        "sys/fs/cgroup/memory.max": "max\n",
                                        "sys/fs/cgroup/memory.current": "5\n"})
    assert memory.host_available_bytes(unlimited) == 8_000_000 * 1024
    v1 = _write(tmp_path / "d", {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "500\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": "800\n"})
    assert memory.host_available_bytes(v1) == 0  # over its limit: nothing free
    assert memory.host_available_bytes(str(tmp_path / "empty")) is None


def test_fits_keeps_headroom_and_treats_unknowns_as_fitting():
    assert memory.fits(80, 100) and not memory.fits(81, 100)
    assert memory.fits(None, 100) and memory.fits(10**20, None)


def test_available_bytes_reads_an_accelerator_allocator():
    class Device:
        def memory_stats(self):
            return {"bytes_limit": 1000, "bytes_in_use": 300}
    assert memory.available_bytes(Device()) == 700


def _param_bytes(sim):
    params = jax.eval_shape(sim.init_state).params
    return sum(np.prod(l.shape) * l.dtype.itemsize for l in jax.tree_util.tree_leaves(params))


def test_vmaps_planned_memory_grows_with_the_cohort_and_holds_every_clients_update():
    sim = Simulation(small_config(**{"data.num_clients": 8, "training.clients_per_round": 8,
                                     "training.chunk_size": 2}), dataset=small_dataset())
    sim.strategy = "vmap"
    two, eight = memory.cohort_step_bytes(sim, 2), memory.cohort_step_bytes(sim, 8)
    assert eight > two
    # Independent floor: vmapped clients each hold an update the size of the model.
    assert eight >= 8 * _param_bytes(sim)
    sim.strategy = "chunked"  # two clients at a time: less than all eight at once
    assert memory.cohort_step_bytes(sim, 8) < eight
    sim.strategy = "loop"
    with pytest.raises(ValueError, match="strategy 'loop'"):
        memory.cohort_step_bytes(sim, 8)


def _vmap_sim(**over):
    cfg = small_config(**{"data.num_clients": 8, "training.clients_per_round": 8,
                          "training.client_parallelism": "vmap", **over})
    return Simulation(cfg, dataset=small_dataset())


def test_a_fixed_strategy_that_cannot_fit_stops_before_its_first_round(monkeypatch):
    sim = _vmap_sim()
    need = memory.cohort_step_bytes(sim, 8)
    monkeypatch.setattr(memory, "available_bytes", lambda: need - 1)
    state = sim.init_state()
    with pytest.raises(memory.InsufficientMemoryError,
                       match=r"training.client_parallelism=vmap: one round's cohort step for "
                             r"training.clients_per_round=8 plans .* GiB free: it would run out"):
        sim.run_round(state, 0)
    # A tight fit warns and runs; later rounds are not checked again.
    monkeypatch.setattr(memory, "available_bytes", lambda: int(need / 0.9))
    with pytest.warns(RuntimeWarning, match="more than 80% of it"):
        state, res = sim.run_round(state, 0)
    monkeypatch.setattr(memory, "available_bytes", lambda: 1)
    state, res = sim.run_round(state, 1)
    assert np.isfinite(res.train_loss)


def test_the_check_can_be_turned_off_and_skips_the_loop(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 1)
    monkeypatch.setenv(memory.CHECK_ENV, "0")
    sim = _vmap_sim()
    sim.run_round(sim.init_state(), 0)
    monkeypatch.setenv(memory.CHECK_ENV, "yes")
    with pytest.raises(ValueError, match="FEDSIM_MEMORY_CHECK must be 0 or 1, got 'yes'"):
        _vmap_sim().run_round(sim.init_state(), 0)
    monkeypatch.delenv(memory.CHECK_ENV)
    loop = _vmap_sim(**{"training.client_parallelism": "loop"})
    loop.run_round(loop.init_state(), 0)  # the loop's step does not grow: nothing planned


@pytest.mark.parametrize("text, expected", [("8G", 8 * 2**30), ("8GiB", 8 * 2**30),
                                            ("500m", 500 * 2**20), ("1024", 1024),
                                            ("1.5G", int(1.5 * 2**30))])
def test_memory_limit_reads_sizes(monkeypatch, text, expected):
    monkeypatch.setenv(memory.LIMIT_ENV, text)
    assert memory.memory_limit() == expected


@pytest.mark.parametrize("text", ["0", "abc", "-1G", "G", "inf", "nan"])
def test_a_bad_memory_limit_is_named(monkeypatch, text):
    monkeypatch.setenv(memory.LIMIT_ENV, text)
    with pytest.raises(ValueError, match=f"FEDSIM_MEMORY_LIMIT must be a positive size .* {text!r}"):
        memory.memory_limit()


def test_the_limit_caps_what_counts_as_free(monkeypatch):
    class Device:
        def memory_stats(self):
            return {"bytes_limit": 10 * 2**30, "bytes_in_use": 0}
    monkeypatch.setenv(memory.LIMIT_ENV, "2G")
    assert memory.available_bytes(Device()) == 2 * 2**30
    monkeypatch.setenv(memory.LIMIT_ENV, "20G")  # a cap above what is free changes nothing
    assert memory.available_bytes(Device()) == 10 * 2**30


def test_the_cli_refuses_a_cohort_step_that_cannot_fit(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    args = [sys.executable, "-m", "fedsim", "run", str(root / "configs" / "quickstart.yaml"),
            "--quiet", "--set", "dataset=synthetic", "--set", "model.name=mlp",
            "--set", "image_size=16", "--set", "num_clients=8", "--set", "clients_per_round=8",
            "--set", "rounds=1", "--set", "client_parallelism=vmap",
            "--set", f"output.dir={tmp_path / 'run'}"]
    env = dict(os.environ, FEDSIM_MEMORY_LIMIT="1K", FEDSIM_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.run(args, capture_output=True, text=True, cwd=root, timeout=300, env=env)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert ("fedsim: config error: training.client_parallelism=vmap: one round's cohort step "
            "for training.clients_per_round=8 plans") in p.stderr
    env["FEDSIM_MEMORY_LIMIT"] = "lots"
    p = subprocess.run(args, capture_output=True, text=True, cwd=root, timeout=300, env=env)
    assert p.returncode == 2
    assert "fedsim: error: environment variable FEDSIM_MEMORY_LIMIT must be" in p.stderr


def test_a_check_leaves_its_plan_on_the_simulation():
    sim = _vmap_sim()
    sim.run_round(sim.init_state(), 0)
    plan = sim.memory_plan
    assert plan["strategy"] == "vmap" and plan["clients"] == 8
    assert plan["planned_bytes"] == memory.cohort_step_bytes(sim, 8) and plan["free_bytes"] > 0


def test_near_map_limit_compares_the_mappings_held_with_the_kernels_limit(monkeypatch):
    from fedsim import memory

    assert memory.memory_mappings() > 100  # a Python process with JAX loaded holds hundreds
    monkeypatch.setattr(memory, "max_map_count", lambda: 200)
    for held, fraction, near in ((100, 0.5, True), (99, 0.5, False), (99, None, False),
                                 (100, None, True), (None, 0.5, False)):
        monkeypatch.setattr(memory, "memory_mappings", lambda held=held: held)
        assert memory.near_map_limit(fraction) == (near, held, 200)
    monkeypatch.setattr(memory, "memory_mappings", lambda: 100)
    monkeypatch.setattr(memory, "max_map_count", lambda: None)  # unreadable: never near
    assert memory.near_map_limit(0.0) == (False, 100, None)


def test_building_a_simulation_near_the_map_limit_drops_compiled_programs_and_the_run_logs_it(
        tmp_path, monkeypatch):
    from fedsim.run import run_dir_for, run_simulation

    cleared = []
    monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(True))
    monkeypatch.setattr(memory, "max_map_count", lambda: 1000)
    monkeypatch.setattr(memory, "memory_mappings", lambda: 499)  # just under half
    cfg = small_config(**{"output.dir": str(tmp_path), "training.rounds": 1})
    far = Simulation(cfg, dataset=small_dataset())
    assert cleared == [] and far.memory_note is None
    monkeypatch.setattr(memory, "memory_mappings", lambda: 500)
    near = Simulation(cfg, dataset=small_dataset())
    line = ("building a simulation: 500 memory mappings of the kernel's vm.max_map_count "
            "1000; dropped JAX's compiled programs")
    assert cleared == [True] and near.memory_note == line
    run_simulation(cfg, sim=near, quiet=True)
    assert line in (run_dir_for(cfg) / "run.log").read_text()
