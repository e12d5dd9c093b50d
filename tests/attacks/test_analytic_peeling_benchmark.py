"""benchmarks/analytic_attack_peeling.py on a tiny synthetic dataset."""

from __future__ import annotations

import json

import jax
import pytest

from benchmarks import analytic_attack_peeling as bench


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("aap")
    result = bench.main(["--dataset", "synthetic", "--victims", "2", "--batch-sizes", "1", "4",
                         "--peel-tolerances", "1e-3", "1e-2", "--train-examples", "256",
                         "--out", str(out)])
    return out, result


def test_every_setting_is_written_once_with_its_closure(tiny):
    out, result = tiny
    assert json.loads((out / "analytic_attack_peeling.json").read_text())["rows"] == \
        json.loads(json.dumps(result["rows"]))
    # the default tolerance in float32 and float64, in float32 without the rounding-aware
    # grouping, then each other tolerance in float32 (1e-3, the default, is not run twice)
    assert [(r["state"], r["batch_size"], r["precision"], r["peel_tolerance"],
             r["rounding_aware"]) for r in result["rows"]] == [
        (s, b, p, t, a) for s in ("initial", "trained") for b in (1, 4)
        for p, t, a in (("float32", 1e-3, True), ("float64", 1e-3, True),
                        ("float32", 1e-3, False), ("float32", 1e-2, True))]
    md = (out / "analytic_attack_peeling.md").read_text()
    for r in result["rows"]:
        assert 0 <= r["recovered"] <= r["examples"] == 2 * r["batch_size"]
        assert r["recovered"] == sum(r["recovered_per_victim"])
        assert r["victims_short"] == sum(n < r["batch_size"] for n in r["recovered_per_victim"])
        assert 0 <= r["victims_short_with_unpeeled_group"] <= r["victims_short"]
        assert r["unpeeled_groups"] >= 0
        same = [q for q in result["rows"]
                if (q["state"], q["batch_size"]) == (r["state"], r["batch_size"])]
        assert {q["closure"] for q in same} == {r["closure"]}  # from the activations alone
        assert (f"| {r['state']} | {r['batch_size']} | {r['precision']} | "
                f"{'yes' if r['rounding_aware'] else 'no'} | {r['peel_tolerance']:g} | {r['recovered']}/{r['examples']} | "
                f"{r['closure']} | {r['peeled']} | {r['false_exact']} | {r['unpeeled_groups']} | "
                f"{r['victims_short']} ({r['victims_short_with_unpeeled_group']}) |") in md
    assert not jax.config.jax_enable_x64  # the float64 rows leave x64 off behind them


def test_one_example_is_read_off_in_either_precision(tiny):
    _, result = tiny
    for r in result["rows"]:
        if r["batch_size"] == 1:
            assert r["recovered"] == r["examples"] and r["false_exact"] == 0, r


@pytest.mark.parametrize("argv,message", [
    (["--victims", "0"], "--victims must be in 1..1000"),
    (["--batch-sizes", "0"], "--batch-sizes and --train-examples must be >= 1"),
    (["--peel-tolerances", "0"], "--peel-tolerances must lie in"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv + ["--out", "unused"])
    assert message in capsys.readouterr().err
