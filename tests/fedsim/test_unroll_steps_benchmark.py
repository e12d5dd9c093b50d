"""benchmarks/unroll_steps_cpu.py: a real child per setting, its readings, its argument errors."""

import pytest

from benchmarks.unroll_steps_cpu import break_even, main, markdown, run_child, summarize

TINY = {"model": "mlp", "image_size": 8, "steps": 3, "batch": 2, "clients": 1, "rounds": 1}


def test_a_child_runs_the_setting_it_is_given():
    unrolled, scanned = run_child(TINY, 32), run_child(TINY, 0)
    for r in (unrolled, scanned):
        assert r["local_steps"] == 3 and r["first_s"] > 0 and r["round_s"] > 0
        assert r["compiles"] >= 1 and len(r["rounds_s"]) == 1 and r["scan_hint"] is False
    assert (unrolled["unroll_steps"], scanned["unroll_steps"]) == (32, 0)


def test_a_defense_runs_with_its_scan_hint_turned_off():
    r = run_child({**TINY, "steps": 2, "defense": {"name": "dp_vmf", "kappa": 1000.0}}, 32)
    assert r["local_steps"] == 2 and r["scan_hint"] is False


def _row(unroll, first, round_s, p=0, digest=None, steps=30):
    return {"pass": p, "unroll_steps": unroll, "local_steps": steps, "first_s": first,
            "compile_s": first - 1.0, "round_s": round_s, "digest": digest or f"d{unroll}"}


def test_medians_break_even_and_markdown():
    rows = [_row(32, f, r, p) for p, (f, r) in enumerate(((30.0, 0.1), (34.0, 0.09),
                                                           (32.0, 0.11)))]
    rows += [_row(0, f, r, p) for p, (f, r) in enumerate(((6.0, 0.5), (5.0, 0.6), (7.0, 0.4)))]
    summary = summarize(rows)
    u, s = summary
    assert (u["unrolled"], s["unrolled"]) == (True, False)
    assert (u["first_s"], u["round_s"], s["first_s"], s["round_s"]) == (32.0, 0.1, 6.0, 0.5)
    b = break_even(summary)
    assert b["rounds"] == pytest.approx((32.0 - 6.0) / (0.5 - 0.1))
    assert b["first_round_ratio"] == pytest.approx(32 / 6) and b["round_ratio"] == pytest.approx(5)
    text = markdown({"workload": {**TINY, "model": "lenet5"}, "passes": 3, "device": "cpu",
                     "commit": "abc1234def", "dirty": False, "seconds": 99.0,
                     "summary": summary, "break_even": b})
    assert "| 32 | 30 | yes | 32.00 | 31.00 | 0.100 | 32.9 | 41.9 |" in text
    assert "| 0 | 30 | no (scan) | 6.00 | 5.00 | 0.500 | 10.5 | 55.5 |" in text
    assert "pays for itself after 65 rounds" in text and "digests differ" in text


def test_no_break_even_where_unrolling_is_not_faster_or_a_side_is_missing():
    summary = summarize([_row(32, 2.0, 0.5), _row(0, 1.0, 0.5)])
    assert break_even(summary)["rounds"] is None
    assert break_even(summarize([_row(32, 2.0, 0.5)])) is None


@pytest.mark.parametrize("argv, message", [
    (["--model", "lenet_5"], "did you mean 'lenet5'?"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--passes", "0"], "--passes must be >= 1"),
    (["--unroll", "32,x"], "expected distinct integers >= 0"),
    (["--unroll", "32,32"], "expected distinct integers >= 0"),
    (["--unroll", "-1"], "expected distinct integers >= 0"),
    (["--defense", "{name: dp_vmf}"], "not JSON"),
    (["--defense", '["dp_vmf"]'], "expected a JSON object with a 'name'"),
    (["--defense", '{"name": "dp_vfm"}'], "dp_vfm"),
    (["--defense", '{"name": "dp_vmf", "kappa": -1}'], "kappa"),
    (["--name", "a/b"], "--name 'a/b': expected a file stem"),
])
def test_bad_arguments_are_named_before_anything_runs(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit):
        main([*argv, "--out", str(tmp_path)])
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_markdown_says_when_unrolling_is_slower_and_the_digests_agree():
    summary = summarize([_row(32, 60.0, 0.04, digest="same"), _row(0, 5.0, 0.035, digest="same")])
    text = markdown({"workload": {**TINY, "defense": {"name": "dp_vmf", "kappa": 1000}},
                     "passes": 1, "device": "cpu", "commit": "abc1234def", "dirty": False,
                     "seconds": 66.0, "summary": summary, "break_even": break_even(summary)})
    assert "1 client a round" in text and 'defense `{"name": "dp_vmf", "kappa": 1000}`' in text
    assert "a later round 1.1× as long" in text and "never pays" in text
    assert "the settings gave the same parameters bit for bit" in text
