import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _run_script(script: str, devices: int, **env) -> dict:
    """Run ``script`` in a fresh process with ``devices`` forced CPU devices and
    return the JSON it prints after ``RESULT``."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), **env)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT")][0]
    return json.loads(line[len("RESULT"):])

SCRIPT = textwrap.dedent("""
    import itertools, json, jax, numpy as np
    from tests.fedsim.helpers import random_zeroing_upload, small_config, small_dataset
    from fedsim.simulation import Simulation
    ds = small_dataset()
    out = {"devices": jax.device_count()}
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: compiles.append(event)
        if event == "/jax/core/compile/backend_compile_duration" else None)
    for strategy, aggregation in itertools.product(("map", "sharded"), ("mean", "sender_mean")):
        # 5 clients over 4 devices also exercises the padding of the cohort.
        cfg = small_config(**{"model.name": "lenet5", "training.client_parallelism": strategy,
                              "training.clients_per_round": 5,
                              "training.aggregation": aggregation})
        defs = {"upload": random_zeroing_upload(0.5)} if aggregation == "sender_mean" else None
        sim = Simulation(cfg, dataset=ds, donate=True, defenses=defs)
        state = sim.init_state()
        state, res = sim.run_round(state, 0)
        before = len(compiles)
        state, res = sim.run_round(state, 1)
        out[strategy + "/" + aggregation] = {
            "params": [np.asarray(l).ravel().tolist()
                       for l in jax.tree_util.tree_leaves(state.params)],
            "loss": res.train_loss,
            "compiles_in_round_1": len(compiles) - before,
            "mesh": None if sim.mesh is None else dict(sim.mesh.shape)}
    print("RESULT" + json.dumps(out))
""")


def test_four_device_sharded_run_equals_one_device_run():
    out = _run_script(SCRIPT, 4)
    assert out["devices"] == 4
    for aggregation in ("mean", "sender_mean"):
        sharded, single = out["sharded/" + aggregation], out["map/" + aggregation]
        assert sharded["mesh"] == {"clients": 4}
        for a, b in zip(sharded["params"], single["params"]):
            np_a, np_b = np.asarray(a), np.asarray(b)
            assert np_a.shape == np_b.shape
            assert np.allclose(np_a, np_b, atol=1e-5, rtol=1e-5), aggregation
        assert abs(sharded["loss"] - single["loss"]) < 1e-5
        # Round 1 runs round 0's executables: before, the sharded step compiled
        # again because round 0's state was not yet on the mesh.
        assert sharded["compiles_in_round_1"] == single["compiles_in_round_1"] == 0


AUTO_SCRIPT = textwrap.dedent("""
    import json, jax, numpy as np
    from tests.fedsim.helpers import small_config, small_dataset
    from fedsim import calibrate
    from fedsim.simulation import Simulation
    ds = small_dataset()
    cfg = lambda strategy: small_config(**{"training.client_parallelism": strategy,
                                           "training.clients_per_round": 5})
    def params_after_two_rounds(sim):
        state = sim.init_state()
        for r in range(2):
            state, _ = sim.run_round(state, r)
        return [np.asarray(l).ravel().tolist() for l in jax.tree_util.tree_leaves(state.params)]
    out = {"to_time": list(calibrate.strategies_to_time())}
    # Really timed, sharded included: the reason line lists every strategy's time.
    out["timed_reason"] = Simulation(cfg("auto"), dataset=ds).strategy_reason
    calibrate.cache_file().unlink()  # else the next one takes this choice from the cache
    # Chosen: sharded made the fastest, the run takes the mesh and the numbers of map.
    real = calibrate.measure
    calibrate.measure = lambda sim, candidates=None, clients=None, repeats=3: {
        **{c: 1.0 for c in candidates or calibrate.strategies_to_time()}, "sharded": 0.5}
    auto = Simulation(cfg("auto"), dataset=ds)
    calibrate.measure = real
    out["choice"] = auto.strategy
    out["reason"] = auto.strategy_reason
    out["mesh"] = None if auto.mesh is None else dict(auto.mesh.shape)
    out["data_devices"] = len(auto._x.sharding.device_set)
    out["auto"] = params_after_two_rounds(auto)
    out["map"] = params_after_two_rounds(Simulation(cfg("map"), dataset=ds))
    # And back: a strategy switched from sharded runs on one device again.
    auto.strategy = "map"
    auto._compile(reuse=True)
    out["back_mesh"] = auto.mesh
    out["back_devices"] = len(auto._x.sharding.device_set)
    print("RESULT" + json.dumps(out))
""")


def test_auto_times_sharded_where_one_process_has_several_devices_and_can_choose_it(tmp_path):
    from fedsim import calibrate

    assert calibrate.strategies_to_time() == calibrate.CANDIDATES  # one device here
    out = _run_script(AUTO_SCRIPT, 4, FEDSIM_CACHE_DIR=str(tmp_path))
    assert out["to_time"] == [*calibrate.CANDIDATES, "sharded"]
    timed = dict(re.findall(r"(loop|vmap|map|chunked|sharded) (\d+\.\d+)",
                            out["timed_reason"].split(": ", 2)[2]))
    assert set(timed) == set(out["to_time"]), out["timed_reason"]
    assert all(float(v) > 0 for v in timed.values()), out["timed_reason"]
    assert out["choice"] == "sharded" and "-> sharded" in out["reason"]
    assert out["mesh"] == {"clients": 4} and out["data_devices"] == 4
    for a, b in zip(out["auto"], out["map"]):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert out["back_mesh"] is None and out["back_devices"] == 1


MEMORY_SCRIPT = textwrap.dedent("""
    import json, logging, jax
    from tests.fedsim.helpers import small_config, small_dataset
    from fedsim import memory
    from fedsim.simulation import Simulation
    compiled = []
    class Keep(logging.Handler):
        def emit(self, record):
            if "XLA compilation of jit(step)" in record.getMessage():
                compiled.append(record.getMessage())
    logging.getLogger("jax").addHandler(Keep())
    ds = small_dataset()
    cfg = small_config(**{"model.name": "lenet5", "training.client_parallelism": "sharded",
                          "data.num_clients": 8, "training.clients_per_round": 8})
    sim = Simulation(cfg, dataset=ds, donate=True)
    out = {"mesh": dict(sim.mesh.shape)}
    with jax.log_compiles(True):
        state, _ = sim.run_round(sim.init_state(), 0)
        out["step_compiles_round_0"] = len(compiled)
        state, _ = sim.run_round(state, 1)
        out["step_compiles_round_1"] = len(compiled) - out["step_compiles_round_0"]
    out["plan"] = sim.memory_plan
    # One device's share, as XLA reports it for the compiled SPMD program.
    state = jax.eval_shape(sim.init_state)
    everywhere = jax.sharding.NamedSharding(sim.mesh, jax.sharding.PartitionSpec())
    state = jax.tree_util.tree_map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=everywhere), state)
    ids = jax.numpy.asarray(sim.cohort(0))
    out["one_device"] = memory.planned_bytes(sim._cohort_step, state, sim._mask_arg(), sim._x,
                                             sim._y, sim._idx, ids, sim.round_keys(0)[1])
    need = out["plan"]["planned_bytes"]
    memory.available_bytes = lambda: need - 1
    fresh = Simulation(cfg, dataset=ds, donate=True)
    try:
        fresh.run_round(fresh.init_state(), 0)
        out["refused"] = None
    except memory.InsufficientMemoryError as e:
        out["refused"] = str(e)
    print("RESULT" + json.dumps(out))
""")


def test_a_sharded_step_is_planned_against_the_hosts_memory_before_its_first_round():
    out = _run_script(MEMORY_SCRIPT, 2)
    assert out["mesh"] == {"clients": 2}
    plan = out["plan"]
    assert plan["strategy"] == "sharded" and plan["clients"] == 8
    # Two forced CPU devices run at once on one host's memory: twice one device's share.
    assert out["one_device"] > 0 and plan["planned_bytes"] == 2 * out["one_device"]
    # The check compiled the step the round runs (the state replicated, as the round
    # passes it): one compile in round 0, none after.
    assert out["step_compiles_round_0"] == 1 and out["step_compiles_round_1"] == 0
    assert out["refused"] is not None
    assert re.search(r"training.client_parallelism=sharded: one round's cohort step for "
                     r"training.clients_per_round=8 plans .* GiB \(2 devices sharing this "
                     r"host's memory\), .* GiB free: it would run out", out["refused"])


PRUNED_SCRIPT = textwrap.dedent("""
    import json, jax, numpy as np
    from tests.fedsim.helpers import small_config, small_dataset
    from fedsim.simulation import Simulation
    ds = small_dataset()
    out = {}
    for strategy in ("map", "sharded"):
        # PruneFL re-makes the mask before round 1: the sharded step takes it as an
        # input replicated over the mesh, like the state.
        cfg = small_config(**{"training.client_parallelism": strategy,
                              "training.clients_per_round": 3, "training.rounds": 3,
                              "pruning.scheme": "prunefl", "pruning.p": 0.5,
                              "pruning.reconfigurations": 2, "pruning.reconfigure_every": 1})
        sim = Simulation(cfg, dataset=ds, donate=True)
        state = sim.init_state()
        used = []  # the mask each round trained under
        for r in range(3):
            state, res = sim.run_round(state, r)
            used.append(jax.tree_util.tree_map(np.array, sim.global_mask))
        leaves = jax.tree_util.tree_leaves
        out[strategy] = {
            "params": [np.asarray(l).ravel().tolist() for l in leaves(state.params)],
            "mask": [np.asarray(m).ravel().tolist() for m in leaves(sim.global_mask)],
            "mesh": None if sim.mesh is None else dict(sim.mesh.shape)}
    # The same masks set from Python (Simulation.use_global_mask), sharded.
    cfg = small_config(**{"training.client_parallelism": "sharded",
                          "training.clients_per_round": 3, "training.rounds": 3})
    sim = Simulation(cfg, dataset=ds, donate=True)
    state = sim.init_state()
    for r in range(3):
        if r == 0 or any(np.any(a != b) for a, b in zip(leaves(used[r]), leaves(used[r - 1]))):
            state = sim.use_global_mask(used[r], state)
        state, res = sim.run_round(state, r)
    out["python_sharded"] = {
        "params": [np.asarray(l).ravel().tolist() for l in leaves(state.params)],
        "mesh": None if sim.mesh is None else dict(sim.mesh.shape)}
    print("RESULT" + json.dumps(out))
""")


def test_a_pruned_run_with_reconfigurations_is_the_same_sharded_over_two_devices():
    out = _run_script(PRUNED_SCRIPT, 2)
    sharded, single = out["sharded"], out["map"]
    assert sharded["mesh"] == {"clients": 2} and single["mesh"] is None
    assert sharded["mask"] == single["mask"]
    for w, m, w1 in zip(sharded["params"], sharded["mask"], single["params"]):
        w, m = np.asarray(w), np.asarray(m)
        assert np.all(w[m == 0] == 0)  # the global model is masked
        assert np.allclose(w, np.asarray(w1), atol=1e-5, rtol=1e-5)
    assert 0.4 < np.mean(np.concatenate([np.asarray(m) for m in sharded["mask"]])) < 0.9
    # The config's masks set from Python give the config run, to the bit.
    assert out["python_sharded"] == {"params": sharded["params"], "mesh": {"clients": 2}}
