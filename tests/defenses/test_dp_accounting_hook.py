"""A run with an example-stage DP defense reports ε per round (metrics + summary)."""

import dataclasses
import json
import math

import jax
import pytest

import defenses  # noqa: F401
from defenses import accounting
from fedsim.run import run_simulation
from fedsim.simulation import Simulation
from tests.fedsim.helpers import small_config, small_dataset


def _cfg(tmp_path, specs, **over):
    cfg = small_config(**{"output.dir": str(tmp_path), "training.algorithm": "fedavg",
                          "training.local_epochs": 1, "data.partition": "iid",
                          "training.lr": 0.1, **over})
    return dataclasses.replace(cfg, defenses=specs)


def test_epsilon_per_round_matches_accountant(tmp_path):
    cfg = _cfg(tmp_path, [{"name": "dp_gaussian", "noise_multiplier": 1.1, "clip_norm": 1.0}],
               **{"training.rounds": 2, "training.clients_per_round": 6})
    sim = Simulation(cfg, dataset=small_dataset())
    summary = run_simulation(cfg, sim=sim, quiet=True)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["dp_mechanism"] for r in rows] == ["gauss", "gauss"]
    # All 6 IID clients take part each round: independent recomputation of the worst case.
    n = max(int(c) for c in sim.client_counts)
    delta = 1.0 / n
    worst = []
    for rounds in (1, 2):
        eps = [accounting.gaussian_epsilon(1.1, min(1.0, 16 / int(c)), delta,
                                           steps=math.ceil(int(c) / 16) * rounds).epsilon
               for c in sim.client_counts]
        worst.append(max(eps))
    assert rows[0]["epsilon"] == pytest.approx(worst[0], rel=1e-9)
    assert rows[1]["epsilon"] == pytest.approx(worst[1], rel=1e-9)
    assert rows[1]["epsilon"] > rows[0]["epsilon"]
    assert summary["epsilon"] == rows[1]["epsilon"] and summary["delta"] == delta
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["epsilon"] == rows[1]["epsilon"]


def test_no_dp_defense_no_epsilon(tmp_path):
    cfg = _cfg(tmp_path, [], **{"training.rounds": 1})
    summary = run_simulation(cfg, sim=Simulation(cfg, dataset=small_dataset()), quiet=True)
    assert "epsilon" not in summary


def test_a_fedsgd_run_with_vmf_noise_reports_its_epsilon(tmp_path):
    """FedSGD is one full-batch step (sample rate 1); at kappa = 300 (001 Table IV)
    the VMF accountant divided by zero there and killed the run."""
    cfg = _cfg(tmp_path, [{"name": "dp_vmf", "kappa": 300.0, "clip_norm": 1.0}],
               **{"training.algorithm": "fedsgd", "training.rounds": 1})
    summary = run_simulation(cfg, sim=Simulation(cfg, dataset=small_dataset()), quiet=True)
    dim = sum(leaf.size for leaf in jax.tree_util.tree_leaves(summary["final_state"].params))
    expected = accounting.vmf_epsilon(300.0, dim, 1.0, summary["delta"], steps=1)
    assert math.isfinite(expected.epsilon)
    assert summary["epsilon"] == pytest.approx(expected.epsilon, rel=1e-9)
