"""adaptive_client_level_dp: Andrew et al.'s adaptive clipping run by the engine.

The clip norm the engine carries from round to round is checked against the
paper's update C·exp(−η(b̃ − γ)) computed here from the clients' raw update
norms (read from a run whose clip clips nothing), the strategies against each
other, the accountants against dp_fedavg_epsilon at z, and the config errors.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest

from defenses.accounting import dp_fedavg_epsilon
from defenses.dp import adaptive_client_level_dp, dp_parameters
from defenses.dp.adaptive_clipping import ClipNormReport
from fedsim.config import ConfigError
from fedsim.run import _call_round_callback
from fedsim.simulation import Simulation
from tests.fedsim.helpers import small_config, small_dataset

M = 3
# Noise far below every update even at C = 10⁴ (z_Δ·C/√m per coordinate with
# z = 1e-12): the rounds are the paper's noiseless round up to float rounding.
QUIET = {"noise_multiplier": 1e-12, "clipped_count_stddev": 1e-12}


def _cfg(specs, **over):
    cfg = small_config(**{"training.weighting": "uniform", "training.clients_per_round": M,
                          "data.num_clients": M, "observer.clients": "[0,1,2]",
                          "observer.rounds": "[0]", **over})
    return dataclasses.replace(cfg, defenses=specs)


def _spec(**over):
    return {"name": "adaptive_client_level_dp", "clients_per_round": M, **QUIET, **over}


def _norm(tree):
    return float(np.sqrt(sum(np.sum(np.asarray(a, np.float64) ** 2)
                             for a in jax.tree_util.tree_leaves(tree))))


def _round0(spec, **over):
    sim = Simulation(_cfg([spec], **over), small_dataset())
    state, result = sim.run_round(sim.init_state(), 0)
    norms = {o.observation.client_id: _norm(o.observation.update) for o in result.observed}
    return sim, state, norms


@pytest.fixture(scope="module")
def raw_norms():
    """Round 0's update norms, unclipped (C₀ = 10⁴ is above every one)."""
    sim, state, norms = _round0(_spec(initial_clip_norm=1e4))
    # Nothing clipped: every bit +½, b̃ = 1, C₁ = C₀·exp(−0.2·(1 − 0.5)).
    np.testing.assert_allclose(np.asarray(state.client_states["upload"]["clip_norm"]),
                               1e4 * math.exp(-0.1), rtol=1e-6)
    reports = [cb for cb in sim.round_callbacks if isinstance(cb, ClipNormReport)]
    assert len(reports) == 1
    assert reports[0](0, {}, state=state)["adaptive_clip_norm"] == pytest.approx(
        1e4 * math.exp(-0.1), rel=1e-6)
    return norms


@pytest.mark.parametrize("gamma, between", [(0.5, 1), (0.1, 2), (0.8, 0)])
def test_the_next_clip_norm_is_the_papers_update_of_the_cohorts_unclipped_share(
        raw_norms, gamma, between):
    """C₀ between the sorted raw norms leaves ``between`` of 3 unclipped: each
    upload is min(‖Δ‖, C₀) long and every client's next C is C₀·exp(−η(k/3 − γ))."""
    s = sorted(raw_norms.values())
    c0 = (s[between - 1] + s[between]) / 2 if between else s[0] / 2
    eta = 0.3
    _, state, norms = _round0(_spec(initial_clip_norm=c0, target_unclipped_quantile=gamma,
                                    clip_learning_rate=eta))
    for cid, n in norms.items():
        assert n == pytest.approx(min(raw_norms[cid], c0), rel=1e-4)
    upload = state.client_states["upload"]
    expected = c0 * math.exp(-eta * (between / M - gamma))
    np.testing.assert_allclose(np.asarray(upload["clip_norm"]), expected, rtol=1e-5)
    # The bits were spent: every client's is 0 again for the next round.
    assert not np.any(np.asarray(upload["shifted_bit"]))


def test_the_linear_update_and_its_floor(raw_norms):
    c0 = max(raw_norms.values()) * 2  # all unclipped: b̃ = 1
    _, state, _ = _round0(_spec(initial_clip_norm=c0, geometric_update=False,
                                clip_learning_rate=0.25))
    np.testing.assert_allclose(np.asarray(state.client_states["upload"]["clip_norm"]),
                               c0 - 0.25 * 0.5, rtol=1e-5)
    # All unclipped against γ = 0 with η = 2C₀: C₀ − 2C₀·1 < 0 is floored at 0.
    _, state, _ = _round0(_spec(initial_clip_norm=c0, geometric_update=False,
                                clip_learning_rate=2 * c0, target_unclipped_quantile=0.0))
    assert not np.any(np.asarray(state.client_states["upload"]["clip_norm"]))


@pytest.mark.parametrize("strategy", ["vmap", "chunked"])
def test_the_strategies_carry_the_same_clip_norm(strategy):
    """With real noise (z = 1, σ_b = 2), two rounds under loop and under
    ``strategy`` give the same clip norms and the same model."""
    spec = _spec(noise_multiplier=1.0, clipped_count_stddev=2.0, initial_clip_norm=3.0)
    out = {}
    for s in ("loop", strategy):
        over = {"training.client_parallelism": s, "observer.rounds": "[]",
                "data.num_clients": 6}
        if s == "chunked":
            over["training.chunk_size"] = 2
        sim = Simulation(_cfg([spec], **over), small_dataset())
        state = sim.init_state()
        clips = []
        for r in range(2):
            state, _ = sim.run_round(state, r)
            clips.append(np.asarray(state.client_states["upload"]["clip_norm"]))
        out[s] = (clips, state.params)
    for a, b in zip(out["loop"][0], out[strategy][0]):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    assert len(set(np.round(out["loop"][0][1], 6))) == 1  # one C for every client
    assert not np.allclose(out["loop"][0][0], 3.0)  # it moved
    for a, b in zip(jax.tree_util.tree_leaves(out["loop"][1]),
                    jax.tree_util.tree_leaves(out[strategy][1])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)


def test_it_runs_inside_the_global_pruning_mask(raw_norms):
    """The pruning mask wraps the upload defense (mask_around): its server step
    still runs, and a pruned coordinate stays 0 in the upload."""
    sim, state, _ = _round0(_spec(initial_clip_norm=1e4),
                            **{"pruning.scheme": "random", "pruning.p": 0.5})
    np.testing.assert_allclose(np.asarray(state.client_states["upload"]["clip_norm"]),
                               1e4 * math.exp(-0.1), rtol=1e-6)


def test_the_accountants_report_z_for_the_aggregate_and_z_over_root_m_per_upload():
    d = adaptive_client_level_dp(1.0, M, clipped_count_stddev=2.0)
    assert dp_parameters(d, "client").noise_multiplier == 1.0
    assert dp_parameters(d, "local").noise_multiplier == pytest.approx(1 / math.sqrt(M))
    cfg = _cfg([_spec(noise_multiplier=1.0, clipped_count_stddev=2.0)],
               **{"observer.rounds": "[]", "data.num_clients": 6})
    sim = Simulation(cfg, small_dataset())
    state = sim.init_state()
    row = {}
    for r in range(2):
        state, _ = sim.run_round(state, r)
        row = {}
        for cb in sim.round_callbacks:
            row.update(_call_round_callback(cb, r, row, state) or {})
    expected = dp_fedavg_epsilon(1.0, M / 6, 1 / 6, sampled_rounds=2).epsilon
    assert row["client_level_epsilon"] == pytest.approx(expected, rel=1e-6)
    assert "local_epsilon" in row


@pytest.mark.parametrize("over, spec_over, message", [
    ({"training.clients_per_round": 2, "observer.clients": "[]"}, {},
     "adaptive_client_level_dp: clients_per_round=3"),
    ({"training.weighting": "examples"}, {}, "adaptive_client_level_dp needs training.weighting"),
    ({}, {"noise_multiplier": 0.0}, "noise_multiplier must be > 0"),
    ({}, {"noise_multiplier": 1.0}, "clipped_count_stddev=0.15 is too small"),
    ({}, {"clients_per_round": 2.5}, "clients_per_round must be a positive integer"),
])
def test_config_errors_name_the_defense_and_the_key(over, spec_over, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        spec = {**_spec(), **spec_over}
        if spec_over.get("noise_multiplier") == 1.0:
            spec.pop("clipped_count_stddev")  # the default m/20 = 0.15
        Simulation(_cfg([spec], **over), small_dataset())


def test_it_runs_last_in_a_chain_of_upload_defenses():
    """chain() composes the server steps of its parts (here one has none)."""
    specs = [{"name": "update_gaussian", "sigma": 1e-12}, _spec(initial_clip_norm=1e4)]
    sim = Simulation(_cfg(specs), small_dataset())
    state, _ = sim.run_round(sim.init_state(), 0)
    upload = state.client_states["upload"]
    assert upload[0] == ()  # update_gaussian's (stateless) part
    np.testing.assert_allclose(np.asarray(upload[1]["clip_norm"]), 1e4 * math.exp(-0.1),
                               rtol=1e-6)


SHARDED = """
import json, jax, numpy as np, dataclasses
from tests.fedsim.helpers import small_config, small_dataset
from fedsim.simulation import Simulation
out = {"devices": jax.device_count()}
spec = {"name": "adaptive_client_level_dp", "clients_per_round": 3, "noise_multiplier": 1.0,
        "clipped_count_stddev": 2.0, "initial_clip_norm": 3.0}
for strategy in ("loop", "sharded"):
    cfg = small_config(**{"training.client_parallelism": strategy, "training.weighting": "uniform",
                          "training.clients_per_round": 3, "data.num_clients": 6})
    sim = Simulation(dataclasses.replace(cfg, defenses=[spec]), small_dataset())
    state = sim.init_state()
    clips = []
    for r in range(2):
        state, _ = sim.run_round(state, r)
        clips.append(np.asarray(state.client_states["upload"]["clip_norm"]).tolist())
    out[strategy] = clips
print("RESULT" + json.dumps(out))
"""


def test_the_sharded_strategy_carries_the_same_clip_norm():
    """Two CPU devices, 3 clients (one device pads): the same C as the loop."""
    from tests.fedsim.test_sharding import _run_script

    out = _run_script(SHARDED, 2)
    assert out["devices"] == 2
    np.testing.assert_allclose(out["sharded"], out["loop"], rtol=1e-5)
    assert out["loop"][1][0] != 3.0


def _run_config(tmp_path, out, rounds, *extra):
    from pathlib import Path

    from fedsim.cli import main

    config = Path(__file__).resolve().parents[2] / "configs" / "dp_fedavg_adaptive.yaml"
    overrides = ["data.dataset=synthetic", "data.image_size=16", "model.name=mlp",
                 f"training.rounds={rounds}", "training.client_parallelism=loop",
                 "eval.every=1", "output.progress=false", "output.plots=false",
                 "output.checkpoint_every=1", f"output.dir={tmp_path / out}", *extra]
    assert main(["run", str(config), "--quiet",
                 *[a for o in overrides for a in ("--set", o)]]) == 0
    import json
    return [json.loads(l) for l in (tmp_path / out / "metrics.jsonl").read_text().splitlines()]


def test_the_example_config_runs_reports_epsilon_at_z_and_resumes_with_its_clip_norm(tmp_path):
    """configs/dp_fedavg_adaptive.yaml shrunk to synthetic data: ε at z = 1
    per round, and a run resumed after round 2 of 3 ends where one run does
    (the clip norm is in every client's checkpointed state)."""
    whole = _run_config(tmp_path, "whole", 3)
    expected = [dp_fedavg_epsilon(1.0, 0.2, 0.01, sampled_rounds=r + 1).epsilon
                for r in range(3)]
    assert [r["client_level_epsilon"] for r in whole] == pytest.approx(expected, rel=1e-9)
    clips = [r["adaptive_clip_norm"] for r in whole]
    assert len(set(clips)) == 3 and all(c > 0 for c in clips)  # it moves every round
    _run_config(tmp_path, "resumed", 2)
    resumed = _run_config(tmp_path, "resumed", 3)
    assert resumed[-1]["test_loss"] == whole[-1]["test_loss"]
    assert resumed[-1]["train_loss"] == whole[-1]["train_loss"]
    assert [r["adaptive_clip_norm"] for r in resumed] == clips
    import json
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert summary["adaptive_clip_norm"] == clips[-1]
    from fedsim.compare import compare
    table = compare([tmp_path / "whole", tmp_path / "resumed"])
    header = table.splitlines()[0]
    assert "adaptive_clip_norm" in header


def test_each_client_adds_its_share_of_both_noises():
    """Over 2,000 keys, one client's upload and bit carry N(0, (z_Δ C)²/m) per
    coordinate and N(0, σ_b²/m): the m shares add up to the round's noise."""
    z, sigma_b, m, clip = 1.0, 2.0, 4, 0.5
    d = adaptive_client_level_dp(z, m, clipped_count_stddev=sigma_b, initial_clip_norm=clip)
    update = {"w": jax.numpy.full((10, 5), 0.01), "b": jax.numpy.zeros(3)}  # norm 0.0707 < C
    state = d.init(update)
    outs, states = jax.jit(jax.vmap(lambda k: d.apply(update, state, key=k)))(
        jax.random.split(jax.random.key(0), 2000))
    noise = np.concatenate([np.asarray(outs["w"] - 0.01).reshape(2000, -1),
                            np.asarray(outs["b"]).reshape(2000, -1)], axis=1)
    z_delta = (z ** -2 - (2 * sigma_b) ** -2) ** -0.5
    assert noise.std() == pytest.approx(z_delta * clip / math.sqrt(m), rel=0.02)
    bits = np.asarray(states["shifted_bit"])
    assert bits.std() == pytest.approx(sigma_b / math.sqrt(m), rel=0.05)
    assert abs(bits.mean() - 0.5) < 4 * sigma_b / math.sqrt(m) / math.sqrt(2000)
    assert np.all(np.asarray(states["clip_norm"]) == np.float32(clip))


def test_a_skipped_client_leaves_its_bit_out_of_the_count():
    """A client whose upload is NaN is skipped and keeps its state from before
    the round (bit 0): the others' two +½ bits give b̃ = (½ + ½)/3 + ½."""
    import jax.numpy as jnp

    from fedsim.hooks import Defense, chain
    from fedsim.simulation import build_defenses

    sim0 = Simulation(_cfg([_spec()], **{"training.on_nonfinite": "skip_client"}),
                      small_dataset())
    counts = [int(c) for c in sim0.client_counts]
    target = next(c for c in range(M) if counts.count(counts[c]) == 1)

    def apply(update, state, *, key, context=None):
        bad = context.num_examples == counts[target]
        return jax.tree_util.tree_map(lambda u: jnp.where(bad, jnp.nan, u), update), state

    poison = Defense(lambda p: (), apply, "upload", "nan_for_one_client")
    adaptive = build_defenses([_spec(initial_clip_norm=1e4)])["upload"]
    sim = Simulation(_cfg([], **{"training.on_nonfinite": "skip_client"}), small_dataset(),
                     defenses={"upload": chain(poison, adaptive)})
    state, res = sim.run_round(sim.init_state(), 0)
    assert res.skipped_clients == [target]
    upload = state.client_states["upload"][1]
    np.testing.assert_allclose(np.asarray(upload["clip_norm"]),
                               1e4 * math.exp(-0.2 * (1 / 3 + 0.5 - 0.5)), rtol=1e-6)



def test_a_round_that_skips_every_client_leaves_the_clip_norm():
    """No upload counted: no server step, for the model and for C (whose update
    from no bits, b̃ = ½, would move it at γ = 0.1)."""
    import jax.numpy as jnp

    from fedsim.hooks import Defense, chain
    from fedsim.simulation import build_defenses

    def apply(update, state, *, key, context=None):
        return jax.tree_util.tree_map(lambda u: u * jnp.nan, update), state

    poison = Defense(lambda p: (), apply, "upload", "nan_for_everyone")
    adaptive = build_defenses([_spec(target_unclipped_quantile=0.1)])["upload"]
    sim = Simulation(_cfg([], **{"training.on_nonfinite": "skip_client"}), small_dataset(),
                     defenses={"upload": chain(poison, adaptive)})
    state, res = sim.run_round(sim.init_state(), 0)
    assert len(res.skipped_clients) == M
    np.testing.assert_array_equal(np.asarray(state.client_states["upload"][1]["clip_norm"]),
                                  np.float32(0.1))
