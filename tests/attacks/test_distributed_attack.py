"""`fedsim attack` in two processes (fedsim.distributed): the multi-process harness."""

import json

import numpy as np

from fedsim.config import load_config
from tests.fedsim.test_distributed import _reported, _run_processes

ATTACK = """\
name: multiprocess_attack
seed: 0
data: {dataset: synthetic, image_size: 16, num_clients: 8, examples_per_client: 1}
model: {name: mlp}
training: {algorithm: fedsgd, rounds: 1, clients_per_round: 4, lr: 0.1, client_parallelism: auto}
observer: {clients: [0, 1], rounds: [0]}
attack: {name: inverting_gradients, grants: {batch_size: true}, config: {iterations: 20}}
output: {plots: false, progress: false}
"""


def test_two_processes_attack_one_simulation_and_process_0_writes_the_summary(tmp_path):
    config = tmp_path / "attack.yaml"
    config.write_text(ATTACK)
    out = tmp_path / "run"
    procs = _run_processes(config, out, "output.checkpoint_every=1", command="attack")
    # Process 1 once failed here: the attack's memory check asked JAX for the
    # memory of jax.devices()[0], process 0's device.
    for i, p in enumerate(procs):
        assert p["rc"] == 0, (i, p["stderr"][-3000:])
    summary = json.loads((out / "attack_summary.json").read_text())
    assert [v["client"] for v in summary["victims"]] == [0, 1]
    assert "mean over 2 victims" in _reported(procs[0]) and _reported(procs[1]) == ""
    # The same attack in one process scores the same reconstructions.
    from attacks.cli import run_attack_experiment
    one = run_attack_experiment(load_config(str(config), [f"output.dir={tmp_path / 'one'}",
                                                          "training.client_parallelism=map"]),
                                quiet=True)
    np.testing.assert_allclose([v["psnr"] for v in summary["victims"]],
                               [v["psnr"] for v in one["victims"]], rtol=1e-4)
    # Run again, the finished run is attacked again from the observations process
    # 0 stored: both processes read them, nothing is simulated.
    procs = _run_processes(config, out, "output.checkpoint_every=1", command="attack")
    for i, p in enumerate(procs):
        assert p["rc"] == 0, (i, p["stderr"][-3000:])
    again = json.loads((out / "attack_summary.json").read_text())
    assert again["rounds_from_disk"] == [0] and "read from" in procs[0]["stderr"]
    assert [v["psnr"] for v in again["victims"]] == [v["psnr"] for v in summary["victims"]]


def test_two_processes_split_the_victims_with_shard_victims(tmp_path):
    config = tmp_path / "attack.yaml"
    # Four victims over the 2 × 2 devices, one each; plain Adam, so that float
    # rounding between layouts stays rounding (signed Adam can flip a sign).
    config.write_text(ATTACK.replace("clients: [0, 1]", "clients: [0, 1, 2, 3]").replace(
        "config: {iterations: 20}", "config: {iterations: 20, signed: false, shard_victims: true}"))
    out = tmp_path / "run"
    procs = _run_processes(config, out, command="attack")
    for i, p in enumerate(procs):
        assert p["rc"] == 0, (i, p["stderr"][-3000:])
    summary = json.loads((out / "attack_summary.json").read_text())
    assert [v["client"] for v in summary["victims"]] == [0, 1, 2, 3]
    assert {v["victim_devices"] for v in summary["victims"]} == {4}
    from attacks.cli import run_attack_experiment
    one = run_attack_experiment(load_config(str(config), [
        f"output.dir={tmp_path / 'one'}", "training.client_parallelism=map",
        "attack.config.shard_victims=false"]), quiet=True)
    assert {v["victim_devices"] for v in one["victims"]} == {1}
    np.testing.assert_allclose([v["psnr"] for v in summary["victims"]],
                               [v["psnr"] for v in one["victims"]], rtol=1e-4)



def test_two_processes_run_an_attack_sweep_that_process_0_tabulates(tmp_path):
    from attacks.cli import run_attack_sweep

    config = tmp_path / "attack.yaml"
    config.write_text(ATTACK)
    grid = ("--grid", "attack.config.iterations=10,20")
    sweep = tmp_path / "sweep"
    procs = _run_processes(config, tmp_path / "unused", command="attack",
                           args=(*grid, "--out", str(sweep)))
    for i, p in enumerate(procs):
        assert p["rc"] == 0, (i, p["stderr"][-3000:])
    table = json.loads((sweep / "results.json").read_text())["rows"]
    assert [r["status"] for r in table] == ["done", "done"]
    assert {r["client_parallelism"] for r in table} == {"sharded"}  # the mesh spans both
    for row in table:
        cell = json.loads((sweep / "cells" / row["cell"] / "attack_summary.json").read_text())
        assert [v["client"] for v in cell["victims"]] == [0, 1]
        assert row["attack_psnr"] == cell["mean"]["psnr"]
    # Process 0 reports the cells (on stderr, as a sweep does); process 1 is silent.
    assert "[2/2] attack.config.iterations=20: done" in procs[0]["stderr"]
    assert "attack.config.iterations" not in procs[1]["stderr"]
    # The same sweep in one process scores the same reconstructions.
    one = run_attack_sweep(str(config), [grid[1]], tmp_path / "one",
                           ["training.client_parallelism=map"], log=lambda m: None)
    np.testing.assert_allclose([r["attack_psnr"] for r in table],
                               [r["attack_psnr"] for r in one], rtol=1e-4)
    assert table[1]["attack_psnr"] > table[0]["attack_psnr"]  # more iterations, closer
