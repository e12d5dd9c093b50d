"""benchmarks/analytic_attack_fmnist.py on a tiny synthetic dataset."""

from __future__ import annotations

import json

import pytest

from benchmarks import analytic_attack_fmnist as bench


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("aaf")
    result = bench.main(["--dataset", "synthetic", "--victims", "2", "--batch-sizes", "1", "4",
                         "--defense-batch-sizes", "1", "--sigmas", "0.1", "--gc-rates", "0.99",
                         "--soteria-rates", "0.4",
                         "--train-examples", "256", "--tolerance-batch-sizes", "1", "4",
                         "--tolerances", "1e-5", "1e-6", "--fedavg-steps", "2",
                         "--ig-batch-sizes", "1",
                         "--ig-victims", "1", "--ig-iterations", "5", "--out", str(out)])
    return out, result


def _row(result, **match):
    (row,) = [r for r in result["rows"] if all(r[k] == v for k, v in match.items())]
    return row


def test_every_part_is_written_with_its_setting(tiny):
    out, result = tiny
    assert json.loads((out / "analytic_attack_fmnist.json").read_text())["rows"] == json.loads(
        json.dumps(result["rows"]))
    assert (out / "analytic_attack_fmnist.png").stat().st_size > 0
    md = (out / "analytic_attack_fmnist.md").read_text()
    for heading in ("## Batch size, no defense", "## Defenses", "## The grouping tolerance",
                    "## Side by side with Inverting Gradients"):
        assert heading in md
    # B = 1 carries the defenses, B = 4 only the undefended row, for both models
    assert [(r["state"], r["batch_size"], r["setting"]) for r in result["rows"]] == [
        (s, b, label) for s in ("initial", "trained") for b, labels in (
            (1, ("none", "clip only (σ = 0)", "σ = 0.1", "p = 0.99", "p_fc = 0.4")),
            (4, ("none",))) for label in labels]
    assert [(r["state"], r["protocol"], r["match_tolerance"]) for r in result["tolerance"]] == [
        (s, p, t) for s in ("initial", "trained") for _ in (1, 4)
        for p in ("gradient", "fedsgd Δ", "fedavg Δ, 2 steps") for t in (1e-5, 1e-6)]
    assert [(r["state"], r["attack"]) for r in result["reference"]] == [
        ("initial", "analytic"), ("initial", "inverting_gradients"),
        ("trained", "analytic"), ("trained", "inverting_gradients")]


@pytest.mark.parametrize("state", ["initial", "trained"])
def test_one_example_is_read_off_and_noise_stops_it(tiny, state):
    _, result = tiny
    none = _row(result, state=state, batch_size=1, defense="none")
    assert none["recovered_share"] == 1.0 and none["false_exact"] == 0
    assert none["exclusive_1"] == none["exclusive_2"] == 1.0  # one example: every active unit
    assert none["median_psnr"] >= 80.0
    # clipping scales the one gradient: the ratios, and so the input, survive it
    assert _row(result, state=state, batch_size=1, setting="clip only (σ = 0)")[
        "recovered_share"] == 1.0
    noised = _row(result, state=state, batch_size=1, setting="σ = 0.1")
    assert noised["recovered_share"] == 0.0 and noised["median_psnr"] < 40.0
    # Soteria on the input layer: every unit's ratio is the image with 40 % of its
    # pixels zeroed, so the units agree (one group per victim) and miss the image; the
    # bias update is still the image's δ, not the pruned image's, so the peeling fit
    # fails and the group is not marked exact
    soteria = _row(result, state=state, batch_size=1, defense="soteria")
    assert soteria["recovered_share"] == 0.0 and soteria["false_exact"] == 0
    assert [v["groups"] for v in soteria["victims"]] == [1, 1]
    assert soteria["median_psnr"] < none["median_psnr"]
    # round(0.4 · 256) = 102 of the 16×16 synthetic image's pixels are zeroed; the rest
    # are read off (a zeroed pixel that was already within half a level of 0 counts too)
    assert 1 - 102 / 256 <= soteria["pixels_exact"] < 1.0
    assert none["pixels_exact"] == 1.0 and noised["pixels_exact"] < 0.5


def test_a_fedavg_upload_still_gives_one_example_exactly(tiny):
    _, result = tiny
    rows = [r for r in result["tolerance"] if r["protocol"] == "fedavg Δ, 2 steps"
            and r["batch_size"] == 1 and r["match_tolerance"] == 1e-5]
    assert len(rows) == 2  # both models
    for row in rows:
        assert row["examples"] == row["recovered"] == row["marked_exact"] == 2
        assert row["false_exact"] == 0


@pytest.mark.parametrize("state", ["initial", "trained"])
def test_the_batch_rows_carry_one_pass_and_the_closure(tiny, state):
    out, result = tiny
    row = _row(result, state=state, batch_size=4, defense="none")
    assert row["closure_2"] >= row["exclusive_2"]
    assert row["recovered_share"] >= row["recovered_share_one_pass"]
    assert row["max_passes"] >= 1 and 0 <= row["peeled_share"] <= 1
    assert 0 <= row["label_acc"] <= 1 and 0 <= row["label_acc_one_pass"] <= 1
    md = (out / "analytic_attack_fmnist.md").read_text()
    assert "| recovered | closure | passes | recovered, one pass |" in md
    assert "| label accuracy | label accuracy, one pass |" in md
    assert "largest peel fit, true groups" in md and "| groups (false) |" in md
    # the FedAvg upload of several steps is never peeled; the gradient is
    for r in result["tolerance"]:
        if r["protocol"].startswith("fedavg"):
            assert r["peeled"] == 0 and not r["peel_fit_true"] and not r["peel_fit_false"]
        elif r["protocol"] == "gradient" and r["batch_size"] == 1:
            assert r["peeled"] == r["marked_exact"] == r["groups"] == 2
            assert len(r["peel_fit_true"]) == 2
        assert r["marked_exact"] <= r["groups"]


def test_the_closure_takes_found_examples_out_of_every_unit():
    """Units 0–1 reach only a, 2–4 a and b, 5 only c: a then b are counted, c never."""
    import numpy as np

    kernel = np.array([[1, 1, 1, 1, 1, 0],    # example a is the first basis input
                       [0, 0, 1, 1, 1, 0],    # b
                       [0, 0, 0, 0, 0, 1]],   # c: one exclusive unit
                      np.float32)
    params = {"Dense_0": {"kernel": kernel, "bias": np.full(6, -0.5, np.float32)}}
    x = np.eye(3, dtype=np.float32)
    ex1, ex2, closure = bench.exclusive_unit_shares(params, x)
    assert ex1 == pytest.approx(2 / 3) and ex2 == pytest.approx(1 / 3)
    assert closure == pytest.approx(2 / 3)


def test_recovered_counts_come_from_the_truth_not_the_attacks_flags():
    import numpy as np

    x = np.zeros((2, 2, 2, 1), np.float32)
    x[1] += 1.0
    rec = x.copy()
    rec[1, 0, 0, 0] -= 0.01  # 2.55 levels off: not recovered
    hits, false_slots = bench.recovered(rec, x, np.array([True, True]))
    assert hits == 1 and false_slots.tolist() == [False, True]
    assert bench.pixels_exact(rec, x) == pytest.approx((1.0 + 3 / 4) / 2)
    rec[1, 0, 0, 0] = 1.0 - 0.4 / 255  # within half a level
    assert bench.recovered(rec, x, np.array([False, False]))[0] == 2
    assert bench.pixels_exact(rec, x) == 1.0


@pytest.mark.parametrize("argv", [["--victims", "1001"], ["--defense-batch-sizes", "3"],
                                  ["--tolerances", "0"], ["--fedavg-lr", "-1"]])
def test_bad_arguments_stop_before_anything_runs(argv, capsys):
    with pytest.raises(SystemExit) as err:
        bench.main(["--dataset", "synthetic", *argv])
    assert err.value.code == 2 and "error:" in capsys.readouterr().err
