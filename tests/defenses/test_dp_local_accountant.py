"""Clipped update noise reports the local-DP ε of each client's uploads per round."""

import dataclasses
import json

import numpy as np
import pytest

from defenses import accounting
from defenses.dp import DPParameters, attach_local_accountant, dp_parameters, update_gaussian
from defenses.dp import update_laplace
from defenses.dp.local_accountant import LocalAccountant, local_epsilon
from fedsim.run import run_simulation
from fedsim.simulation import Simulation
from tests.fedsim.helpers import small_config, small_dataset

K, M = 6, 3


def _cfg(tmp_path, specs, **over):
    cfg = small_config(**{"output.dir": str(tmp_path), "training.clients_per_round": M,
                          "data.num_clients": K, **over})
    return dataclasses.replace(cfg, defenses=specs)


def _uploads_through(sim, round_idx):
    """Independent count: each client's uploads over rounds 0..round_idx."""
    counts = np.zeros(sim.num_clients, int)
    for r in range(round_idx + 1):
        counts[np.asarray(sim.cohort(r))] += 1
    return counts


def _local(sim):
    (acc,) = [cb for cb in sim.round_callbacks if isinstance(cb, LocalAccountant)]
    return acc


def test_laplace_uploads_compose_to_k_times_2c_over_b(tmp_path):
    b, c = 0.8, 0.2
    cfg = _cfg(tmp_path, [{"name": "update_laplace", "scale": b, "clip_norm": c}],
               **{"training.rounds": 3})
    sim = Simulation(cfg, dataset=small_dataset())
    summary = run_simulation(cfg, sim=sim, quiet=True)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for r, row in enumerate(rows):
        k = _uploads_through(sim, r).max()
        assert row["local_epsilon"] == pytest.approx(k * 2 * c / b, rel=1e-12)
        assert row["local_delta"] == 0.0
    assert summary["local_epsilon"] == rows[-1]["local_epsilon"]


def test_gaussian_uploads_compose_unsampled_at_multiplier_sigma_over_2c(tmp_path):
    """Against the package's own RDP conversion of k·α/(2μ²), μ = σ/(2C)."""
    sigma, c = 0.9, 0.5
    sim = Simulation(_cfg(tmp_path, [{"name": "update_gaussian", "sigma": sigma,
                                      "clip_norm": c}]), dataset=small_dataset())
    acc = _local(sim)
    assert acc.delta == 1.0 / K
    orders = np.array(accounting._gaussian._make_accountant("rdp")._orders)
    for r in range(3):
        row = acc(r, {})
        k = _uploads_through(sim, r).max()
        mu = sigma / (2 * c)
        expected, _ = accounting.rdp_to_epsilon(orders, k * orders / (2 * mu**2), acc.delta)
        assert row["local_epsilon"] == pytest.approx(expected, rel=1e-6)
        assert row["local_delta"] == acc.delta
    assert attach_local_accountant(sim, delta=1e-6) is True and acc.delta == 1e-6


def test_the_configs_accounting_local_delta_is_the_local_delta(tmp_path):
    sim = Simulation(_cfg(tmp_path, [{"name": "update_gaussian", "sigma": 0.9, "clip_norm": 0.5}],
                          **{"accounting.local_delta": 1e-6}), dataset=small_dataset())
    acc = _local(sim)
    assert acc.delta == 1e-6 and acc(0, {})["local_delta"] == 1e-6


def test_only_clipped_noise_guarantees_anything():
    assert update_gaussian(0.1).guarantees == ()
    assert update_laplace(0.1).guarantees == ()
    assert dp_parameters(update_gaussian(0.3, clip_norm=2.0), level="local") == DPParameters(
        "gauss", noise_multiplier=0.15, clip_norm=2.0, level="local")
    assert dp_parameters(update_laplace(0.3, clip_norm=2.0), level="local").mechanism == "laplace"
    with pytest.raises(ValueError, match="mechanism 'vmf'"):
        local_epsilon(DPParameters("vmf", kappa=1.0, level="local"), 1, 1e-5)
    assert local_epsilon(DPParameters("gauss", noise_multiplier=1.0, level="local"), 0, 1e-5) == 0


def test_unclipped_noise_has_no_accountant_and_counts_survive_a_checkpoint(tmp_path):
    plain = Simulation(_cfg(tmp_path, [{"name": "update_gaussian", "sigma": 0.1}]),
                       dataset=small_dataset())
    assert not any(isinstance(cb, LocalAccountant) for cb in plain.round_callbacks)
    spec = [{"name": "update_laplace", "scale": 1.0, "clip_norm": 0.5}]
    sim = Simulation(_cfg(tmp_path, spec), dataset=small_dataset())
    first = [_local(sim)(r, {}) for r in range(3)]
    state = json.loads(json.dumps(_local(sim).state_dict()))
    again = Simulation(_cfg(tmp_path, spec), dataset=small_dataset())
    _local(again).load_state_dict({"kind": "dp_accountant", "participations": [9] * K,
                                   "rounds_counted": 9})  # another callback's: ignored
    assert _local(again).rounds_counted == 0
    _local(again).load_state_dict(state)
    assert _local(again).rounds_counted == 3
    assert _local(again)(2, {}) == first[2]


def test_dp_fedavg_uploads_report_the_local_epsilon_of_their_noise_share(tmp_path):
    """Each client_level_dp upload carries N(0, σ²C²/m): local multiplier σ/(2√m)."""
    sigma, c = 2.0, 0.5
    spec = [{"name": "client_level_dp", "clip_norm": c, "noise_multiplier": sigma,
             "clients_per_round": M}]
    sim = Simulation(_cfg(tmp_path, spec, **{"training.weighting": "uniform"}),
                     dataset=small_dataset())
    row = _local(sim)(1, {})
    share = DPParameters("gauss", noise_multiplier=sigma / np.sqrt(M), level="local")
    assert row["local_epsilon"] == local_epsilon(share, _uploads_through(sim, 1).max(), 1 / K)
    user = [cb for cb in sim.round_callbacks if not isinstance(cb, LocalAccountant)]
    assert user and user[0](1, {})["client_level_epsilon"] < row["local_epsilon"]


@pytest.mark.parametrize("spec, key", [
    ({"name": "update_gaussian", "sigma": 1e-200, "clip_norm": 1.0}, "local_epsilon"),
    ({"name": "client_level_dp", "clip_norm": 1.0, "noise_multiplier": 1e-200,
      "clients_per_round": M}, "client_level_epsilon"),
    ({"name": "dp_gaussian", "noise_multiplier": 1e-200}, "epsilon"),
])
def test_noise_too_small_for_any_bound_reports_null_not_infinity(tmp_path, spec, key):
    """dp_accounting divides by zero at such σ: the row says no finite ε (null)."""
    sim = Simulation(_cfg(tmp_path, [spec], **{"training.weighting": "uniform"}),
                     dataset=small_dataset())
    row = {}
    for cb in sim.round_callbacks:
        row.update(cb(0, row) or {})
    assert key in row and row[key] is None
    json.dumps(row, allow_nan=False)  # nothing a strict JSON reader would refuse
