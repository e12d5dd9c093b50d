"""SIGTERM stops a run after a round, with a checkpoint to resume from (fedsim.preemption)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedsim import preemption
from fedsim.config import load_config
from fedsim.run import run_simulation

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """\
name: preempt
seed: 0
data: {dataset: synthetic, num_clients: 6, partition: dirichlet, alpha: 1.0}
model: {name: mlp}
training: {rounds: 5000, clients_per_round: 5, batch_size: 16, lr: 0.5, client_parallelism: map}
eval: {every: 1}
output: {progress: false, plots: false, checkpoint_every: 100000}
"""


def test_the_watch_sets_its_flag_on_sigterm_and_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    with preemption.Watch(handle_signal=True) as watch:
        assert signal.getsignal(signal.SIGTERM) is not before
        assert not watch.stop_after(1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert watch.stop_after(2)
    assert signal.getsignal(signal.SIGTERM) is before
    with preemption.Watch(handle_signal=False) as watch:  # no checkpoints: SIGTERM as it was
        assert signal.getsignal(signal.SIGTERM) is before
        assert not watch.stop_after(1)


def test_a_sigterm_the_inner_watch_did_not_stop_for_reaches_the_outer_one():
    # A run's last round does not stop for SIGTERM (the run is complete); a
    # sweep around it must still learn of it, or it starts the next cell.
    before = signal.getsignal(signal.SIGTERM)
    with preemption.Watch(handle_signal=True) as outer:
        with preemption.Watch(handle_signal=True) as inner:
            os.kill(os.getpid(), signal.SIGTERM)
        assert inner.stop_after(1) and outer.stop_after(1)
        with preemption.Watch(handle_signal=True):  # no signal: nothing passed on
            pass
    assert signal.getsignal(signal.SIGTERM) is before
    with preemption.Watch(handle_signal=True) as outer:
        with preemption.Watch(handle_signal=True):
            pass
        assert not outer.stop_after(1)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _terminate_after_rounds(procs: list, out: Path, signalled: list, rounds: int = 3) -> None:
    """SIGTERM the processes ``signalled`` once ``rounds`` rows are written."""
    deadline = time.time() + 120
    while time.time() < deadline:
        if (out / "metrics.jsonl").exists() and len(_rows(out)) >= rounds:
            break
        assert all(p.poll() is None for p in procs), "a process ended before the signal"
        time.sleep(0.2)
    else:
        pytest.fail(f"fewer than {rounds} rounds in 120 s")
    for i in signalled:
        procs[i].send_signal(signal.SIGTERM)


def _assert_resumes_to_the_uninterrupted_numbers(config: Path, out: Path, tmp_path: Path,
                                                 done: int) -> None:
    cfg = lambda d, *o: load_config(str(config), [f"output.dir={d}", f"training.rounds={done + 2}",
                                                  *o])
    run_simulation(cfg(out), quiet=True)
    assert f"resumed from {out / 'checkpoints'}: {done} rounds done" in (out / "run.log").read_text()
    run_simulation(cfg(tmp_path / "ref", "output.checkpoint_every=0"), quiet=True)
    rows, ref = _rows(out), _rows(tmp_path / "ref")
    assert [r["round"] for r in rows] == list(range(done + 2))
    for key in ("train_loss", "test_accuracy"):
        np.testing.assert_allclose([r[key] for r in rows], [r[key] for r in ref], rtol=1e-6,
                                   err_msg=key)


def test_sigterm_stops_a_run_after_a_round_with_a_checkpoint_it_resumes_from(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    out = tmp_path / "run"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "fedsim", "run", str(config), "--set",
                             f"output.dir={out}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _terminate_after_rounds([proc], out, [0])
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, stderr[-3000:]
    done = len(_rows(out))
    assert stderr.count(f"stopped by SIGTERM after round {done}: a checkpoint is saved") == 1
    assert f"stopped by SIGTERM after round {done}" in (out / "run.log").read_text()
    # The periodic checkpoints are 100,000 rounds apart: this one is SIGTERM's.
    assert os.listdir(out / "checkpoints") == [str(done)]
    assert not (out / "summary.json").exists()
    _assert_resumes_to_the_uninterrupted_numbers(config, out, tmp_path, done)
