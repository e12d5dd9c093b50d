"""benchmarks/compile_time_cpu.py: its readings and its argument errors (no runs)."""

import pytest

from benchmarks.compile_time_cpu import (main, markdown, projected, same_across_trees,
                                         same_numbers, summarize)


def _row(tree="this", strategy="loop", k=1, cache="off", p=0, secs=(10.0, 1.0, 2.0, 3.0),
         wall=20.0, loss=0.5, acc=0.7):
    return {"tree": tree, "pass": p, "strategy": strategy, "k": k, "cache": cache,
            "wall_s": wall, "round0_s": secs[0], "steady_s": sorted(secs[1:])[len(secs[1:]) // 2],
            "round_seconds": list(secs), "final_train_loss": loss, "final_accuracy": acc,
            "strategy_line": None}


def test_projected_replaces_the_rounds_part_of_the_wall_time():
    r = _row()  # 16 s of rounds inside 20 s: 4 s outside them; steady = median(1, 2, 3) = 2
    assert projected(r, 5) == pytest.approx(4.0 + 10.0 + 4 * 2.0)
    assert projected(r, 4) == pytest.approx(r["wall_s"])  # its own rounds: the wall time


def test_summary_takes_medians_per_group_and_same_numbers_per_pass():
    rows = [_row(wall=w, p=p) for p, w in enumerate((20.0, 30.0, 26.0))]
    rows += [_row(cache="warm", p=p, loss=0.5 if p else 0.6) for p in range(2)]
    out = {(s["cache"]): s for s in summarize(rows, 4)}
    assert out["off"]["wall_s"] == 26.0 and out["off"]["n"] == 3
    same = same_numbers(rows)
    assert same["this loop k=1 pass 1"] and not same["this loop k=1 pass 0"]
    text = markdown({"config": "c.yaml", "rounds": 4, "rounds_full": 4, "passes": 3,
                     "device": "cpu", "trees": {"this": "abc1234"}, "rows": rows,
                     "summary": summarize(rows, 4), "same_numbers": same})
    assert "| this | loop | 1 | off | 10.0 | 2.000 | 26.0 | 26.0 |" in text
    assert "NO:" in text


def test_trees_are_compared_setting_by_setting_and_the_overrides_are_named():
    rows = [_row(tree=t, cache=c, loss=loss) for t, c, loss in
            (("this", "off", 0.5), ("before", "off", 0.5), ("this", "warm", 0.5),
             ("before", "warm", 0.6), ("this", "cold", 0.5))]
    across = same_across_trees(rows)
    # "cold" ran in one tree only: nothing to compare there.
    assert across == {"loop k=1 off pass 0": True, "loop k=1 warm pass 0": False}
    text = markdown({"config": "c.yaml", "rounds": 4, "rounds_full": 4, "passes": 1,
                     "device": "cpu", "trees": {"this": "abc1234", "before": "def5678"},
                     "rows": rows, "summary": summarize(rows, 4), "same_numbers": {},
                     "sets": ["observer.rounds=[0]"]})
    assert ", `--set observer.rounds=[0]`;" in text
    assert "Same final loss and accuracy in every code tree, setting by setting: NO:" in text


@pytest.mark.parametrize("argv, message", [
    (["--ks", "1,x"], "--ks must be comma-separated integers"),
    (["--baseline-ks", "0"], "--baseline-ks values must be >= 1"),
    (["--rounds", "1"], "--rounds must be >= 2"),
    (["--passes", "0"], "--passes must be >= 1"),
    (["--config", "missing.yaml"], "--config missing.yaml: no such file"),
    (["--baseline", "nolabel"], "--baseline must be LABEL=PATH"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err
