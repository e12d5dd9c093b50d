"""benchmarks/random_draw_compile_cpu.py: what it compiles, its bit check and its output."""

import json

import pytest

from benchmarks import random_draw_compile_cpu as bench


def test_both_forms_are_compiled_and_give_the_same_bits():
    r = bench.measure(shapes=[(3, 2)], tree_shapes=[(2, 2), (3,)])
    assert set(r["seconds"]) == {"(3, 2)", "LeNet-5 tree"}
    for seconds in r["seconds"].values():
        assert set(seconds) == set(bench.FORMS) and all(s > 0 for s in seconds.values())
    assert r["same_bits"] == {"(3, 2)": True, "LeNet-5 tree": True}


def test_the_bit_check_can_fail(monkeypatch):
    # A flat form that draws other values is caught, not reported as the same bits.
    import jax

    real = bench._draw
    monkeypatch.setattr(bench, "_draw", lambda form, shape: (
        (lambda key: real("multi-dim", shape)(jax.random.fold_in(key, 1)))
        if form == "flat" else real(form, shape)))
    r = bench.measure(shapes=[(3, 2)], tree_shapes=[(2,)])
    assert r["same_bits"] == {"(3, 2)": False, "LeNet-5 tree": False}


def test_rejects_zero_passes(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--passes", "0"])
    assert "--passes must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["nolabel", "=/tmp", "x={missing}", "this={root}"])
def test_a_bad_baseline_is_named(spec, tmp_path, capsys):
    spec = spec.format(missing=tmp_path / "missing", root=bench.ROOT)
    with pytest.raises(SystemExit):
        bench.main(["--baseline", spec, "--out", str(tmp_path)])
    assert f"--baseline {spec!r}" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before measuring anything


@pytest.mark.slow
def test_writes_json_and_markdown_from_child_processes(tmp_path):
    bench.main(["--passes", "1", "--shapes", "[[3, 2]]", "--out", str(tmp_path),
                "--baseline", f"again={bench.ROOT}"])
    out = json.loads((tmp_path / f"{bench.NAME}.json").read_text())
    assert out["same_bits_everywhere"] is True
    # Each setting ran in its own process with what it names.
    for (partitionable, level) in bench.SETTINGS:
        run = out["runs"][bench._label(partitionable, level)][0]
        assert run["partitionable"] is partitionable
        assert run["xla_flags"].endswith(f"--xla_backend_optimization_level={level}")
    md = (tmp_path / f"{bench.NAME}.md").read_text()
    assert "| (3, 2) | partitionable on, level 3 |" in md and "Same bits" in md
    # The library's programs, compiled from this tree and from the baseline.
    assert set(out["library_median_s"]) == {"this", "again"}
    programs = {"attack (uniform dummies)", "attack (gaussian dummies)", "gumbel (LeNet-5)"}
    assert set(out["library_median_s"]["again"]) == programs
    assert "| gumbel (LeNet-5) |" in md and "this / again" in md
