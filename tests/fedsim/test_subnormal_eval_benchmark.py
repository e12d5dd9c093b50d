"""benchmarks/subnormal_eval_cpu.py: its variants, its child process and its output."""

import json

import pytest

from benchmarks import subnormal_eval_cpu as bench


def test_rejects_non_positive_sizes(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--repeats", "0"])
    assert "--repeats and --examples must be >= 1" in capsys.readouterr().err


def test_variants_hold_what_they_name():
    r = bench.measure(repeats=1, examples=4)
    share = r["mean_subnormal_share_of_kernels"]
    # The initial and the scaled weights hold no subnormal kernel entry (x 1e-13 keeps
    # weights normal; the activations become subnormal); half of each kernel is.
    assert share[bench.VARIANTS[0]] == 0.0 and share[bench.VARIANTS[1]] == 0.0
    assert share[bench.VARIANTS[2]] == pytest.approx(0.5, abs=0.02)
    assert set(r["median_s"]) == set(bench.VARIANTS)


@pytest.mark.slow
def test_writes_json_and_markdown_with_the_flush_to_zero_child(tmp_path):
    bench.main(["--repeats", "1", "--examples", "4", "--out", str(tmp_path)])
    out = json.loads((tmp_path / "subnormal_eval_cpu.json").read_text())
    assert out["flush_to_zero"]["xla_flags"].endswith(bench.FTZ_FLAGS)
    assert set(out["flush_to_zero"]["median_s"]) == set(bench.VARIANTS)
    assert "| initial weights |" in (tmp_path / "subnormal_eval_cpu.md").read_text()
