"""benchmarks/nmi_chance_floor.py and benchmarks/chu2023_floor_reading.py on small inputs."""

import json

import numpy as np
import pytest

from benchmarks import chu2023_floor_reading as reading
from benchmarks import nmi_chance_floor as floor


def test_floor_rows_order_the_stand_ins_and_score_the_target_perfectly():
    rng = np.random.default_rng(0)
    # Images with a shared black border, like Fashion-MNIST's background.
    images = np.zeros((40, 8, 8, 1), np.float32)
    images[:, 2:6, 2:6] = rng.random((40, 4, 4, 1))
    rows = floor.floor_rows(images, 8, (1, 4), draws=3, rng=rng)
    by = {(r["B"], r["reconstruction"]): r for r in rows}
    assert len(rows) == 2 * (3 + len(floor.NOISE_STDS))
    for b in (1, 4):
        assert by[(b, "target")]["nmi"] == pytest.approx(1.0)
        assert by[(b, "target")]["ami"] == pytest.approx(1.0)
        assert abs(by[(b, "uniform noise")]["ami"]) < 0.05
        assert by[(b, "uniform noise")]["nmi"] > 0.1  # the plug-in estimate's chance floor
        assert by[(b, "target + N(0, 0.05²)")]["psnr"] > by[(b, "target + N(0, 0.2²)")]["psnr"]


def test_committed_rows_are_counted_against_the_floor_of_their_batch(tmp_path, monkeypatch):
    rows = [{"image_size": 16, "B": 8, "reconstruction": "unrelated", "nmi": 0.5, "psnr": 12.0}]
    path = tmp_path / "chu2023.json"
    path.write_text(json.dumps({"image_size": 16, "commit": "A " + "a" * 40, "rows": [
        {"part": "A", "B": 8, "nmi": 0.45, "psnr": 11.0},    # below both
        {"part": "A", "B": 8, "nmi": 0.60, "psnr": 11.0},    # below in PSNR only
        {"part": "A", "B": 8, "nmi": 0.70, "psnr": 25.0},    # above both
        {"part": "B", "B": 20, "nmi": 0.1, "psnr": 5.0},     # no floor at B = 20: left out
    ]}))
    monkeypatch.setattr(floor, "ROOT", tmp_path)  # the report names the file relative to it
    out = floor.committed_rows_against_floor(rows, path)
    (e,) = out["per_part_and_B"]
    assert (e["part"], e["B"], e["rows"]) == ("A", 8, 3)
    assert (e["nmi_at_or_below"], e["psnr_at_or_below"], e["both_at_or_below"]) == (1, 2, 1)
    assert out["commit"] == "A aaaaaaa"


def _part_b(defense, attack, nmi, ami, round_=29):
    return {"part": "B", "B": 20, "round": round_, "defense": defense, "attack": attack,
            "nmi": nmi, "psnr": 10.0, "ami": ami}


def test_priprune_gain_in_the_three_readings():
    floor_file = {"rows": [{"image_size": 16, "B": 20, "reconstruction": "unrelated",
                            "nmi": 0.4, "ami": 0.2, "psnr": 13.0}]}
    run = {"image_size": 16, "rows": [
        _part_b("none", "sgi", 0.6, 0.5), _part_b("priprune", "sgi", 0.5, 0.3),
        _part_b("none", "sgi", 0.9, 0.9, round_=3),  # not the last round: ignored
    ]}
    g = reading.readings(run, floor_file)["priprune_gain"]["sgi"]
    assert g["paper"] == pytest.approx(0.1 / 0.6)
    assert g["above_floor"] == pytest.approx(0.1 / 0.2)
    assert g["ami"] == pytest.approx(0.2 / 0.5)
    # No defense already at or below the floor: there is no leakage above it to reduce.
    run["rows"][0]["nmi"] = 0.35
    assert reading.readings(run, floor_file)["priprune_gain"]["sgi"]["above_floor"] is None
    with pytest.raises(ValueError, match=r"no 'unrelated' row at 16×16, B = 20"):
        reading.readings(run, {"rows": []})
