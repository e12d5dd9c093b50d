"""benchmarks/adaptive_clipping_fmnist.py on a tiny synthetic federation."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import adaptive_clipping_fmnist as bench


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("acf")
    result = bench.main(["--dataset", "synthetic", "--clients", "20", "--cohort", "6",
                         "--rounds", "4", "--hidden", "8", "--batch", "5", "--eval-every", "2",
                         "--noise-multipliers", "0.5", "--quantiles", "0.5", "0.1",
                         "--out", str(out)])
    return out, result


def test_every_configuration_runs_on_the_same_cohorts_and_is_written(tiny):
    out, result = tiny
    assert json.loads((out / "adaptive_clipping_fmnist.json").read_text())["rows"] == json.loads(
        json.dumps(result["rows"]))
    assert (out / "adaptive_clipping_fmnist.png").stat().st_size > 0
    md = (out / "adaptive_clipping_fmnist.md").read_text()
    assert "Does the clip norm track its target quantile?" in md
    assert [r["config"] for r in result["rows"]] == ["adaptive γ=0.5", "adaptive γ=0.1"] + [
        f"fixed C={c:g}" for c in bench.FIXED_CLIPS]
    assert {r["noise_multiplier"] for r in result["rows"]} == {0.5}
    assert "### z = 0.5 (ε = " in md
    for row in result["rows"]:
        assert [e["round"] for e in row["accuracy"]] == [1, 3]
        assert all(0.0 <= e["accuracy"] <= 1.0 for e in row["accuracy"])
        assert len(row["trace"]) == 4
    # The cohorts and client keys are shared: round 0's updates (same start)
    # have the same median norm under every aggregation.
    first = {round(r["trace"][0]["median_update_norm"], 5) for r in result["rows"]}
    assert len(first) == 1


@pytest.mark.parametrize("row, gamma", [(0, 0.5), (1, 0.1)])
def test_the_adaptive_clip_follows_the_geometric_update_of_the_released_fraction(tiny, row,
                                                                                  gamma):
    _, result = tiny
    trace = result["rows"][row]["trace"]
    assert result["rows"][row]["target_unclipped_quantile"] == gamma
    assert trace[0]["clip_norm"] == pytest.approx(0.1)
    for a, b in zip(trace, trace[1:]):
        expected = a["clip_norm"] * math.exp(-0.2 * (a["noised_unclipped_fraction"] - gamma))
        assert b["clip_norm"] == pytest.approx(expected, rel=1e-5)
        assert a["quantile_update_norm"] <= a["median_update_norm"] + 1e-6 or gamma == 0.5
    # z = 0.5 with σ_b = m/20 = 0.3: 2σ_b = 0.6 > 0.5, z_Δ = (4 − 1/0.36)^(−1/2).
    setting = result["adaptive_settings"][row]
    assert setting["clipped_count_stddev"] == pytest.approx(0.3)
    assert setting["update_noise_multiplier"] == pytest.approx((4 - 1 / 0.36) ** -0.5)
    assert result["sample_rate"] == pytest.approx(6 / 20)
    assert result["rows"][row]["epsilon"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--clients", "4", "--cohort", "5"], "--cohort 5 is larger than --clients 4"),
    (["--quantiles", "1.5"], "--quantiles must lie in [0, 1]"),
    (["--noise-multipliers", "-1"], "--noise-multipliers must be >= 0"),
])
def test_bad_arguments_are_named(capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.main(["--dataset", "synthetic", *argv])
    assert message in capsys.readouterr().err
