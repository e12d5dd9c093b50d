"""benchmarks/mask_selection_cpu.py: both selections equal the numpy reference; its output."""

import json

import jax
import numpy as np
import pytest

from benchmarks import mask_selection_cpu as bench
from defenses.pruning.masks import flatten


def test_rejects_bad_sizes(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--image-sizes", "2"])
    assert "--image-sizes must be >= 4" in capsys.readouterr().err


def test_selections_equal_the_numpy_reference_and_the_withheld_count():
    update = bench.conv2_update(4)
    ref = bench.numpy_reference(update)
    flat_abs = np.abs(np.asarray(flatten(update)))
    n_shared = int(np.sum(flat_abs != 0))
    assert 0.55 < n_shared / flat_abs.size < 0.65  # ZERO_SHARE of 0.4
    assert int(np.sum(ref == 0)) == round(bench.RATE * n_shared)
    # The withheld ones are the largest shared |Δ|.
    assert flat_abs[ref == 0].min() >= flat_abs[(ref == 1) & (flat_abs != 0)].max()
    for name, f in bench.selections().items():
        np.testing.assert_array_equal(np.asarray(flatten(jax.jit(f)(update))), ref, err_msg=name)


def test_writes_json_and_markdown(tmp_path):
    bench.main(["--repeats", "1", "--clients", "2", "--image-sizes", "4", "--out", str(tmp_path)])
    out = json.loads((tmp_path / "mask_selection_cpu.json").read_text())
    (size,) = out["sizes"]
    assert size["identical_to_numpy_argsort"] == {"flat": True, "leaf-wise": True}
    assert set(size["median_s"]) == {"flatten (XLA concatenate)", "flat, 1 client",
                                     "flat, 2 clients vmapped", "leaf-wise, 1 client",
                                     "leaf-wise, 2 clients vmapped"}
    assert "| 4×4 |" in (tmp_path / "mask_selection_cpu.md").read_text()
