"""benchmarks/diagnose_sgi_mask: part A's attack order and the report (no attack runs)."""

import json

import pytest

from benchmarks import diagnose_sgi_mask as D


def test_settings_are_taken_in_part_as_order_with_the_reference_point_last():
    """Part A attacked its (Conv-2, p-axis batch) group in one call, every scheme at
    every rate and then PruneFL at 0.3: the victims' keys follow that order."""
    from defenses.pruning.schemes import SCHEMES

    rates = [0.1, 0.5, 0.9]
    pairs = {(s, p): {} for s in SCHEMES for p in rates + [0.3]}
    order = D.part_a_order(pairs, rates)
    assert order[:3] == [(SCHEMES[0], 0.1), (SCHEMES[0], 0.5), (SCHEMES[0], 0.9)]
    assert order[-1] == ("prunefl", 0.3) and len(order) == 6 * 3 + 1
    assert D.part_a_order(pairs, [0.1, 0.3])[-1] == (SCHEMES[-1], 0.3)
    with pytest.raises(ValueError, match="lacks part-A p-axis rows"):
        D.part_a_order({k: v for k, v in pairs.items() if k != ("snip", 0.5)}, rates)


def test_the_report_counts_where_sgi_reaches_gi_under_each_mask(tmp_path):
    row = lambda s, p, gi, rec, sup, mod: {"base": s, "p": p, "B": 8, "gi_psnr": gi,
                                           "sgi_support_recorded_psnr": rec,
                                           "sgi_support_psnr": sup, "sgi_model_psnr": mod}
    out = {"commit": "a" * 40, "device": "cpu (x86_64)", "result": "chu2023_A.json",
           "result_commit": "b" * 40, "convolution": "xla", "attack": {"iterations": 2},
           "attack_key": "k", "victims_per_setting": 3, "seconds": 1.0,
           "control": {"gi_setting": ["random", 0.1], "gi_recorded": [1.0], "gi_rerun": [1.0],
                       "sgi_support_victims_equal": "6/6"},
           "sgi_ge_gi": {"support_recorded": "1/2", "support": "1/2", "model": "2/2"},
           "rows": [row("random", 0.1, 10.0, 11.0, 11.0, 12.0),
                    row("snip", 0.1, 10.0, 9.0, 9.0, 10.5)]}
    D.write(out, tmp_path)
    md = (tmp_path / "sgi_mask.md").read_text()
    assert "support (rerun) 1/2, model 2/2" in md and "for 6/6 victims" in md
    assert "| snip | 0.1 | 10.00 | 9.00 | 9.00 | 10.50 | +1.50 | +0.50 |" in md
    assert json.loads((tmp_path / "sgi_mask.json").read_text())["sgi_ge_gi"]["model"] == "2/2"
