"""benchmarks/diagnose_mia_im2col: the two convolution paths and the restored limit."""

import jax
import numpy as np
import pytest

from benchmarks import diagnose_mia_im2col as diag
from fedsim import models


@pytest.fixture
def mia_args():
    model = models.build_model("lenet5_1998", 10)
    params = models.init_params(model, (32, 32, 1), jax.random.key(0))
    rng = np.random.default_rng(0)
    x = rng.random((8, 32, 32, 1), dtype=np.float32)
    y = rng.integers(0, 10, 8)
    return (models.make_apply_fn(model), params, x[:4], y[:4], x[4:], y[4:],
            jax.random.split(jax.random.key(1), 2), 5, 10)


def test_feature_difference_compares_both_paths_and_restores_the_limit(mia_args):
    before = models.IM2COL_MAX_BATCH
    f = diag.feature_difference(mia_args)
    assert models.IM2COL_MAX_BATCH == before
    assert f["examples"] == 4
    # Same maths, different rounding: tiny but (as a rule) not exactly zero.
    assert f["max_abs_difference"] < 1e-4 * max(f["max_abs_feature"], 1.0)


def test_learned_auc_restores_the_limit_when_the_attack_fails(mia_args, monkeypatch):
    before = models.IM2COL_MAX_BATCH

    def boom(*a, **k):
        assert models.IM2COL_MAX_BATCH == 0  # the path under test is in force
        raise RuntimeError("attack failed")

    monkeypatch.setattr(diag.tan, "mia_aucs", boom)
    with pytest.raises(RuntimeError, match="attack failed"):
        diag.learned_auc(mia_args, jax.random.key(2)[None], 0)
    assert models.IM2COL_MAX_BATCH == before


def test_keys_must_give_a_spread(capsys):
    with pytest.raises(SystemExit):
        diag.main(["--keys", "1"])
    assert "--keys must be >= 2" in capsys.readouterr().err
