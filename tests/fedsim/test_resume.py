"""A run killed with SIGKILL at a random round resumes to the same summary."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMING = {"seconds", "peak_rss_mb"}
#: What the summary says of the command that wrote it, not of the run.
THIS_COMMAND = TIMING | {"rounds_trained"}

CONFIG = """
name: resume
seed: 3
data: {dataset: synthetic, num_clients: 8, partition: dirichlet, alpha: 1.0, image_size: 16,
       max_train: 600, max_test: 200}
model: {name: mlp}
training: {rounds: 8, clients_per_round: 3, batch_size: 16, lr: 0.5, client_parallelism: map,
           server_optimizer: adam, server_lr: 0.05}
eval: {every: 2}
output: {checkpoint_every: 1, progress: false, plots: false}
"""


def _cmd(cfg, out):
    return [sys.executable, "-m", "fedsim", "run", str(cfg), "--quiet", "--set", f"output.dir={out}"]


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")


def _rows(out):
    p = out / "metrics.jsonl"
    return p.read_text().count("\n") if p.exists() else 0


@pytest.mark.slow
def test_sigkill_at_random_round_then_resume_matches_uninterrupted(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CONFIG)
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    subprocess.run(_cmd(cfg, ref), cwd=ROOT, env=_env(), check=True, capture_output=True, timeout=300)
    kill_after = random.Random().randint(1, 6)  # rounds completed before the kill
    proc = subprocess.Popen(_cmd(cfg, killed), cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while _rows(killed) < kill_after and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "summary.json").exists(), "run finished before the kill"
    done = _rows(killed)
    assert 1 <= done < 8
    p = subprocess.run(_cmd(cfg, killed), cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    # Killed while round `done`'s checkpoint was being written, the run resumes
    # from the one before (from scratch, with no message, if that was round 1's).
    resumed = re.search(r"resumed from .*: (\d+) rounds done", (killed / "run.log").read_text())
    start = int(resumed.group(1)) if resumed else 0
    assert done - 1 <= start <= done, (killed / "run.log").read_text()
    a = json.loads((ref / "summary.json").read_text())
    b = json.loads((killed / "summary.json").read_text())
    assert {k: v for k, v in a.items() if k not in THIS_COMMAND} == \
        {k: v for k, v in b.items() if k not in THIS_COMMAND}, f"killed after {done} rounds"
    # The resuming command trained the rounds after its checkpoint, no more.
    assert (a["rounds_trained"], b["rounds_trained"]) == (8, 8 - start)
    ra = [{k: v for k, v in r.items() if k != "seconds"}
          for r in map(json.loads, (ref / "metrics.jsonl").read_text().splitlines())]
    rb = [{k: v for k, v in r.items() if k != "seconds"}
          for r in map(json.loads, (killed / "metrics.jsonl").read_text().splitlines())]
    assert ra == rb
