"""Parameter-space channel, leakage ledger and §6.1 metrics of 000."""

import dataclasses
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

from defenses.bounds import mse_lower_bound, natural_channel_sigma
from defenses.channels import (LeakageLedger, gdc, imp_dra, imp_mia, parameter_channel,
                               solve_natural_log_sigma, solve_natural_sigma)
from fedsim.client import masked_mean_loss
from fedsim.hooks import DefenseContext
from fedsim.models import build_model, init_params, make_apply_fn
from fedsim.run import run_simulation
from fedsim.simulation import Simulation, on_run_data
from tests.fedsim.helpers import small_config, small_dataset


@pytest.mark.parametrize("kappa", [0.3, 4.0, 60.0])
def test_jit_bisection_matches_host_bisection(kappa):
    lam = np.random.default_rng(0).gamma(0.5, 2.0, 30)
    ref = natural_channel_sigma(lam, kappa)
    got = float(jax.jit(solve_natural_sigma, static_argnums=())(jnp.asarray(lam), kappa))
    assert abs(np.log(got) - np.log(ref)) < 1e-4


@pytest.mark.parametrize("lam, kappa", [([1.0], 50.0), ([2.0, 0.5, 0.0], 150.0),
                                        ([3.0] * 4 + [0.0] * 4, 400.0)])
def test_jit_bisection_stays_in_logs_where_sigma_leaves_float32(lam, kappa):
    """2κ/r past ≈ 88.7: e^(2κ/r) overflows float32 and σ itself underflows it.

    The bisection and the defense work with ln σ, so σ's logarithm still
    matches the float64 host solver and the noise stays positive.
    """
    ref = natural_channel_sigma(np.asarray(lam), kappa)
    got = float(jax.jit(solve_natural_log_sigma)(jnp.asarray(lam), kappa))
    assert np.isfinite(got)
    assert abs(got - np.log(ref)) < 1e-6 * abs(np.log(ref))


def _step_context(batch=8):
    model = build_model("mlp", 10)
    apply_fn = make_apply_fn(model)
    params = init_params(model, (16, 16, 1), jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (batch, 16, 16, 1))
    y = jnp.arange(batch) % 10
    mask = jnp.ones(batch)
    g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
    return g, DefenseContext(params=params, x=x, y=y, mask=mask, apply_fn=apply_fn)


@pytest.mark.slow
def test_parameter_channel_jit_equals_eager():
    g, ctx = _step_context()
    d = parameter_channel(5.0)
    out, s = d.apply(g, d.init(None), key=jax.random.key(3), context=ctx)
    out_jit, _ = jax.jit(lambda g, k: d.apply(g, (), key=k, context=ctx))(g, jax.random.key(3))
    chex.assert_trees_all_close(out, out_jit, rtol=1e-4, atol=1e-6)
    assert s == ()


def test_parameter_channel_contract_and_noise_scale():
    g, ctx = _step_context()
    d = parameter_channel(5.0)
    assert d.stage == "layer"
    run = jax.jit(lambda g, k: d.apply(g, d.init(None), key=k, context=ctx))
    out1, s = run(g, jax.random.key(3))
    out1b, _ = run(g, jax.random.key(3))
    out2, _ = run(g, jax.random.key(4))
    chex.assert_trees_all_equal_shapes_and_dtypes(out1, g)
    chex.assert_trees_all_close(out1, out1b)
    assert s == ()
    assert not np.allclose(jax.tree_util.tree_leaves(out1)[0], jax.tree_util.tree_leaves(out2)[0])
    # Independent estimate of σ: per-example gradients in numpy, eigenvalues
    # of the P×P-equivalent covariance via numpy SVD, host bisection.
    from jax.flatten_util import ravel_pytree
    from fedsim.client import cross_entropy
    per = jax.vmap(jax.grad(lambda p, xi, yi: cross_entropy(ctx.apply_fn(p, xi[None]),
                                                            yi[None])[0]),
                   in_axes=(None, 0, 0))(ctx.params, ctx.x, ctx.y)
    flat = np.asarray(jax.vmap(lambda t: ravel_pytree(t)[0])(per), np.float64)
    sv = np.linalg.svd(flat - flat.mean(0), compute_uv=False)
    lam = sv**2 / (flat.shape[0] - 1) / flat.shape[0]
    sigma = natural_channel_sigma(lam[lam > 1e-12 * lam.max()], 5.0)
    noise = (np.asarray(ravel_pytree(out1)[0], np.float64)
             - np.asarray(ravel_pytree(g)[0], np.float64)) / np.sqrt(sigma)
    assert sps.kstest(noise, "norm").pvalue > 1e-3
    assert sps.kstest(noise, "norm", args=(0, 2 / 3)).pvalue < 1e-6
    assert sps.kstest(noise, "norm", args=(0, 3 / 2)).pvalue < 1e-6


def test_parameter_channel_needs_context():
    with pytest.raises(ValueError, match="context"):
        parameter_channel(1.0).apply({"w": jnp.zeros(3)}, (), key=jax.random.key(0))
    with pytest.raises(ValueError, match="kappa"):
        parameter_channel(0.0)


def test_metrics():
    assert imp_mia(0.6, 0.8) == pytest.approx(0.25)
    assert imp_dra(0.4, 0.1) == pytest.approx(0.75)  # (1/0.1 − 1/0.4)/(1/0.1)
    assert gdc(0.25, 0.75) == pytest.approx(0.5)
    assert imp_dra(0.1, 0.1) == 0.0
    with pytest.raises(ValueError, match="mse"):
        imp_dra(0.0, 0.1)
    # An AUC in percent beside one as a fraction gave IMP_MIA = -120 without a word.
    with pytest.raises(ValueError, match=r"auc must be an AUC in \(0, 1\]"):
        imp_mia(75.0, 0.62)
    with pytest.raises(ValueError, match="auc_without_defense"):
        imp_mia(0.5, 1.7)
    for bad in (float("nan"), float("-inf")):
        with pytest.raises(ValueError, match="must be finite"):
            gdc(bad, 0.3)


def test_personalized_channel_refuses_a_beta_of_another_layout():
    """A channels-first β has the right size, but flattened its weights land on other
    pixels than the (H, W, C) data's; refused, while the example's shape and flat pass."""
    from defenses.channels import data_statistics, personalized_channel

    stats = data_statistics(np.random.default_rng(0).random((60, 4, 4, 3)))
    beta = np.ones((4, 4, 3))
    beta[1:3, 1:3] = 50.0
    with pytest.raises(ValueError, match=r"beta has shape \(3, 4, 4\).*\(4, 4, 3\)"):
        personalized_channel(5.0, statistics=stats, beta=beta.transpose(2, 0, 1))
    for ok in (beta, beta.ravel()):
        assert personalized_channel(5.0, statistics=stats, beta=ok).stage == "data"


def test_ledger_counts_steps_per_client():
    from defenses.channels import LeakageLedger, data_statistics
    cohorts = {0: [0, 1], 1: [1, 2], 2: [1, 3]}
    st = data_statistics(np.random.default_rng(0).normal(size=(50, 3)))
    ledger = LeakageLedger(2.5, [3, 4, 5, 6], 4, lambda r: np.array(cohorts[r]), st)
    rows = [ledger(r, {}) for r in range(3)]
    assert [r["leakage_steps"] for r in rows] == [4, 8, 12]      # client 1: 4 per round
    assert [r["leakage_total"] for r in rows] == [10.0, 20.0, 30.0]
    assert rows[2]["leakage_total_mean"] == pytest.approx(2.5 * (3 + 12 + 5 + 6) / 4)
    assert rows[0]["mse_lower_bound"] > rows[1]["mse_lower_bound"] > rows[2]["mse_lower_bound"]


@pytest.mark.slow
def test_ledger_in_metrics_jsonl(tmp_path):
    cfg = small_config(**{"training.rounds": 3, "data.num_clients": 4,
                          "training.clients_per_round": 2, "data.partition": "iid"})
    cfg = dataclasses.replace(
        cfg, defenses=[{"name": "natural_channel", "kappa": 7.0, "dataset": "synthetic",
                        "image_size": 16}],
        output=dataclasses.replace(cfg.output, dir=str(tmp_path)))
    sim = Simulation(cfg)
    summary = run_simulation(cfg, sim=sim, quiet=True)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # Independent count: replay the cohorts and the per-client step counts.
    cum = np.zeros(sim.num_clients, int)
    per = np.ceil(np.asarray(sim.client_counts) / cfg.training.batch_size).astype(int)
    for r, row in enumerate(rows):
        cum[sim.cohort(r)] += per[sim.cohort(r)] * cfg.training.local_epochs
        assert row["leakage_kappa"] == 7.0
        assert row["leakage_steps"] == cum.max()
        assert row["leakage_total"] == pytest.approx(7.0 * cum.max())
        assert 0 < row["mse_lower_bound"]
    assert rows[0]["mse_lower_bound"] > rows[-1]["mse_lower_bound"]
    assert summary["leakage_total"] == rows[-1]["leakage_total"]
    # Thm 1 by hand for the first row.
    from defenses.channels import dataset_statistics
    st = dataset_statistics("synthetic", 16, seed=cfg.seed)
    lam = st.eigenvalues[st.eigenvalues > 0]
    h = 0.5 * np.sum(np.log(2 * np.pi * np.e * lam))
    want = lam.size / st.dim * mse_lower_bound(h, rows[0]["leakage_total"], lam.size)
    assert rows[0]["mse_lower_bound"] == pytest.approx(want, rel=1e-9)


def test_a_channel_on_the_runs_own_dataset_loads_it_as_the_run_does(monkeypatch):
    from defenses.channels import _statistics, data_statistics

    loads = []
    real = _statistics.dataset_statistics

    def recording(name, image_size=None, **kw):
        loads.append((name, image_size, kw))
        return real(name, image_size, **kw)
    monkeypatch.setattr(_statistics, "dataset_statistics", recording)
    cfg = small_config(seed=3)
    specs = [{"name": "natural_channel", "kappa": 7.0, "dataset": "synthetic"},
             {"name": "white_channel", "kappa": 9.0, "dataset": "synthetic", "dataset_seed": 5}]
    cfg = dataclasses.replace(cfg, defenses=specs)
    sim = Simulation(cfg)
    natural, white = sim.defense_specs
    assert natural == dict(specs[0], source=cfg.data.source, data_dir=cfg.data.data_dir,
                           dataset_seed=3, image_size=cfg.data.image_size,
                           normalize=cfg.data.normalize)
    assert white["dataset_seed"] == 5  # what the spec sets is kept
    assert cfg.defenses == specs  # the config itself is not rewritten
    # Both channels loaded synthetic with the seeds above, not seed 0; the ledger
    # reads the first channel's Σ_D from its guarantee instead of loading again.
    assert sorted(kw["seed"] for _, _, kw in loads) == [3, 5]
    # ... so the natural channel's Σ_D is that of the inputs the run trains on.
    run = data_statistics(sim.dataset.x_train)
    mine = real("synthetic", cfg.data.image_size, seed=3)
    np.testing.assert_allclose(mine.eigenvalues, run.eigenvalues, rtol=1e-9, atol=1e-12)
    assert not np.allclose(real("synthetic", cfg.data.image_size, seed=0).mean, run.mean)
    # A spec naming another dataset is left as it is.
    elsewhere = [{"name": "natural_channel", "kappa": 1.0, "dataset": "mnist"}]
    assert on_run_data(elsewhere, cfg) == elsewhere


def test_no_ledger_without_channel():
    sim = Simulation(small_config())
    assert not any(type(cb).__name__ == "LeakageLedger" for cb in sim.round_callbacks)


def _ledgers(sim):
    return [cb for cb in sim.round_callbacks if isinstance(cb, LeakageLedger)]


def test_channels_given_by_hand_get_the_ledger_a_config_would_give_them():
    """Found by their guarantee: hand-given, chained (min κ, DPI) and the
    parameter channel (Σ_D from the training inputs); attach_leakage_ledger
    then replaces that ledger instead of adding a second."""
    from defenses.channels import (ChannelGuarantee, attach_leakage_ledger, data_statistics,
                                   natural_channel, parameter_channel, white_channel)
    from fedsim.hooks import chain

    ds = small_dataset()
    cfg = small_config()
    stats = data_statistics(ds.x_train[:200])  # not the whole training split's
    natural = natural_channel(5.0, statistics=stats)
    assert natural.guarantees == (ChannelGuarantee(5.0, stats),)
    sim = Simulation(cfg, dataset=ds, defenses={"data": natural})
    (ledger,) = _ledgers(sim)
    assert ledger.kappa == 5.0
    expected = LeakageLedger(5.0, [1] * sim.num_clients, sim.num_clients, sim.cohort, stats)
    assert ledger.mse_floor(3.0) == pytest.approx(expected.mse_floor(3.0), rel=1e-12)

    both = chain(natural, white_channel(2.0, statistics=stats))
    (ledger,) = _ledgers(Simulation(cfg, dataset=ds, defenses={"data": both}))
    assert ledger.kappa == 2.0

    sim = Simulation(cfg, dataset=ds, defenses={"layer": parameter_channel(4.0)})
    (ledger,) = _ledgers(sim)
    whole = LeakageLedger(4.0, [1] * sim.num_clients, sim.num_clients, sim.cohort,
                          data_statistics(sim.dataset.x_train))
    assert ledger.kappa == 4.0
    assert ledger.mse_floor(3.0) == pytest.approx(whole.mse_floor(3.0), rel=1e-12)

    mine = attach_leakage_ledger(sim, 1.5)
    assert _ledgers(sim) == [mine] and mine.kappa == 1.5
    assert _ledgers(Simulation(cfg, dataset=ds)) == []


def test_a_pruned_run_keeps_the_parameter_channels_ledger():
    cfg = dataclasses.replace(small_config(**{"pruning.scheme": "random", "pruning.p": 0.5}),
                              defenses=[{"name": "parameter_channel", "kappa": 3.0}])
    sim = Simulation(cfg, dataset=small_dataset())
    assert sim.defenses["layer"].name.endswith("+global_mask")
    (ledger,) = _ledgers(sim)
    assert ledger.kappa == 3.0


@pytest.mark.parametrize("channel", ["natural_channel", "white_channel", "eigen_compression"])
def test_a_channel_on_synthetic_data_needs_its_seed(channel):
    # Before, a channel built in Python on dataset="synthetic" silently calibrated
    # on seed 0's data whatever seed the run it defends uses.
    from fedsim.hooks import build_defense
    kwargs = {"eigen_compression": {}}.get(channel, {"kappa": 7.0})
    with pytest.raises(ValueError, match=rf"{channel}: dataset 'synthetic' needs dataset_seed="):
        build_defense(channel, dataset="synthetic", image_size=8, **kwargs)
    build_defense(channel, dataset="synthetic", image_size=8, dataset_seed=2, **kwargs)
    from defenses.channels import dataset_statistics
    with pytest.raises(ValueError, match=r"dataset_statistics\('synthetic'\) needs seed="):
        dataset_statistics("synthetic", 8)
