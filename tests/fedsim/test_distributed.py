"""Several processes running one simulation (fedsim.distributed, `fedsim run --coordinator`).

Two processes on this machine, two CPU devices each, joined by
``jax.distributed`` (gloo collectives): the ``sharded`` strategy's mesh spans
all four devices. Checked against a one-process run of the same config.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedsim import distributed
from fedsim.cli import main
from fedsim.config import load_config
from fedsim.run import run_simulation

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """\
name: multiprocess
seed: 0
data: {dataset: synthetic, num_clients: 6, partition: dirichlet, alpha: 1.0}
model: {name: mlp}
training: {rounds: 2, clients_per_round: 5, batch_size: 16, lr: 0.5, client_parallelism: auto}
eval: {every: 1}
output: {progress: false, plots: false, checkpoint_every: 1}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start_processes(config: Path, out: Path, *overrides: str, n: int = 2,
                     command: str = "run", only: dict | None = None,
                     args: tuple[str, ...] = (), launcher: tuple[str, ...] = ("-m", "fedsim"),
                     ) -> list[subprocess.Popen]:
    """``fedsim COMMAND`` started in n processes of 2 CPU devices each.

    ``only`` maps a process id to overrides for that process alone; ``args`` are
    more command-line arguments for every process; ``launcher`` what follows
    ``python`` (a script that calls :func:`fedsim.cli.main` instead of the
    module).
    """
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    sets = lambda i: [a for o in (f"output.dir={out}", *overrides, *(only or {}).get(i, ()))
                      for a in ("--set", o)]
    return [subprocess.Popen(
        [sys.executable, *launcher, command, str(config), *sets(i), *args, "--coordinator",
         f"localhost:{port}", "--num-processes", str(n), "--process-id", str(i)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(n)]


def _wait(procs: list[subprocess.Popen], timeout: float = 300) -> list[dict]:
    """Their return codes and output; a process still running after ``timeout`` s fails."""
    results = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            results.append({"rc": p.returncode, "stdout": stdout, "stderr": stderr})
    finally:
        for p in procs:
            p.kill()
    return results


def _run_processes(config: Path, out: Path, *overrides: str, timeout: float = 300,
                   **kwargs) -> list[dict]:
    """:func:`_start_processes`, then :func:`_wait`."""
    return _wait(_start_processes(config, out, *overrides, **kwargs), timeout)


def _reported(p: dict) -> str:
    """A process's stdout without the "[Gloo] Rank i is connected to k peer ranks. Expected
    number of connected peer ranks is : k" lines Gloo prints itself (from its own threads,
    so two of them can interleave and break a line in two, or leave a line of its
    own empty: seen once under CI's load; or leave the count k alone on a line: seen
    once in a CI rehearsal, process 1 reporting "3\n"). No process reports a bare
    number: process 0 reports a JSON object."""
    gloo = lambda line: (line.startswith("[Gloo]") or "connected peer ranks" in line
                         or not line.strip() or line.strip().isdigit())
    return "".join(l for l in p["stdout"].splitlines(True) if not gloo(l))


def _reference_rows(config: Path, out: Path, rounds: int, *overrides: str) -> list[dict]:
    cfg = load_config(str(config), [f"output.dir={out}", f"training.rounds={rounds}",
                                    "training.client_parallelism=map",
                                    "output.checkpoint_every=0", *overrides])
    run_simulation(cfg, quiet=True)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _assert_same_rows(rows, ref):
    assert [r["round"] for r in rows] == [r["round"] for r in ref]
    for key in ("train_loss", "test_accuracy", "test_loss"):
        np.testing.assert_allclose([r[key] for r in rows], [r[key] for r in ref], rtol=1e-6,
                                   err_msg=key)


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return path


def test_two_processes_run_one_simulation_that_process_0_writes(config, tmp_path):
    out = tmp_path / "run"
    procs = _run_processes(config, out)
    for i, p in enumerate(procs):
        assert p["rc"] == 0, (i, p["stderr"][-3000:])
    # One set of files: before, every process appended its own copy of each row.
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    log = (out / "run.log").read_text().splitlines()
    assert len(log) == 1 and "sharded, the one strategy that spreads a cohort over 2 processes" \
        in log[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["client_parallelism"] == "sharded"
    assert json.loads(_reported(procs[0]))["final_train_loss"] == summary["final_train_loss"]
    assert _reported(procs[1]) == ""  # only process 0 reports
    assert sorted(os.listdir(out / "checkpoints")) == ["1", "2"]
    # The four devices of two processes train the cohort as one process does.
    _assert_same_rows(rows, _reference_rows(config, tmp_path / "ref", 2))


def test_a_cohort_that_divides_over_the_devices_is_read_back_in_every_process(config, tmp_path):
    # 4 clients on 2 × 2 devices: the per-client losses kept the clients sharding,
    # and no process could fetch them ("spans non-addressable devices").
    out = tmp_path / "run"
    procs = _run_processes(config, out, "training.clients_per_round=4")
    for i, p in enumerate(procs):
        assert p["rc"] == 0, (i, p["stderr"][-3000:])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    _assert_same_rows(rows, _reference_rows(config, tmp_path / "ref", 2,
                                            "training.clients_per_round=4"))


@pytest.mark.slow  # four 2-process sweeps' worth of runs
def test_two_processes_run_a_sweep_that_process_0_writes_and_both_skip_on_rerun(config, tmp_path):
    out = tmp_path / "sweep"
    sweep = ("--grid", "training.lr=0.25,0.5", "--out", str(out))
    procs = _run_processes(config, tmp_path / "unused", command="sweep", args=sweep)
    for i, p in enumerate(procs):
        assert p["rc"] == 0, (i, p["stderr"][-3000:])
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["training.lr"], r["status"]) for r in rows] == [(0.25, "done"), (0.5, "done")]
    # Only process 0 logs the cells; process 1 says nothing but JAX's own lines.
    assert "[2/2] training.lr=0.5: done" in procs[0]["stderr"]
    assert "[1/2]" not in procs[1]["stderr"] and _reported(procs[1]) == ""
    for r in rows:  # every cell trained as one process trains it
        cell = [json.loads(line) for line in
                (out / "cells" / r["cell"] / "metrics.jsonl").read_text().splitlines()]
        _assert_same_rows(cell, _reference_rows(config, tmp_path / f"ref{r['training.lr']}", 2,
                                                f"training.lr={r['training.lr']}"))
    procs = _run_processes(config, tmp_path / "unused", command="sweep", args=sweep)
    for i, p in enumerate(procs):
        assert p["rc"] == 0, (i, p["stderr"][-3000:])
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["done (skipped)"] * 2


# fedsim's command line, with the second round failing in process 1 alone (as
# running out of memory on one host would) where training.lr is 0.25.
FAILING_IN_PROCESS_1 = """\
import sys

from fedsim import distributed
from fedsim.cli import main
from fedsim.simulation import Simulation

distributed.PEER_WAIT_AFTER_FAILURE_S = 5.0
process = int(sys.argv[sys.argv.index("--process-id") + 1])
run_round = Simulation.run_round


def failing(self, state, round_idx):
    # Round 1, after round 0's collectives connected the processes.
    if process == 1 and self.cfg.training.lr == 0.25 and round_idx == 1:
        raise RuntimeError("injected into process 1 alone")
    return run_round(self, state, round_idx)


Simulation.run_round = failing
sys.exit(main())
"""


def _ended_after_its_peer(p: dict) -> bool:
    """A process stopped by JAX once its peer went silent (abort), or by its own error."""
    return p["rc"] != 0 and ("detected fatal errors" in p["stderr"]
                             or "fedsim: error:" in p["stderr"])


def test_a_sweep_goes_on_after_a_shared_failure_and_stops_every_process_after_a_lone_one(
        config, tmp_path):
    # lr = 1e39 (inf in float32) diverges in every process alike (a NaN in the
    # model): recorded, and the sweep goes on. lr = 0.25 fails in process 1 alone,
    # in round 1, while process 0 waits for it in round 1's collective. Before,
    # process 1 went on to the next cell and both waited forever. Now process 1
    # stops after its 5 s wait for the others' outcome, and process 0 stops once
    # JAX notices process 1 is gone (here after a 10 s heartbeat timeout).
    driver = tmp_path / "driver.py"
    driver.write_text(FAILING_IN_PROCESS_1)
    out = tmp_path / "sweep"
    procs = _run_processes(config, tmp_path / "unused", command="sweep", timeout=120,
                           launcher=(str(driver),),
                           args=("--grid", "training.lr=1e39,0.25,0.5", "--out", str(out),
                                 "--heartbeat-timeout", "10"))
    assert procs[1]["rc"] == 2, procs[1]["stderr"][-3000:]
    assert ("sweep cell training.lr=0.25: process(es) [0] did not report within 5 s"
            in procs[1]["stderr"]), procs[1]["stderr"][-3000:]
    assert _ended_after_its_peer(procs[0]), (procs[0]["rc"], procs[0]["stderr"][-3000:])
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert rows[0]["training.lr"] == 1e39
    assert rows[0]["status"].startswith("failed: NonFiniteError")
    assert "training.lr=0.25: done" not in procs[0]["stderr"]
    assert not (out / "cells" / "training.lr=0.5").exists()


def test_a_run_that_fails_in_one_process_stops_every_process(config, tmp_path):
    # Before, process 1 waited in JAX's shutdown barrier at exit, alive, while
    # process 0 waited for it in round 1's collective.
    driver = tmp_path / "driver.py"
    driver.write_text(FAILING_IN_PROCESS_1)
    procs = _run_processes(config, tmp_path / "run", "training.lr=0.25", timeout=120,
                           launcher=(str(driver),), args=("--heartbeat-timeout", "10"))
    assert procs[1]["rc"] == 1, procs[1]["stderr"][-3000:]
    assert "RuntimeError: injected into process 1 alone" in procs[1]["stderr"]
    assert "this process stopped with the error above" in procs[1]["stderr"]
    assert _ended_after_its_peer(procs[0]), (procs[0]["rc"], procs[0]["stderr"][-3000:])


def test_sigterm_to_one_process_stops_every_process_after_the_same_round(config, tmp_path):
    # JAX's preemption notifier catches SIGTERM in a joined process: before, the
    # run went on to its end as if nothing had happened (checked by hand).
    from tests.fedsim.test_preemption import _terminate_after_rounds

    out = tmp_path / "run"
    long = ("training.rounds=5000", "output.checkpoint_every=100000")
    procs = _start_processes(config, out, *long)
    _terminate_after_rounds(procs, out, signalled=[1])
    results = _wait(procs, timeout=120)
    for i, p in enumerate(results):
        assert p["rc"] == 143, (i, p["rc"], p["stderr"][-3000:])
    done = int(os.listdir(out / "checkpoints")[0])
    assert os.listdir(out / "checkpoints") == [str(done)]
    assert len(_rows(out)) == done
    assert f"stopped by SIGTERM after round {done}: a checkpoint" in results[0]["stderr"]
    # Two processes resume from it, to the one-process numbers.
    procs = _run_processes(config, out, f"training.rounds={done + 2}")
    for i, p in enumerate(procs):
        assert p["rc"] == 0, (i, p["stderr"][-3000:])
    assert f"{done} rounds done" in (out / "run.log").read_text()
    _assert_same_rows(_rows(out), _reference_rows(config, tmp_path / "ref", done + 2))


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_agree_is_the_flag_itself_in_one_process():
    assert distributed.agree(True) is True and distributed.agree(False) is False


@pytest.mark.slow  # two more 2-process runs
def test_a_multi_process_run_resumes_from_its_checkpoint(config, tmp_path):
    # Pseudo-Pruning keeps per-client state (the withheld weights), which the
    # checkpoint must carry across processes too.
    pseudo = "defenses=[{name: prune_largest, p: 0.3, pseudo: true}]"
    out = tmp_path / "run"
    assert all(p["rc"] == 0 for p in _run_processes(config, out, pseudo))
    procs = _run_processes(config, out, pseudo, "training.rounds=3")
    for i, p in enumerate(procs):
        assert p["rc"] == 0, (i, p["stderr"][-3000:])
    assert "resumed from" in (out / "run.log").read_text()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    _assert_same_rows(rows, _reference_rows(config, tmp_path / "ref", 3, pseudo))


# Process 1 looks for the checkpoint directory only after process 0 has created
# it (faked: process 1 sees "checkpoints" as a directory before it exists).
LATE_VIEW_IN_PROCESS_1 = """\
import pathlib
import sys

from fedsim import checkpoint
from fedsim.cli import main

if sys.argv[sys.argv.index("--process-id") + 1] == "1":
    class LatePath(type(pathlib.Path())):
        def is_dir(self):
            return self.name == "checkpoints" or super().is_dir()

    checkpoint.Path = LatePath
sys.exit(main())
"""


def test_a_process_that_sees_the_checkpoint_directory_later_joins_the_others(config, tmp_path):
    # Opening the checkpoint directory is a collective (orbax syncs the
    # processes). Before, each process's own view of whether it existed decided:
    # process 1, looking after process 0 had created it, opened it alone and
    # crashed in a collective process 0 never joined (seen in an attack sweep:
    # gloo "Received data size doesn't match expected size"). Process 0's view
    # now decides for all.
    driver = tmp_path / "driver.py"
    driver.write_text(LATE_VIEW_IN_PROCESS_1)
    out = tmp_path / "run"
    procs = _run_processes(config, out, "training.rounds=1", timeout=120,
                           launcher=(str(driver),))
    for i, p in enumerate(procs):
        assert p["rc"] == 0, (i, p["stderr"][-3000:])
    assert sorted(os.listdir(out / "checkpoints")) == ["1"]


def test_a_strategy_that_cannot_span_processes_is_refused_in_each(config, tmp_path):
    procs = _run_processes(config, tmp_path / "run", "training.client_parallelism=vmap")
    for p in procs:
        assert p["rc"] == 2
        assert "training.client_parallelism=vmap trains the whole cohort in each of the 2 " \
               "processes" in p["stderr"]


def test_processes_started_with_different_configs_all_stop(config, tmp_path):
    # Another seed in process 1: each would train its own cohort and still sum them.
    procs = _run_processes(config, tmp_path / "run", only={1: ["seed=1"]})
    for p in procs:
        assert p["rc"] == 2
        assert "process(es) [1] run a config that differs from process 0's" in p["stderr"]
    # output.* may differ: where and how each process writes is not the simulation.
    procs = _run_processes(config, tmp_path / "run2", only={1: ["output.plots=true"]})
    assert [p["rc"] for p in procs] == [0, 0], procs[1]["stderr"][-2000:]


@pytest.mark.parametrize("argv,message", [
    (["--num-processes", "2"], "go together"),
    (["--coordinator", "localhost", "--num-processes", "2", "--process-id", "0"],
     "expected HOST:PORT"),
    (["--coordinator", "localhost:1234", "--num-processes", "0", "--process-id", "0"],
     "at least 1"),
    (["--coordinator", "localhost:1234", "--num-processes", "2", "--process-id", "2"],
     r"must lie in \[0, 2\)"),
    (["--coordinator", "localhost:1234", "--num-processes", "2", "--process-id", "0",
      "--heartbeat-timeout", "0"], "--heartbeat-timeout: must be at least 1 s, got 0"),
    (["--heartbeat-timeout", "10"], "--heartbeat-timeout: only for a multi-process run"),
    (["--coordinator", "localhost:1234", "--num-processes", "2", "--process-id", "0",
      "--join-timeout", "0"], "--join-timeout: must be at least 1 s, got 0"),
    (["--join-timeout", "10"], "--join-timeout: only for a multi-process run"),
])
def test_bad_process_arguments_are_named_before_jax_is_joined(config, argv, message, capsys):
    assert main(["run", str(config), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedsim: error: ")
    import re
    assert re.search(message, err), err


def test_a_process_that_stops_before_joining_stops_the_others_after_the_join_timeout(
        config, tmp_path):
    # Process 1's override is bad, so it stops before joining. Before, process 0
    # waited JAX's 300 s, and JAX then aborts a process still joining with a C++
    # check failure whose stack trace names no cause (seen by hand with a bare
    # jax.distributed.initialize and a 3 s timeout).
    procs = _run_processes(config, tmp_path / "run", only={1: ["training.lr=fast"]},
                           args=("--join-timeout", "3"), timeout=60)
    assert procs[1]["rc"] == 2 and "training.lr" in procs[1]["stderr"], procs[1]["stderr"]
    assert procs[0]["rc"] == 2, procs[0]["stderr"][-3000:]
    assert ("fedsim: error: process 0 of 2: not every process joined the run at localhost:"
            in procs[0]["stderr"]), procs[0]["stderr"][-3000:]
    assert "within 3 s (--join-timeout)" in procs[0]["stderr"]
    assert "Check failure stack trace" not in procs[0]["stderr"]
    assert not (tmp_path / "run").exists()


def _fake_join(monkeypatch, seconds: float) -> list:
    """``jax.distributed.initialize`` replaced by a wait of ``seconds``, the join
    grace by 0.1 s, and :func:`distributed.leave` by a record of its calls."""
    import time

    left = []
    monkeypatch.setattr(distributed.jax.distributed, "initialize",
                        lambda *a, **k: time.sleep(seconds))
    monkeypatch.setattr(distributed, "JOIN_GRACE_S", 0.1)
    monkeypatch.setattr(distributed, "leave", left.append)
    return left


def test_the_join_watch_stops_a_process_still_joining_after_the_timeout(monkeypatch, capsys):
    left = _fake_join(monkeypatch, seconds=1.6)
    distributed.initialize("localhost:1234", 3, 2, join_timeout=1)
    assert left == [2]
    assert ("process 2 of 3: not every process joined the run at localhost:1234 within 1 s"
            in capsys.readouterr().err)


def test_the_join_watch_is_called_off_once_the_process_has_joined(monkeypatch, capsys):
    import time

    left = _fake_join(monkeypatch, seconds=0.0)
    distributed.initialize("localhost:1234", 2, 0, join_timeout=1)
    time.sleep(1.5)  # past the deadline and its grace
    assert left == [] and capsys.readouterr().err == ""


def test_auto_becomes_sharded_and_other_strategies_are_refused(monkeypatch):
    assert distributed.check_strategy("vmap") is None  # one process: anything goes
    monkeypatch.setattr(distributed.jax, "process_count", lambda: 3)
    assert distributed.check_strategy("auto") == "sharded"
    assert distributed.check_strategy("sharded") == "sharded"
    for strategy in ("vmap", "map", "chunked", "loop"):
        with pytest.raises(distributed.DistributedError, match=f"={strategy} trains"):
            distributed.check_strategy(strategy)
