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
                         "--noise-multiplier", "0.5", "--out", str(out)])
    return out, result


def test_every_configuration_runs_on_the_same_cohorts_and_is_written(tiny):
    out, result = tiny
    assert json.loads((out / "adaptive_clipping_fmnist.json").read_text())["rows"] == json.loads(
        json.dumps(result["rows"]))
    assert (out / "adaptive_clipping_fmnist.png").stat().st_size > 0
    md = (out / "adaptive_clipping_fmnist.md").read_text()
    assert "Does the clip norm track the median update norm?" in md
    assert [r["config"] for r in result["rows"]] == ["adaptive"] + [
        f"fixed C={c:g}" for c in bench.FIXED_CLIPS]
    for row in result["rows"]:
        assert [e["round"] for e in row["accuracy"]] == [1, 3]
        assert all(0.0 <= e["accuracy"] <= 1.0 for e in row["accuracy"])
        assert len(row["trace"]) == 4
    # The cohorts and client keys are shared: round 0's updates (same start)
    # have the same median norm under every aggregation.
    first = {round(r["trace"][0]["median_update_norm"], 5) for r in result["rows"]}
    assert len(first) == 1


def test_the_adaptive_clip_follows_the_geometric_update_of_the_released_fraction(tiny):
    _, result = tiny
    trace = result["rows"][0]["trace"]
    assert trace[0]["clip_norm"] == pytest.approx(0.1)
    for a, b in zip(trace, trace[1:]):
        expected = a["clip_norm"] * math.exp(-0.2 * (a["noised_unclipped_fraction"] - 0.5))
        assert b["clip_norm"] == pytest.approx(expected, rel=1e-5)
    # z = 0.5 with σ_b = m/20 = 0.3: 2σ_b = 0.6 > 0.5, z_Δ = (4 − 1/0.36)^(−1/2).
    assert result["clipped_count_stddev"] == pytest.approx(0.3)
    assert result["update_noise_multiplier"] == pytest.approx((4 - 1 / 0.36) ** -0.5)
    assert result["sample_rate"] == pytest.approx(6 / 20)
    assert result["epsilon"] > 0


def test_a_cohort_larger_than_the_federation_is_named(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--dataset", "synthetic", "--clients", "4", "--cohort", "5"])
    assert "--cohort 5 is larger than --clients 4" in capsys.readouterr().err
