"""benchmarks/init_time_cpu.py: one real child per way, its readings, its argument errors."""

import pytest

from benchmarks.init_time_cpu import main, markdown, run_child, same_bits, summarize


def test_a_child_initialises_every_way_to_the_same_bits_and_jit_compiles_once():
    eager = run_child("mlp", "16x16x1", "eager", None)
    jitted = run_child("mlp", "16x16x1", "jit", None)
    default = run_child("mlp", "16x16x1", "jit_default", None)
    assert eager["digest"] == jitted["digest"] == default["digest"]
    for one in (jitted, default):  # no persistent cache: the one program of the init
        assert one["compiles"] == 1 and one["compile_seconds"] > 0
    assert eager["compiles"] > 1  # an initializer and layer at a time
    assert eager["seconds"] > 0 and jitted["seconds"] > 0


def _row(way, cache, secs, p=0, digest="d", compiles=1, model="mlp", compile_s=0.0):
    return {"pass": p, "model": model, "shape": "16x16x1", "way": way, "cache": cache,
            "seconds": secs, "compiles": compiles, "compile_seconds": compile_s,
            "digest": digest, "load_before": 0.0}


def test_summary_takes_medians_per_way_and_cache_and_same_bits_per_model():
    rows = [_row("eager", "off", s, p, compiles=9) for p, s in enumerate((3.0, 5.0, 4.0))]
    rows += [_row("jit", "off", s, p) for p, s in enumerate((1.0, 2.0, 1.5))]
    rows += [_row("eager", "warm", 4.0, digest="other", model="lenet5"),
             _row("jit", "warm", 0.5, model="lenet5")]
    out = {(s["model"], s["cache"]): s for s in summarize(rows)}
    off = out[("mlp", "off")]
    assert (off["eager_s"], off["jit_s"], off["n"]) == (4.0, 1.5, 3)
    assert off["jit_over_eager"] == pytest.approx(1.5 / 4.0)
    assert (off["eager_compiles"], off["jit_compiles"]) == (9, 1)
    bits = same_bits(rows)
    assert bits == {"mlp 16x16x1": True, "lenet5 16x16x1": False}
    text = markdown({"passes": 3, "device": "cpu", "commit": "abc1234def", "dirty": False,
                     "seconds": 12.0, "summary": summarize(rows), "same_bits": bits})
    assert "| mlp | 16x16x1 | off | 4.00 | 1.50 | 0.38 | 9 | 1 |" in text  # no jit_default rows
    assert "NO:" in text and "lenet5 16x16x1" in text


def test_summary_sets_jit_beside_the_same_program_at_xlas_default_options():
    rows = [_row("eager", "off", 4.0, compiles=9), _row("jit", "off", 1.0, compile_s=0.75)]
    rows += [_row("jit_default", "off", secs, p, compile_s=c)
             for p, (secs, c) in enumerate(((5.0, 4.5), (3.0, 2.5), (4.0, 3.5)))]
    (off,) = summarize(rows)
    assert (off["jit_default_s"], off["jit_default_compile_s"]) == (4.0, 3.5)
    assert off["jit_over_jit_default"] == pytest.approx(1.0 / 4.0)
    assert off["jit_compile_s"] == 0.75
    text = markdown({"passes": 3, "device": "cpu", "commit": "abc1234def", "dirty": False,
                     "seconds": 12.0, "summary": [off], "same_bits": same_bits(rows)})
    assert ("| mlp | 16x16x1 | off | 4.00 | 1.00 | 4.00 | 0.25 | 0.25 | 0.75 | 3.50 | 9 | 1 |"
            in text)
    assert "yes, every model." in text


@pytest.mark.parametrize("argv, message", [
    (["--models", "lenet5"], "expected NAME:HxWxC"),
    (["--models", "lenet5:28x28"], "expected NAME:HxWxC"),
    (["--models", "lenet5:28x0x1"], "expected NAME:HxWxC"),
    (["--models", "nope:28x28x1"], "unknown model 'nope'"),
    (["--passes", "0"], "--passes must be >= 1"),
])
def test_bad_arguments_are_named_before_anything_runs(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit):
        main([*argv, "--out", str(tmp_path)])
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
