"""benchmarks/chu2023_refresh.py: a part-A run with one scheme's rows refreshed."""

import json

import numpy as np
import pytest

from benchmarks.chu2023_refresh import analyse, check_pair, main, markdown, refreshed_rows

SCHEMES = ["random", "snip", "grasp", "synflow", "prunefl", "feddst"]
RATES = (0.1, 0.5, 0.9)


def _row(scheme, p, attack, psnr_victims, seed, share=0.1, B=8, model="conv2"):
    return {"part": "A", "model": model, "B": B, "base": scheme, "p": p, "attack": attack,
            "psnr_victims": list(psnr_victims), "psnr": float(np.mean(psnr_victims)),
            "nmi_victims": [v / 40 for v in psnr_victims],
            "nmi": float(np.mean(psnr_victims)) / 40,
            "victim_indices": [[seed, 1], [seed, 2], [seed, 3]],
            "init_key": f"chu2023/A/init/{model}", "mask_key": f"chu2023/A/mask/{scheme}/{p}",
            "pruned_grad_share_victims": [share] * 3, "seed": seed}


def _run(seed, schemes=SCHEMES, feddst_sgi=None, share=0.2):
    """A part-A result: SGI 5 dB over GI everywhere, falling with p, except FedDST's SGI at
    p = 0.1 (``feddst_sgi``, per victim)."""
    rows = []
    for s in schemes:
        for p in RATES:
            gi = [20 - 10 * p + d for d in (0.0, 0.5, 1.0)]
            sgi = [v + 5 for v in gi]
            if s == "feddst" and p == 0.1 and feddst_sgi is not None:
                sgi = feddst_sgi
            rows += [_row(s, p, "gi", gi, seed, share), _row(s, p, "sgi", sgi, seed, share)]
    if "prunefl" in schemes:  # the B axis
        rows += [_row("prunefl", 0.3, a, [10.0, 11.0, 12.0], seed, B=1) for a in ("gi", "sgi")]
    settings = {"a_protocol": "alg1", "p_axis_batch": 8, "rates": list(RATES),
                "seed": seed, "schemes": list(schemes)}
    return {"seed": seed, "mode": "quick", "image_size": 16, "dataset": "fashion_mnist",
            "partition": "dirichlet", "commit": f"c{seed}", "settings": settings, "rows": rows}


def _pair(seed):
    # The stale base has FedDST's SGI below GI at p = 0.1; the refresh above it.
    base = _run(seed, feddst_sgi=[10.0, 10.5, 11.0], share=0.2)
    refresh = _run(seed, ["feddst"], share=0.11)
    return base, refresh


def test_refreshed_rows_replace_only_the_refreshed_scheme():
    base, refresh = _pair(0)
    rows = refreshed_rows(base, refresh, ["feddst"])
    assert len(rows) == len(base["rows"])
    assert [r for r in rows if r["base"] != "feddst"] \
        == [r for r in base["rows"] if r["base"] != "feddst"]
    assert [r for r in rows if r["base"] == "feddst"] == refresh["rows"]


def test_the_refresh_moves_the_check_and_pools_over_seeds():
    pairs = [_pair(0), _pair(1)]
    report = analyse([b for b, _ in pairs], [r for _, r in pairs],
                     [("b0.json", "r0.json"), ("b1.json", "r1.json")])
    assert report["schemes"] == ["feddst"] and report["protocol"] == "alg1"
    first = report["pairs"][0]
    check = next(c for c in first["checks"] if c["check"].startswith("SGI >= GI in PSNR"))
    assert (check["old"], check["new"]) == (False, True)
    assert "fails: feddst/p=0.1" in check["old_detail"] and check["new_detail"] == "18/18 hold"
    # FedDST's stale SGI at p = 0.1 also broke its monotone fall; the refresh restores it.
    falls = next(c for c in first["checks"] if c["check"].startswith("SGI PSNR falls"))
    assert (falls["old"], falls["new"]) == (False, True)
    assert sum(c["old"] != c["new"] for c in first["checks"]) == 3  # + SGI NMI falls
    low = next(x for x in first["settings"] if x["p"] == 0.1)
    assert low["old"]["pruned_grad_share"] == pytest.approx(0.2)
    assert low["new"]["pruned_grad_share"] == pytest.approx(0.11)
    assert low["old"]["sgi_minus_gi"]["verdict"] == "GI better"
    assert low["new"]["sgi_minus_gi"]["mean"] == pytest.approx(5.0)
    assert [x["p"] for x in first["settings"]] == list(RATES)  # FedDST's p axis only
    assert {x["masks"] for x in first["settings"]} == {"other"}  # every share differs here

    # FedDST's SGI PSNR rose with p in the stale rows (10.5 → 20.5 → 16.5 dB) and falls now.
    slope = {label: next(x for x in first["p_trend"][label]
                         if (x["attack"], x["metric"]) == ("sgi", "psnr"))
             for label in ("old", "new")}
    assert slope["old"]["mean"] == pytest.approx(7.5) and slope["old"]["verdict"] == "rises"
    assert slope["new"]["mean"] == pytest.approx(-10.0) and slope["new"]["verdict"] == "falls"
    assert {x["base"] for x in first["p_trend"]["new"]} == {"feddst"}
    pooled_new = report["pooled"]["new"]["sgi_minus_gi_psnr"]
    assert {x["base"] for x in pooled_new} == {"feddst"}
    assert len(next(x for x in pooled_new if x["p"] == 0.1)["diffs"]) == 6  # 2 seeds x 3
    trend = report["pooled"]["new"]["p_trend"]
    assert {(x["attack"], x["metric"]) for x in trend} == {
        (a, m) for a in ("sgi", "gi") for m in ("nmi", "psnr")}
    assert all(x["verdict"] == "falls" for x in trend)
    md = markdown({"commit": "abc", "argv": ["--base", "b"], **report})
    assert "| feddst | 0.1 | 0.200 → 0.110 | other |" in md
    assert "| feddst | SGI | PSNR | +7.50 (+7.50 to +7.50) rises | -10.00" in md
    assert "Verdicts that moved: 3 of" in md and "## Pooled over seeds 0, 1" in md


@pytest.mark.parametrize("change,message", [
    (lambda b, r: r.update(seed=1), "seeds differ"),
    (lambda b, r: r["settings"].update(rates=[0.1, 0.9]), "rates"),
    (lambda b, r: r["rows"][0].update(victim_indices=[[9, 9]]), "victim_indices"),
    (lambda b, r: r["rows"][1].update(mask_key="other"), "mask_key"),
    (lambda b, r: r["rows"].pop(), "1 only in the base"),
    (lambda b, r: b["settings"].update(schemes=["snip"]), "not the whole p axis"),
    (lambda b, r: r["settings"].update(schemes=SCHEMES), "the refresh is a whole p axis"),
])
def test_a_refresh_of_another_run_is_refused(change, message):
    base, refresh = _pair(0)
    change(base, refresh)
    with pytest.raises(ValueError, match=message):
        check_pair(base, refresh)


def test_rows_without_per_victim_scores_are_named():
    base, refresh = _pair(0)
    for r in base["rows"]:
        del r["psnr_victims"]
    with pytest.raises(ValueError, match="the base run's p-axis rows of feddst carry no "
                                         "per-victim PSNR"):
        analyse([base], [refresh], [("b.json", "r.json")])


def test_mixed_protocols_and_schemes_are_refused():
    (b0, r0), (b1, r1) = _pair(0), _pair(1)
    b1["settings"]["a_protocol"] = "pruned_model"
    r1["settings"]["a_protocol"] = "pruned_model"
    with pytest.raises(ValueError, match="mix part-A protocols"):
        analyse([b0, b1], [r0, r1], [("a", "b"), ("c", "d")])
    (b1, r1), r1b = _pair(1), _run(1, ["snip"])
    with pytest.raises(ValueError, match="refreshes"):
        analyse([b0, b1], [r0, r1b], [("a", "b"), ("c", "d")])


def test_main_writes_the_report_and_names_bad_input(tmp_path, capsys):
    for seed in (0, 1):
        b, r = _pair(seed)
        (tmp_path / f"b{seed}.json").write_text(json.dumps(b))
        (tmp_path / f"r{seed}.json").write_text(json.dumps(r))
    report = main(["--base", "b0.json,b1.json", "--refresh", "r0.json,r1.json",
                   "--results", str(tmp_path), "--out", str(tmp_path), "--stem", "rep"])
    assert json.loads((tmp_path / "rep.json").read_text())["schemes"] == ["feddst"]
    assert "Verdicts that moved: 3 of" in (tmp_path / "rep.md").read_text()
    assert report["argv"][:2] == ["--base", "b0.json,b1.json"]
    (tmp_path / "bad.json").write_text("{")
    for argv, message in (
            (["--base", "b0.json", "--refresh", "r0.json,r1.json"], "give one refresh per"),
            (["--base", "b0.json", "--refresh", "nope.json"], "--refresh"),
            (["--base", "bad.json", "--refresh", "r0.json"], "not valid JSON"),
            (["--base", "b0.json", "--refresh", "r1.json"], "seeds differ")):
        with pytest.raises(SystemExit):
            main([*argv, "--results", str(tmp_path)])
        assert message in capsys.readouterr().err


def test_masks_are_compared_through_the_recorded_shares():
    from benchmarks.chu2023_refresh import same_masks, setting_table
    assert same_masks([0.5, 0.4], [0.5, 0.4 + 1e-9]) == "same"
    assert same_masks([0.2, 0.21], [0.11, 0.12]) == "other"
    assert same_masks([0.2], [0.2, 0.2]) == "other"
    assert same_masks(None, [0.11]) == "unverified"
    base, refresh = _run(0, share=0.5), _run(0, ["feddst"], share=0.5)
    for r in base["rows"]:
        if r["base"] == "feddst" and r["p"] == 0.1:
            r["pruned_grad_share_victims"] = [0.2] * 3
        if r["base"] == "feddst" and r["p"] == 0.9:
            del r["pruned_grad_share_victims"]
    masks = {x["p"]: x["masks"] for x in setting_table(base, refresh, ["feddst"])}
    assert masks == {0.1: "other", 0.5: "same", 0.9: "unverified"}
