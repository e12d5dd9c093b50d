"""Checks of attacks/acceptance.py (the acceptance experiments' setup)."""

from types import SimpleNamespace

import numpy as np
import pytest

from attacks import acceptance
from attacks.api import Reconstruction


def test_victims_hold_consecutive_disjoint_batches():
    """Kills A1 (``fedsgd_observations``: ``lo = first + v·B`` → ``first + v``).

    Reference: the docstring ("Victim v holds training images
    [first + v·B, first + (v+1)·B)"), by numpy slicing: with B = 2, victims 0,
    1, 2 from index 1 hold images 1–2, 3–4, 5–6, and their uploads are
    those batches' gradients (victim 1's differs from the overlapping 2–3's).
    """
    rng = np.random.default_rng(0)
    ds = SimpleNamespace(x_train=rng.uniform(0, 1, (9, 4, 4, 1)).astype(np.float32),
                         y_train=np.arange(9) % 3, num_classes=3, input_shape=(4, 4, 1))
    obs, xs, ys = acceptance.fedsgd_observations(ds, "mlp", 3, init_seed=0, batch_size=2,
                                                 first_index=1)
    for v in range(3):
        np.testing.assert_array_equal(xs[v], ds.x_train[1 + 2 * v:3 + 2 * v])
        np.testing.assert_array_equal(ys[v], ds.y_train[1 + 2 * v:3 + 2 * v])
        assert obs[v].batch_size == 2


def test_min_psnr_is_the_worst_victims_psnr():
    """Kills A2 (``attack_and_score``: ``min_psnr`` taken as the max).

    Reference: PSNR = 10·log10(1/MSE) (attacks/metrics.py docstring) per
    victim in numpy; ``min_psnr`` is the smallest, ``mean`` the average.
    """
    rng = np.random.default_rng(1)
    xs = [rng.uniform(0.2, 0.8, (1, 4, 4, 1)).astype(np.float32) for _ in range(3)]
    offsets = [0.01, 0.1, 0.05]

    def fake_run_many(observations, config, key):
        return [Reconstruction(x=x + d, labels=np.zeros(1, np.int32), loss=0.0)
                for x, d in zip(xs, offsets)]

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(acceptance.ATTACKS, "fake", fake_run_many)
        out = acceptance.attack_and_score("fake", [None] * 3, xs, [np.zeros(1, np.int32)] * 3,
                                          {}, seed=0)
    psnrs = [10 * np.log10(1 / np.mean(((x + d).astype(np.float32) - x) ** 2))
             for x, d in zip(xs, offsets)]
    assert out["min_psnr"] == pytest.approx(min(psnrs), rel=1e-4)
    assert out["mean"]["psnr"] == pytest.approx(np.mean(psnrs), rel=1e-4)
