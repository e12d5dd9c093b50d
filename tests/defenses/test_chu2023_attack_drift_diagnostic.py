"""benchmarks/diagnose_chu2023_attack_drift.py: its comparison with the record.

The reruns themselves (two part-B runs, 15-35 min on this CPU) are not run
here; the pieces that read them are, on small hand-made results.
"""

import pytest

from benchmarks import diagnose_chu2023_attack_drift as drift


def _row(defense, attack, rnd, psnr, nmi=0.5, accuracy=0.55):
    return {"part": "B", "model": "conv2", "base": "prunefl", "defense": defense, "p": 0.3,
            "B": 20, "attack": attack, "round": rnd, "client_id": 0, "fl_seed": 0,
            "lambda_pri": None, "defense_rate": None,
            "psnr": psnr, "nmi": nmi, "accuracy": accuracy}


RECORD = {"commit": "06191dbd", "rows": [_row("none", "sgi", 0, 19.274),
                                         _row("none", "gi", 0, 14.75)]}


def test_equal_rows_are_counted_and_a_moved_one_is_measured():
    run = {"rows": [_row("none", "sgi", 0, 19.274), _row("none", "gi", 0, 15.016, nmi=0.75)]}
    c = drift.compare_rows(RECORD, run)
    assert c["rows_matched"] == 2 and c["rows"] == 2
    assert c["psnr"]["equal"] == 1
    assert c["psnr"]["largest_abs_difference"] == pytest.approx(0.266)
    assert c["nmi"] == {"equal": 1, "largest_abs_difference": pytest.approx(0.25)}
    assert c["accuracy"] == {"equal": 2, "largest_abs_difference": 0.0}


def test_a_row_the_record_lacks_is_not_matched():
    run = {"rows": [_row("none", "sgi", 1, 19.274)]}
    c = drift.compare_rows(RECORD, run)
    assert c["rows_matched"] == 0 and c["rows"] == 1
    assert c["psnr"] == {"equal": 0, "largest_abs_difference": None}


def test_the_report_puts_each_rules_psnr_beside_the_record():
    runs = {"auto": {"rows": [_row("none", "sgi", 0, 19.798), _row("none", "gi", 0, 15.016)]},
            "xla": {"rows": [_row("none", "sgi", 0, 19.274), _row("none", "gi", 0, 14.75)]}}
    table = drift.row_table(RECORD, runs)
    assert [(t["recorded_psnr"], t["auto_psnr"], t["xla_psnr"]) for t in table] == [
        (19.274, 19.798, 19.274), (14.75, 15.016, 14.75)]
    result = {"commit": "abc1234", "device": "cpu", "rounds": None,
              "record": "benchmarks/results/chu2023_B.json", "record_commit": "06191dbd",
              "seconds": {"auto": 1.0, "xla": 2.0}, "run_commits": {"auto": "abc", "xla": "abc"},
              "comparison": {rule: drift.compare_rows(RECORD, runs[rule]) for rule in runs},
              "psnr_by_row": table}
    md = drift.markdown(result)
    assert "| xla | 2 | 2 of 2 | 2 / 0 | 2 / 0 | 2 / 0 |" in md
    assert "| none | sgi | 0 | 0 | 19.274 | 19.798 | 19.274 |" in md
    assert "Commits the reruns recorded: auto abc, xla abc." in md


def test_too_few_rounds_are_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exc:
        drift.main(["--rounds", "2"])
    assert exc.value.code == 2
    assert "--rounds must be at least 3" in capsys.readouterr().err
