"""benchmarks/dp_clip_cpu.py: its variants agree with float64, and its output."""

import json

import jax
import numpy as np
import pytest

from benchmarks import dp_clip_cpu as bench


def test_rejects_bad_cases(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--case", "mlp", "2", "4"])
    assert "SIZE >= 4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--case", "mlp", "eight", "4"])
    assert "integer SIZE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--case", "nosuchmodel", "8", "4"])
    assert "unknown model(s) ['nosuchmodel']" in capsys.readouterr().err


def test_every_variant_equals_the_float64_clipped_sum():
    keys = jax.random.split(jax.random.key(0), 3)
    # Rows both above and below C = 1, three leaves of different shapes.
    tree = {"a": 0.5 * jax.random.normal(keys[0], (6, 3, 4)),
            "b": 0.05 * jax.random.normal(keys[1], (6, 20)),
            "c": jax.random.normal(keys[2], (6, 2))}
    mask = jax.numpy.ones(6)
    for name, f in bench.variants().items():
        ref = bench.float64_reference(tree, "flat" if name.startswith("flat") else "per_layer")
        np.testing.assert_allclose(np.asarray(jax.jit(f)(tree, mask)), ref, rtol=1e-5,
                                   atol=1e-6, err_msg=name)
    # The two modes differ on this tree, so each variant is checked against its own mode.
    assert not np.allclose(bench.float64_reference(tree, "flat"),
                           bench.float64_reference(tree, "per_layer"), rtol=1e-3)


def test_writes_json_and_markdown(tmp_path):
    bench.main(["--repeats", "1", "--case", "mlp", "8", "4", "--out", str(tmp_path)])
    out = json.loads((tmp_path / "dp_clip_cpu.json").read_text())
    (case,) = out["cases"]
    assert (case["model"], case["batch"], case["params"]) == ("mlp", 4, 64 * 50 + 50 * 15 + 15 * 10)
    assert set(case["median_s"]) == {"per-example grads", *bench.VARIANTS}
    assert max(case["relative_error_vs_float64"].values()) < 1e-5
    assert "| mlp | 4,100 | 3 | 4 |" in (tmp_path / "dp_clip_cpu.md").read_text()
