"""benchmarks/diagnose_largest_collapse.py: victim positions, the sign-steering
measure, and (slow) a rebuild of a smoke part-B run."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import diagnose_largest_collapse as dlc


def _rows():
    rows = []
    for defense, rnd, client in (("none", 0, 0), ("none", 2, 0), ("none", 2, 1),
                                 ("largest", 2, 0), ("largest", 2, 1)):
        for att in ("sgi", "gi"):
            rows.append({"part": "B", "defense": defense, "round": rnd, "client_id": client,
                         "attack": att})
    return [{"part": "A", "attack": "sgi"}] + rows


def test_victim_positions_follow_part_bs_attack_order():
    n, pos = dlc.part_b_victims(_rows())
    assert n == 5
    assert pos[("none", 0, 0)] == 0 and pos[("largest", 2, 0)] == 3
    assert pos[("largest", 2, 1)] == 4
    assert set(dlc.rows_of(_rows(), "largest", 2, 1)) == {"sgi", "gi"}


def _mlp(b1):
    def apply_fn(p, x):
        h = jax.nn.relu(x.reshape(x.shape[0], -1) @ p["w1"] + p["b1"])
        return h @ p["w2"] + p["b2"]
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"w1": 0.3 * jax.random.normal(k1, (16, 8)), "b1": jnp.full((8,), b1),
              "w2": 0.3 * jax.random.normal(k2, (8, 3)), "b2": jnp.zeros(3)}
    return apply_fn, params


@pytest.mark.parametrize("b1, steers", [(-100.0, False), (0.0, True)])
def test_matching_term_steers_only_a_live_network(b1, steers):
    """A hidden layer dead for every input leaves the matching term no input gradient
    (only the output bias's gradient, which depends on the labels alone), so the signed
    step is the TV prior's; a live one changes the sign at some pixels."""
    from attacks.gradient_inversion import make_simulate
    apply_fn, params = _mlp(b1)
    cfg, _ = dlc.attack_cfg({"iterations": 3, "tv": 1e-3}, masked=False)
    x_true = jax.random.uniform(jax.random.key(1), (2, 4, 4, 1))
    labels = jnp.array([0, 2])
    target = make_simulate(apply_fn, cfg)(params, x_true, jax.nn.one_hot(labels, 3))
    x = np.asarray(jax.random.uniform(jax.random.key(2), (2, 4, 4, 1)))
    out = dlc.sign_steering(apply_fn, cfg, params, target, labels, x, 3)
    if steers:
        assert out["match_grad_max"] > 0 and out["sign_changed_share"] > 0
    else:
        assert out["match_grad_max"] == 0 and out["sign_changed_share"] == 0


def test_bad_results_file_is_an_argparse_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        dlc.main(["--results", str(tmp_path / "missing.json"), "--out", str(tmp_path)])
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "a.json").write_text(json.dumps({"rows": [{"part": "A"}]}))
    with pytest.raises(SystemExit):
        dlc.main(["--results", str(tmp_path / "a.json"), "--out", str(tmp_path)])
    assert "no part-B rows" in capsys.readouterr().err


def test_name_must_be_a_plain_file_stem(tmp_path, capsys):
    (tmp_path / "b.json").write_text(json.dumps({"rows": [{"part": "B"}]}))
    for bad in ("../x", "a b", "_x"):
        with pytest.raises(SystemExit):
            dlc.main(["--results", str(tmp_path / "b.json"), "--out", str(tmp_path),
                      "--name", bad])
        assert "--name must be letters" in capsys.readouterr().err


def test_markdown_title_names_the_defenses_diagnosed():
    def rec(defense):
        att = {"nmi": 0.2, "row_nmi": 0.2, "psnr": 8.0, "row_psnr": 8.0, "loss": 1.0,
               "row_loss": 1.0, "at_reconstruction": {"match_grad_max": 0.0,
                                                      "tv_grad_median": 0.0,
                                                      "sign_changed_share": 0.0},
               "at_true_batch": {"sign_changed_share": 0.0}}
        return {"defense": defense, "client_id": 0, "accuracy": 0.1,
                "predicted_classes_test": 2, "logit_std_over_test_max": 1e-8,
                "activity_victim": {k: {"units_ever_active": 0.0} for k in dlc.HIDDEN},
                "ce_input_grad_norm": 0.0, "gi": att, "sgi": att,
                "gi_sgi_max_pixel_difference": 0.0}
    res = {"source": "x.json", "source_commit": "a", "commit": "b", "seconds": 1.0,
           "device": "cpu", "records": [rec("none"), rec("mix"), rec("mix")]}
    assert dlc.markdown(res).startswith("# Part B's Mix uploads: why GI and SGI")
    res["records"] = [rec("largest"), rec("largest_pseudo")]
    assert dlc.markdown(res).startswith("# Part B's Largest / Largest pseudo uploads")


@pytest.mark.slow
def test_rebuilds_a_smoke_part_b_run_and_refuses_another(tmp_path, capsys):
    from benchmarks import reproduce_chu2023
    reproduce_chu2023.main(["--smoke", "--parts", "B", "--defenses", "none,largest",
                            "--out", str(tmp_path)])
    dlc.main(["--results", str(tmp_path / "chu2023_B.json"), "--defenses", "largest",
              "--out", str(tmp_path), "--name", "smoke_collapse"])
    res = json.loads((tmp_path / "smoke_collapse.json").read_text())
    assert (tmp_path / "smoke_collapse.md").read_text().startswith("# Part B's Largest uploads")
    assert [(r["defense"], r["client_id"]) for r in res["records"]] == [("largest", 0),
                                                                        ("largest", 1)]
    for r in res["records"]:
        for att in ("gi", "sgi"):  # the victims' own keys reproduce the rows
            assert r[att]["nmi"] == pytest.approx(r[att]["row_nmi"], abs=1e-6)
    # A file whose accuracies this code does not reproduce is refused.
    b = json.loads((tmp_path / "chu2023_B.json").read_text())
    for row in b["rows"]:
        row["accuracy_by_round"] = [a + 0.01 for a in row["accuracy_by_round"]]
    (tmp_path / "other.json").write_text(json.dumps(b))
    with pytest.raises(SystemExit):
        dlc.main(["--results", str(tmp_path / "other.json"), "--defenses", "largest",
                  "--out", str(tmp_path)])
    assert "accuracies differ" in capsys.readouterr().err


def test_same_gi_sgi_scores_names_only_defenses_equal_at_every_client():
    from benchmarks.reproduce_chu2023 import same_gi_sgi_scores, same_scores_lines
    rows = []
    for defense, scores in (("none", {0: ((0.4, 12.0), (0.45, 13.0)), 1: ((0.3, 9.0), (0.3, 9.0))}),
                            ("largest", {0: ((0.19, 7.7), (0.19, 7.7)),
                                         1: ((0.2, 8.3), (0.2, 8.3))})):
        for client, (gi, sgi) in scores.items():
            for att, (n, ps) in (("gi", gi), ("sgi", sgi)):
                rows.append({"part": "B", "defense": defense, "round": 29, "client_id": client,
                             "attack": att, "nmi": n, "psnr": ps})
    # An earlier round's identical pair does not count; "none" differs at client 0.
    rows.append({"part": "B", "defense": "none", "round": 0, "client_id": 0, "attack": "gi",
                 "nmi": 0.5, "psnr": 14.0})
    assert same_gi_sgi_scores(rows, 29) == ["largest"]
    assert "for: largest." in " ".join(same_scores_lines(rows, 29))
    rows[-2]["psnr"] = 8.31  # largest, client 1, SGI: no longer equal
    assert same_gi_sgi_scores(rows, 29) == [] and same_scores_lines(rows, 29) == []
