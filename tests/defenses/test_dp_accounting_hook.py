"""A run with an example-stage DP defense reports ε per round (metrics + summary)."""

import dataclasses
import json
import math

import jax
import pytest

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


def _callback_row(sim, round_idx):
    row = {}
    for cb in sim.round_callbacks:
        row.update(cb(round_idx, row) or {})
    return row


def _accountant_sim(tmp_path, specs=None, **over):
    # Only the callbacks run (no training): nothing is compiled.
    specs = specs or [{"name": "dp_gaussian", "noise_multiplier": 1.1, "clip_norm": 1.0}]
    cfg = _cfg(tmp_path, specs, **{"training.rounds": 2, "training.clients_per_round": 6, **over})
    return Simulation(cfg, dataset=small_dataset())


def test_attach_accountant_with_delta_replaces_the_default_delta(tmp_path):
    from defenses.dp import attach_accountant
    from defenses.dp.accountant_hook import PrivacyAccountant

    sim = _accountant_sim(tmp_path)
    assert attach_accountant(sim) is False  # the plugin attached one already
    assert attach_accountant(sim, delta=1e-6) is True
    accountants = [cb for cb in sim.round_callbacks if isinstance(cb, PrivacyAccountant)]
    assert len(accountants) == 1  # replaced, not a second accountant
    row = _callback_row(sim, 0)
    assert row["delta"] == 1e-6
    # All 6 IID clients train in round 0: the worst case at δ = 1e-6, recomputed.
    want = max(accounting.gaussian_epsilon(1.1, min(1.0, 16 / int(c)), 1e-6,
                                           steps=math.ceil(int(c) / 16)).epsilon
               for c in sim.client_counts)
    assert row["epsilon"] == pytest.approx(want, rel=1e-9)
    assert row["epsilon"] > accounting.gaussian_epsilon(
        1.1, min(1.0, 16 / max(sim.client_counts)), 1.0 / max(sim.client_counts),
        steps=math.ceil(max(sim.client_counts) / 16)).epsilon


@pytest.mark.parametrize("bad", [5.0, 0.0, 1.0, -1e-5, float("nan"), float("inf"), True, "1e-5"])
def test_attach_accountant_refuses_a_delta_outside_0_1(tmp_path, bad):
    from defenses.dp import attach_accountant

    sim = _accountant_sim(tmp_path)
    with pytest.raises(ValueError, match="delta must be a number in \\(0, 1\\)"):
        attach_accountant(sim, delta=bad)
    assert _callback_row(sim, 0)["delta"] == 1.0 / max(sim.client_counts)  # unchanged
    no_dp = _accountant_sim(tmp_path, specs=[{"name": "update_gaussian", "sigma": 0.1}])
    with pytest.raises(ValueError, match="delta"):
        attach_accountant(no_dp, delta=bad)


def test_delta_travels_with_the_checkpointed_state_unless_chosen_again(tmp_path):
    from defenses.dp import attach_accountant
    from fedsim import checkpoint

    first = _accountant_sim(tmp_path)
    attach_accountant(first, delta=1e-6)
    _callback_row(first, 0)
    states = checkpoint.callback_states(first.round_callbacks)
    # A resume from the command line cannot call attach_accountant: the run's δ is kept.
    resumed = _accountant_sim(tmp_path)
    checkpoint.load_callback_states(resumed.round_callbacks, states)
    assert _callback_row(resumed, 1)["delta"] == 1e-6
    # A δ chosen in the resuming process wins over the checkpoint's.
    chosen = _accountant_sim(tmp_path)
    attach_accountant(chosen, delta=1e-7)
    checkpoint.load_callback_states(chosen.round_callbacks, states)
    assert _callback_row(chosen, 1)["delta"] == 1e-7


def test_the_configs_accounting_delta_is_the_accountants_and_survives_a_resume(tmp_path):
    from defenses.dp import attach_accountant
    from fedsim import checkpoint

    configured = _accountant_sim(tmp_path, **{"accounting.delta": 1e-6})
    given = _accountant_sim(tmp_path)
    attach_accountant(given, delta=1e-6)
    row = _callback_row(configured, 0)
    assert row["delta"] == 1e-6 and row == _callback_row(given, 0)
    # Chosen in the config, so kept over a checkpoint's other δ (as a δ given to
    # attach_accountant is).
    default = _accountant_sim(tmp_path)
    _callback_row(default, 0)
    resumed = _accountant_sim(tmp_path, **{"accounting.delta": 1e-6})
    checkpoint.load_callback_states(resumed.round_callbacks,
                                    checkpoint.callback_states(default.round_callbacks))
    assert _callback_row(resumed, 1)["delta"] == 1e-6
    # attach_accountant still replaces it.
    assert attach_accountant(resumed, delta=1e-7) and _callback_row(resumed, 1)["delta"] == 1e-7


@pytest.mark.parametrize("key", ["delta", "client_delta", "local_delta"])
@pytest.mark.parametrize("bad", ["0", "1", "1.5", "-1e-5", "nan"])
def test_an_accounting_delta_outside_0_1_is_a_config_error_naming_the_key(key, bad):
    from fedsim.config import ConfigError

    with pytest.raises(ConfigError, match=f"config key 'accounting.{key}'"):
        small_config(**{f"accounting.{key}": bad})


def test_an_accounting_delta_no_accountant_uses_is_warned_about(tmp_path):
    with pytest.warns(UserWarning, match="'accounting.delta' is set, but the run has no "
                                         "example-stage defense with a record-level guarantee"):
        sim = _accountant_sim(tmp_path, specs=[{"name": "update_gaussian", "sigma": 0.1}],
                              **{"accounting.delta": 1e-6})
    assert "delta" not in _callback_row(sim, 0)


def test_an_accounting_delta_is_hashed_where_set_and_only_there():
    from fedsim.checkpoint import accepted_fingerprints, config_fingerprint

    plain = small_config()
    assert config_fingerprint(plain) == config_fingerprint(
        small_config(**{"accounting.delta": "null"}))
    for key in ("delta", "client_delta", "local_delta"):
        set_ = small_config(**{f"accounting.{key}": 1e-5})
        assert config_fingerprint(set_) != config_fingerprint(plain)
        assert config_fingerprint(plain) not in accepted_fingerprints(set_)


def test_epsilon_client_is_a_client_when_every_epsilon_is_0(tmp_path):
    # σ = 1000, one full-batch FedSGD step: dp_accounting gives ε = 0 for every
    # client; the row named client -1 then.
    sim = _accountant_sim(tmp_path, specs=[{"name": "dp_gaussian", "noise_multiplier": 1000.0}],
                          **{"training.algorithm": "fedsgd", "training.clients_per_round": 3})
    row = _callback_row(sim, 0)
    assert row["epsilon"] == 0.0
    assert row["epsilon_client"] == int(min(sim.cohort(0)))


def test_no_epsilon_client_before_any_client_trained(tmp_path):
    from defenses.dp.accountant_hook import PrivacyAccountant

    sim = _accountant_sim(tmp_path)
    (acc,) = [cb for cb in sim.round_callbacks if isinstance(cb, PrivacyAccountant)]
    assert acc.epsilon() == (0.0, None)
