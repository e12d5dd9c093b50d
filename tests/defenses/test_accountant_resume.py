"""A checkpointed and resumed run reports the ε and leakage of a run done in one go.

The DP accountant's participation counts and the leakage ledger's step counts
are host-side state of round callbacks; they used to live only in memory, so
a resumed (or extended) run restarted them at 0 and under-reported ε (audit
F1: straight [1.5336, 2.1233, 2.6030], resumed [1.5336, 1.5336, 2.1233]).
"""

import dataclasses
import json

import numpy as np
import pytest

from defenses.channels import LeakageLedger
from defenses.dp.accountant_hook import PrivacyAccountant
from fedsim import checkpoint
from fedsim.run import run_simulation
from fedsim.simulation import Simulation
from tests.fedsim.helpers import small_config, small_dataset

# What the two callbacks add to a metrics row.
ACCOUNTING_KEYS = ("dp_mechanism", "epsilon", "delta", "epsilon_client", "leakage_kappa",
                   "leakage_steps", "leakage_total", "leakage_total_mean", "mse_lower_bound")


def _cfg(out, rounds, **over):
    # 3 of 6 clients per round: clients take part a different number of times,
    # so the counts (not only the round number) have to survive the resume.
    cfg = small_config(**{"output.dir": str(out), "training.algorithm": "fedavg",
                          "training.local_epochs": 1, "data.partition": "iid",
                          "training.lr": 0.1, "training.rounds": rounds,
                          "training.clients_per_round": 3, "output.checkpoint_every": 1,
                          **over})
    return dataclasses.replace(cfg, defenses=[
        {"name": "natural_channel", "kappa": 5.0, "dataset": "synthetic", "image_size": 16,
         "max_examples": 120},
        {"name": "dp_gaussian", "noise_multiplier": 1.1, "clip_norm": 1.0}])


def _dataset():
    return small_dataset(n=120)  # 20 examples per client: compiles and trains quickly


def _sim(cfg):
    return Simulation(cfg, dataset=_dataset())


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _accounting(rows):
    return [{k: r.get(k) for k in ACCOUNTING_KEYS} for r in rows]


def test_resumed_and_extended_run_reports_the_straight_runs_epsilon_and_leakage(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    a = run_simulation(_cfg(straight, 3), sim=_sim(_cfg(straight, 3)), quiet=True)
    run_simulation(_cfg(resumed, 1), sim=_sim(_cfg(resumed, 1)), quiet=True)
    # A new Simulation (as a new process would build) extends the 1-round run to 3.
    b = run_simulation(_cfg(resumed, 3), sim=_sim(_cfg(resumed, 3)), quiet=True)
    assert "resumed from" in (resumed / "run.log").read_text()
    rows_a, rows_b = _rows(straight), _rows(resumed)
    assert [r["round"] for r in rows_b] == [0, 1, 2]
    assert all(r.get("epsilon") is not None and r.get("leakage_total") is not None
               for r in rows_a)
    assert _accounting(rows_b) == _accounting(rows_a)
    assert b["epsilon"] == a["epsilon"] and b["leakage_total"] == a["leakage_total"]
    assert rows_a[2]["epsilon"] > rows_a[0]["epsilon"]


def _callbacks(sim):
    acc = next(cb for cb in sim.round_callbacks if isinstance(cb, PrivacyAccountant))
    ledger = next(cb for cb in sim.round_callbacks if isinstance(cb, LeakageLedger))
    return acc, ledger


def _straight_rows(sim, rounds):
    out = []
    for r in range(rounds):
        row = {}
        for cb in sim.round_callbacks:
            row.update(cb(r, row))
        out.append(row)
    return out


@pytest.fixture(scope="module")
def reference():
    """Rows of rounds 0..4 from callbacks that saw every round (no training needed:
    the callbacks read only the cohorts, client sizes and settings)."""
    cfg = _cfg("unused", 5)
    return _straight_rows(_sim(cfg), 5)


def test_restored_state_continues_the_counts(reference):
    cfg = _cfg("unused", 5)
    first = _sim(cfg)
    _straight_rows(first, 2)
    states = checkpoint.callback_states(first.round_callbacks)
    assert all(s is not None for s in states)
    json.dumps(states)  # it goes into the checkpoint's JSON metadata
    second = _sim(cfg)
    checkpoint.load_callback_states(second.round_callbacks, states)
    for r in (2, 3, 4):
        row = {}
        for cb in second.round_callbacks:
            row.update(cb(r, row))
        assert row == reference[r], r


def test_a_checkpoint_without_their_state_replays_the_cohorts(reference):
    # Checkpoints written before the callbacks had a state carry None for them.
    sim = _sim(_cfg("unused", 5))
    checkpoint.load_callback_states(sim.round_callbacks, [None] * len(sim.round_callbacks))
    row = {}
    for cb in sim.round_callbacks:
        row.update(cb(3, row))
    assert row == reference[3]


def test_a_state_saved_by_another_callback_is_not_read_as_counts(reference):
    # The checkpoint pairs callbacks and states by position; swapped states are ignored.
    first = _sim(_cfg("unused", 5))
    _straight_rows(first, 2)
    acc, ledger = _callbacks(first)
    sim = _sim(_cfg("unused", 5))
    acc2, ledger2 = _callbacks(sim)
    acc2.load_state_dict(ledger.state_dict())
    ledger2.load_state_dict(acc.state_dict())
    assert acc2.rounds_counted == 0 and ledger2.rounds_counted == 0
    row = {}
    for cb in sim.round_callbacks:
        row.update(cb(2, row))
    assert row == reference[2]


def test_a_state_for_another_number_of_clients_is_refused():
    sim = _sim(_cfg("unused", 5))
    acc, ledger = _callbacks(sim)
    bad_acc = {**acc.state_dict(), "participations": [1, 2]}
    bad_ledger = {**ledger.state_dict(), "cum": [1, 2]}
    with pytest.raises(ValueError, match="2 clients, this simulation has 6"):
        acc.load_state_dict(bad_acc)
    with pytest.raises(ValueError, match="2 clients, this simulation has 6"):
        ledger.load_state_dict(bad_ledger)


def test_a_second_run_on_the_same_simulation_counts_from_round_0(reference):
    sim = _sim(_cfg("unused", 5))
    _straight_rows(sim, 4)
    assert _straight_rows(sim, 2) == reference[:2]


def test_a_repeated_round_is_not_counted_twice(reference):
    sim = _sim(_cfg("unused", 5))
    _straight_rows(sim, 2)
    again = {}
    for cb in sim.round_callbacks:
        again.update(cb(1, again))
    assert again == reference[1]
    acc, ledger = _callbacks(sim)
    expected = np.zeros(sim.num_clients, np.int64)
    for r in (0, 1):
        expected[sim.cohort(r)] += 1
    np.testing.assert_array_equal(acc.participations, expected)
    np.testing.assert_array_equal(ledger.cum, expected * ledger.steps)
