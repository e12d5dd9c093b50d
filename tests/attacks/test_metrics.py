"""Metrics on known pairs."""

import numpy as np
import pytest

from attacks import metrics as M


def _imgs(seed=0, n=3, size=16):
    return np.random.default_rng(seed).random((n, size, size, 1)).astype(np.float32)


def test_identical_images():
    x = _imgs()
    np.testing.assert_array_equal(M.mse(x, x), 0.0)
    np.testing.assert_array_equal(M.psnr(x, x), M.PSNR_CAP)
    np.testing.assert_allclose(M.ssim(x, x), 1.0, atol=1e-6)
    assert M.nmi(x, x) == pytest.approx(1.0)


def test_mse_psnr_known_value():
    x = np.zeros((1, 8, 8, 1), np.float32)
    y = np.full_like(x, 0.1)
    np.testing.assert_allclose(M.mse(x, y), 0.01, rtol=1e-6)
    np.testing.assert_allclose(M.psnr(x, y), 20.0, rtol=1e-5)


def test_ssim_constant_images_known_value():
    # Constant images: variances and covariance are 0, so SSIM reduces to the
    # luminance term (2ab + C1) / (a² + b² + C1), C1 = (0.01·1)².
    a, b = 0.2, 0.6
    x = np.full((1, 16, 16, 1), a, np.float32)
    y = np.full((1, 16, 16, 1), b, np.float32)
    c1 = 0.01 ** 2
    expected = (2 * a * b + c1) / (a * a + b * b + c1)
    np.testing.assert_allclose(M.ssim(x, y), expected, rtol=1e-4)


def test_ssim_drops_with_noise():
    x = _imgs(1, 1, 28)
    noisy = np.clip(x + 0.3 * np.random.default_rng(2).standard_normal(x.shape), 0, 1)
    assert M.ssim(x, noisy)[0] < 0.9


def test_ssim_is_the_same_under_x64():
    # dm-pix filters in the default float: under jax_enable_x64 the float32
    # images were filtered in float64 and scored otherwise.
    import jax

    x = _imgs(3)
    y = np.clip(x + 0.05 * np.random.default_rng(4).standard_normal(x.shape), 0, 1)
    plain = M.ssim(x, y)
    with jax.enable_x64(True):
        wide = M.ssim(x, y)
    np.testing.assert_array_equal(wide, plain)


def test_nmi_independent_is_small_and_bijection_is_one():
    rng = np.random.default_rng(3)
    u = rng.random(20000)
    assert M.nmi(u, rng.random(20000), bins=16) < 0.02
    # A bin-wise bijection (1 − u) keeps all information.
    assert M.nmi(u, 1.0 - u + 1e-7, bins=16) > 0.95


def test_nmi_equals_an_independent_contingency_table_nmi():
    """Against scikit-learn's normalized_mutual_info_score on the same levels."""
    from sklearn.metrics import normalized_mutual_info_score

    rng = np.random.default_rng(5)
    x = rng.random((2, 8, 8, 1))
    y = np.clip(x + rng.normal(0, 0.1, x.shape), 0, 1)
    for bins in (4, 16, 256):
        u = np.minimum((x.ravel().astype(np.float32) * bins).astype(int), bins - 1)
        v = np.minimum((y.ravel().astype(np.float32) * bins).astype(int), bins - 1)
        assert M.nmi(x, y, bins) == pytest.approx(
            normalized_mutual_info_score(u, v, average_method="arithmetic"), abs=1e-12)


def test_nmi_has_a_chance_floor_that_ami_removes():
    """Unrelated 16×16 images: NMI far above 0 and falling with the batch; AMI ≈ 0.

    The plug-in NMI's bias grows with the cells per pixel (256² cells for 256
    pixels at B = 1), so its value for unrelated images depends on B. AMI
    subtracts the expected MI under random pairings; a reconstruction that
    tracks the target keeps AMI clearly above that.
    """
    rng = np.random.default_rng(6)
    nmi_floor, ami_floor = {}, {}
    for b in (1, 8, 32):
        pairs = [(rng.random((b, 16, 16, 1)), rng.random((b, 16, 16, 1))) for _ in range(5)]
        nmi_floor[b] = np.mean([M.nmi(x, y) for x, y in pairs])
        ami_floor[b] = np.mean([M.ami(x, y) for x, y in pairs])
    assert nmi_floor[1] > 0.8 and nmi_floor[1] > nmi_floor[8] > nmi_floor[32] > 0.3
    for b in (1, 8, 32):
        assert abs(ami_floor[b]) < 0.01
    x = rng.random((8, 16, 16, 1))
    close = np.clip(x + rng.normal(0, 0.01, x.shape), 0, 1)
    assert M.ami(close, x) > 0.2
    assert M.ami(x, x) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="bins"):
        M.ami(x, x, bins=1)


def test_batch_scores_nmi_and_ami_over_the_pooled_batch():
    rng = np.random.default_rng(7)
    x = rng.random((3, 8, 8, 1)).astype(np.float32)
    rec = np.clip(x + rng.normal(0, 0.05, x.shape), 0, 1).astype(np.float32)[[2, 0, 1]]
    s = M.score_batch(rec, x)
    matched = rec[[1, 2, 0]]
    assert s.nmi == pytest.approx(M.nmi(matched, x))
    assert s.ami == pytest.approx(M.ami(matched, x))


def test_hungarian_matching_recovers_permutation():
    x = _imgs(4, 5)
    perm = np.array([3, 0, 4, 1, 2])
    rec = x[perm]
    got = M.match_reconstructions(rec, x)
    np.testing.assert_array_equal(rec[got], x)
    s = M.score_batch(rec, x, [1, 2, 2], [2, 1, 3])
    assert s.mse == 0.0 and s.psnr == M.PSNR_CAP
    assert s.label_acc == pytest.approx(2 / 3)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="shapes differ"):
        M.mse(np.zeros((1, 4, 4, 1)), np.zeros((1, 4, 5, 1)))
    with pytest.raises(ValueError, match="NaN"):
        M.psnr(np.full((1, 4, 4, 1), np.nan), np.zeros((1, 4, 4, 1)))


def test_images_the_metrics_would_misread_are_refused_by_name():
    a, b = _imgs(1), _imgs(2)
    # 0..255 integer images: PSNR came out −22 dB and NMI 0.13 for a pair that
    # scores ~26 dB and ~0.7 in [0, 1].
    u8 = lambda x: (x * 255).astype(np.uint8)  # noqa: E731
    for fn in (M.mse, M.psnr, M.ssim, M.nmi, M.ami):
        with pytest.raises(ValueError, match=r"image array is uint8; the metrics take float "
                                             r"images in \[0, 1\]"):
            fn(u8(a), u8(b))
    with pytest.raises(ValueError, match="image array is bool"):
        M.nmi(a > 0.5, b > 0.5)
    # NCHW read as NHWC: SSIM's window shrank to C × H and the score moved.
    big = np.random.default_rng(3).random((2, 16, 16, 3)).astype(np.float32)
    nchw = lambda x: x.transpose(0, 3, 1, 2)  # noqa: E731
    with pytest.raises(ValueError, match=r"looks like \[\.\.\., C, H, W\] \(NCHW\)"):
        M.ssim(nchw(big), nchw(big[::-1]))
    with pytest.raises(ValueError, match=r"mse: expected \[\.\.\., H, W, C\] images"):
        M.psnr(a.reshape(3, -1), b.reshape(3, -1))
    # Targets outside [0, 1]: a clipped reconstruction was scored against them.
    with pytest.raises(ValueError, match=r"score_batch: the target images lie in \[[0-9.]+, 25[0-9.]*\], not \[0, 1\]"):
        M.score_batch(a, b * 255)
    with pytest.raises(ValueError, match=r"score_batch: the target images lie in \[-1"):
        M.score_batch(a, (b - 0.5) * 4)
    # In range, as before.
    perm = M.match_reconstructions(a, b)
    assert M.score_batch(a, b).psnr == pytest.approx(float(np.mean(M.psnr(a[perm], b))))
