"""DP-FedAvg (client_level_dp) runs report their user-level ε per round."""

import dataclasses
import json
import math

import numpy as np
import pytest
from scipy.stats import norm

from defenses import accounting
from defenses.dp import (DPParameters, attach_client_accountant, client_level_dp, dp_gaussian,
                         dp_parameters)
from defenses.dp._params import unreported_reason
from defenses.pruning import prune_random
from fedsim.hooks import chain, mask_around
from fedsim.run import run_simulation
from fedsim.simulation import Simulation
from tests.fedsim.helpers import small_config, small_dataset

SIGMA, CLIP, M, K = 1.3, 0.5, 3, 6


def _cfg(tmp_path, specs, **over):
    cfg = small_config(**{"output.dir": str(tmp_path), "training.weighting": "uniform",
                          "training.clients_per_round": M, "data.num_clients": K, **over})
    return dataclasses.replace(cfg, defenses=specs)


def _spec(**over):
    return {"name": "client_level_dp", "clip_norm": CLIP, "noise_multiplier": SIGMA,
            "clients_per_round": M, **over}


def _callbacks(sim, round_idx, row=None):
    row = dict(row or {})
    for cb in sim.round_callbacks:
        row.update(cb(round_idx, row) or {})
    return row


# --- the accountant function -------------------------------------------------


def _analytic_gaussian_delta(eps, mu):
    """Balle & Wang (2018) Thm 8: δ(ε) of the Gaussian mechanism with μ = Δ/σ_eff."""
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


def test_rounds_that_include_the_client_for_certain_are_the_analytic_gaussian():
    """n unsampled rounds at σ are one Gaussian mechanism at σ/√n: PLD's ε must
    meet Balle & Wang's exact δ(ε) (an independent closed form)."""
    n, delta = 4, 1e-5
    got = accounting.dp_fedavg_epsilon(SIGMA, 0.2, delta, sampled_rounds=0, certain_rounds=n,
                                       accountant="pld")
    mu = math.sqrt(n) / SIGMA
    assert _analytic_gaussian_delta(got.epsilon, mu) == pytest.approx(delta, rel=0.02)
    # RDP is an upper bound on the exact ε, not far above it here.
    rdp = accounting.dp_fedavg_epsilon(SIGMA, 0.2, delta, sampled_rounds=0, certain_rounds=n)
    assert got.epsilon <= rdp.epsilon < 1.5 * got.epsilon


def test_mixed_rounds_compose_their_rdp_curves():
    """Sampled and certain rounds add their RDP curves; converted by the package's
    own Prop 4 (Canonne et al.) on dp_accounting's default orders."""
    orders = np.array(accounting._gaussian._make_accountant("rdp")._orders)
    q, delta, ns, nc = 0.25, 1e-5, 30, 3
    curve = (accounting.gaussian_rdp(SIGMA, q, orders, steps=ns)
             + nc * accounting.gaussian_rdp_unsampled(SIGMA, orders))
    expected, _ = accounting.rdp_to_epsilon(orders, curve, delta)
    got = accounting.dp_fedavg_epsilon(SIGMA, q, delta, sampled_rounds=ns, certain_rounds=nc)
    assert got.epsilon == pytest.approx(expected, rel=1e-6)
    assert got.count == ns + nc
    only_sampled = accounting.dp_fedavg_epsilon(SIGMA, q, delta, sampled_rounds=ns + nc)
    assert only_sampled.epsilon == pytest.approx(
        accounting.gaussian_epsilon(SIGMA, q, delta, steps=ns + nc).epsilon, rel=1e-12)
    assert only_sampled.epsilon < got.epsilon  # certainty costs amplification


@pytest.mark.parametrize("kwargs, word", [
    ({"sampled_rounds": 0, "certain_rounds": 0}, "at least one round"),
    ({"sampled_rounds": -1}, "sampled_rounds"),
    ({"sampled_rounds": 2.0}, "sampled_rounds"),
    ({"sampled_rounds": 1, "certain_rounds": True}, "certain_rounds"),
])
def test_bad_round_counts_are_named(kwargs, word):
    with pytest.raises(ValueError, match=word):
        accounting.dp_fedavg_epsilon(SIGMA, 0.5, 1e-5, **kwargs)


# --- where the defense says what it guarantees ---------------------------------


def test_the_guarantee_survives_chains_masks_and_renames():
    d = client_level_dp(CLIP, SIGMA, M)
    params = dp_parameters(d, level="client")
    assert params == DPParameters("gauss", noise_multiplier=SIGMA, clip_norm=CLIP, level="client")
    assert dp_parameters(d) is None  # not a record-level guarantee
    chained = chain(prune_random(0.3), d)
    assert dp_parameters(chained, level="client") == params
    import jax.numpy as jnp
    masked = mask_around({"w": jnp.ones(3)}, chained)._replace(name="other")
    assert dp_parameters(masked, level="client") == params
    # Two at one level: which one bounds the release is not modelled.
    assert dp_parameters(chain(d, client_level_dp(CLIP, 2.0, M)), level="client") is None
    # A defense after the noise share transforms each client's share before the
    # sum: no user-level guarantee, while the share's local one stands.
    late = chain(d, prune_random(0.3))
    assert dp_parameters(late, level="client") is None
    assert dp_parameters(late, level="local").noise_multiplier == pytest.approx(SIGMA / M**0.5)
    assert "applies random(p=0.3) to each" in unreported_reason(late, "client")
    assert dp_parameters(chain(chain(prune_random(0.3), d), prune_random(0.2)),
                         level="client") is None
    assert dp_parameters(dp_gaussian(1.1)).level == "record"
    with pytest.raises(ValueError, match="level"):
        dp_parameters(d, level="user")


# --- in a simulation ---------------------------------------------------------


def test_a_dp_fedavg_run_reports_the_user_level_epsilon_of_each_round(tmp_path):
    cfg = _cfg(tmp_path, [_spec()], **{"training.rounds": 2})
    summary = run_simulation(cfg, sim=Simulation(cfg, dataset=small_dataset()), quiet=True)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    delta = 1.0 / K
    for r, row in enumerate(rows):
        expected = accounting.dp_fedavg_epsilon(SIGMA, M / K, delta, sampled_rounds=r + 1)
        assert row["client_level_epsilon"] == pytest.approx(expected.epsilon, rel=1e-9)
        assert row["client_level_delta"] == delta
        assert "epsilon" not in row  # no record-level DP in this run
    assert rows[1]["client_level_epsilon"] > rows[0]["client_level_epsilon"]
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["client_level_epsilon"] == rows[-1]["client_level_epsilon"]
    assert summary["client_level_delta"] == delta


def test_observed_rounds_count_unsampled_for_the_worst_client(tmp_path):
    """The observer forces its clients into its rounds: for them those rounds
    are not subsampled, and the worst client's ε says so."""
    cfg = _cfg(tmp_path, [_spec()], **{"training.rounds": 3, "observer.clients": "[0]",
                                        "observer.rounds": "[1]"})
    sim = Simulation(cfg, dataset=small_dataset())
    eps = [_callbacks(sim, r)["client_level_epsilon"] for r in range(3)]
    delta = 1.0 / K
    assert eps[0] == pytest.approx(accounting.dp_fedavg_epsilon(
        SIGMA, M / K, delta, sampled_rounds=1).epsilon, rel=1e-9)
    assert eps[2] == pytest.approx(accounting.dp_fedavg_epsilon(
        SIGMA, M / K, delta, sampled_rounds=2, certain_rounds=1).epsilon, rel=1e-9)
    unobserved = accounting.dp_fedavg_epsilon(SIGMA, M / K, delta, sampled_rounds=3).epsilon
    assert eps[2] > unobserved


def test_a_round_that_skipped_clients_is_accounted_with_their_noise_missing(tmp_path):
    sim = Simulation(_cfg(tmp_path, [_spec()]), dataset=small_dataset())
    (acc,) = [cb for cb in sim.round_callbacks if hasattr(cb, "rounds_through")]
    delta = 1.0 / K
    e0 = _callbacks(sim, 0, {"skipped_clients": [2]})["client_level_epsilon"]
    weaker = SIGMA * math.sqrt((M - 1) / M)
    assert e0 == pytest.approx(accounting.dp_fedavg_epsilon(
        weaker, M / K, delta, sampled_rounds=1).epsilon, rel=1e-9)
    # A round that skipped everyone released nothing: no cost.
    e1 = _callbacks(sim, 1, {"skipped_clients": [0, 1, 2]})["client_level_epsilon"]
    assert e1 == e0
    # The counts travel through a checkpoint's callback state.
    state = json.loads(json.dumps(acc.state_dict()))
    fresh = Simulation(_cfg(tmp_path, [_spec()]), dataset=small_dataset())
    (acc2,) = [cb for cb in fresh.round_callbacks if hasattr(cb, "rounds_through")]
    acc2.load_state_dict({"kind": "dp_accountant"})  # another callback's state: ignored
    assert acc2.skipped == {}
    acc2.load_state_dict(state)
    assert acc2.epsilon(1) == e1


def test_pruned_chained_and_hand_given_dp_fedavg_still_report(tmp_path):
    """The guarantee is found inside the global pruning mask, in a chain, and
    in defenses given by hand."""
    pruned = _cfg(tmp_path, [{"name": "prune_random", "p": 0.3}, _spec()],
                  **{"pruning.scheme": "random", "pruning.p": 0.5})
    sim = Simulation(pruned, dataset=small_dataset())
    assert "client_level_epsilon" in _callbacks(sim, 0)
    hand = Simulation(_cfg(tmp_path, []), dataset=small_dataset(),
                      defenses={"upload": client_level_dp(CLIP, SIGMA, M)})
    assert "client_level_epsilon" in _callbacks(hand, 0)
    plain = Simulation(_cfg(tmp_path, []), dataset=small_dataset())
    assert "client_level_epsilon" not in _callbacks(plain, 0)
    assert attach_client_accountant(plain) is False


def test_attach_with_delta_replaces_the_default_and_bad_deltas_are_named(tmp_path):
    sim = Simulation(_cfg(tmp_path, [_spec()]), dataset=small_dataset())
    assert attach_client_accountant(sim) is False  # attached already, nothing to change
    assert attach_client_accountant(sim, delta=1e-5) is True
    row = _callbacks(sim, 0)
    assert row["client_level_delta"] == 1e-5
    assert row["client_level_epsilon"] == pytest.approx(accounting.dp_fedavg_epsilon(
        SIGMA, M / K, 1e-5, sampled_rounds=1).epsilon, rel=1e-9)
    for bad in (0.0, 1.0, float("nan"), True, "1e-5"):
        with pytest.raises(ValueError, match="delta"):
            attach_client_accountant(sim, delta=bad)


def test_the_configs_accounting_client_delta_is_the_user_level_delta(tmp_path):
    sim = Simulation(_cfg(tmp_path, [_spec()], **{"accounting.client_delta": 1e-5}),
                     dataset=small_dataset())
    row = _callbacks(sim, 0)
    assert row["client_level_delta"] == 1e-5
    assert row["client_level_epsilon"] == pytest.approx(accounting.dp_fedavg_epsilon(
        SIGMA, M / K, 1e-5, sampled_rounds=1).epsilon, rel=1e-9)
    # The other accountants' keys leave it at its default (and, with no DP-SGD
    # here, are warned about).
    with pytest.warns(UserWarning, match="'accounting.delta' is set"):
        other = Simulation(_cfg(tmp_path, [_spec()], **{"accounting.delta": 1e-5}),
                           dataset=small_dataset())
    assert _callbacks(other, 0)["client_level_delta"] == 1.0 / K


def test_two_dp_fedavg_stages_in_one_chain_warn_that_no_epsilon_is_reported(tmp_path):
    cfg = _cfg(tmp_path, [_spec(), _spec(noise_multiplier=2.0)])
    with pytest.warns(UserWarning, match="several client-level DP mechanisms"):
        sim = Simulation(cfg, dataset=small_dataset())
    assert "client_level_epsilon" not in _callbacks(sim, 0)


def test_a_defense_after_dp_fedavg_in_the_chain_is_warned_about_and_gets_no_user_epsilon(
        tmp_path):
    cfg = _cfg(tmp_path, [_spec(), {"name": "prune_random", "p": 0.3}])
    with pytest.warns(UserWarning, match="put client_level_dp last"):
        sim = Simulation(cfg, dataset=small_dataset())
    row = _callbacks(sim, 0)
    assert "client_level_epsilon" not in row and "local_epsilon" in row


def test_the_example_config_reports_what_the_privacy_command_says(tmp_path, capsys):
    """configs/dp_fedavg.yaml, shrunk to synthetic data and 2 rounds, through the
    command line; its header names the privacy command that gives the same ε."""
    from pathlib import Path

    from defenses.accounting import cli as privacy_cli
    from fedsim.cli import main

    config = Path(__file__).resolve().parents[2] / "configs" / "dp_fedavg.yaml"
    overrides = ["data.dataset=synthetic", "data.image_size=16", "model.name=mlp",
                 "training.rounds=2", "training.client_parallelism=loop", "eval.every=1",
                 "output.progress=false", "output.plots=false", f"output.dir={tmp_path}"]
    assert main(["run", str(config), *[a for o in overrides for a in ("--set", o)]]) == 0
    capsys.readouterr()
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert privacy_cli.main(["privacy", "dp-fedavg", "--sigma", "1", "--clients-per-round", "10",
                             "--num-clients", "100", "--rounds", "2", "--delta", "0.01"]) == 0
    expected = json.loads(capsys.readouterr().out)["epsilon"]
    assert rows[-1]["client_level_epsilon"] == pytest.approx(expected, rel=1e-12)
    assert rows[-1]["client_level_delta"] == 0.01 and rows[-1]["local_epsilon"] > expected
