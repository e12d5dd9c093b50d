"""Reconstruction-quality metrics, one stated definition each.

All image metrics take float arrays in [0, 1] of shape [..., H, W, C]
(NHWC, leading dims batched). Batch reconstructions are matched to their
targets with :func:`match_reconstructions` (Hungarian assignment on MSE)
before scoring, because gradient inversion recovers a batch only up to a
permutation.

Definitions:
  * MSE: mean over pixels and channels of (x − x̂)².
  * PSNR: 10·log10(1 / MSE) in dB for data range 1; identical images give
    :data:`PSNR_CAP` (100 dB) instead of ∞ so means stay finite.
  * SSIM: the structural similarity index of Wang et al. (2004) with an 11×11
    Gaussian window (σ = 1.5), K1 = 0.01, K2 = 0.03, data range 1, via
    ``dm_pix.ssim`` (true SSIM, not CW-SSIM), averaged over channels.
  * NMI: paper 002 footnote 1: values binned into ``bins`` equal-width bins on
    [0, 1], I(U;V) = Σᵢⱼ |Uᵢ∩Vⱼ|/N · log(N|Uᵢ∩Vⱼ| / (|Uᵢ||Vⱼ|)),
    NMI = I / mean(H(U), H(V)) (arithmetic mean, natural log). This plug-in
    estimate is biased upwards when the pixels are few for the bins' cells
    (N = B·H·W·C against bins² cells): two unrelated 16×16 images score
    ~0.6–0.9, and that floor falls as B or the image grows
    (benchmarks/results/nmi_chance_floor.md). Compare NMIs only at equal N.
  * AMI: the same contingency table's mutual information adjusted for chance
    (Vinh, Epps & Bailey 2010; scikit-learn's ``adjusted_mutual_info_score``,
    arithmetic mean): (I − E[I]) / (mean(H(U), H(V)) − E[I]) with E[I] the
    expectation under random pairings of the same histograms. ≈ 0 for
    unrelated images at any N, 1 for a bijection of the levels. Not in paper
    002; reported beside NMI so that its chance floor can be read off.
  * label accuracy: fraction of labels equal, after matching.
"""

from __future__ import annotations

from typing import NamedTuple

import dm_pix
import jax.numpy as jnp
import numpy as np
from scipy.optimize import linear_sum_assignment

from fedsim.x64 import x64_off

PSNR_CAP = 100.0


def _check_pair(x, y, name: str):
    for what, v in (("first", x), ("second", y)):
        kind = np.asarray(v).dtype
        if np.issubdtype(kind, np.integer) or np.issubdtype(kind, np.bool_):
            # uint8 images in 0..255 scored as [0, 1] ones: PSNR −22 dB for a 26 dB pair.
            raise ValueError(f"{name}: the {what} image array is {kind}; the metrics take "
                             f"float images in [0, 1] (divide 0..255 images by 255)")
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    if x.shape != y.shape:
        raise ValueError(f"{name}: shapes differ: {x.shape} vs {y.shape}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError(f"{name}: inputs contain NaN or inf")
    return x, y


def mse(x, y) -> np.ndarray:
    """Per-image mean squared error over [H, W, C] (leading dims kept)."""
    x, y = _check_pair(x, y, "mse")
    if x.ndim < 3:
        raise ValueError(f"mse: expected [..., H, W, C] images, got shape {x.shape}")
    return np.mean((x - y) ** 2, axis=(-3, -2, -1))


def psnr(x, y, cap: float = PSNR_CAP) -> np.ndarray:
    """Per-image PSNR in dB for images in [0, 1], capped at ``cap``."""
    m = mse(x, y)
    with np.errstate(divide="ignore"):
        val = 10.0 * np.log10(1.0 / np.maximum(m, 0.0))
    return np.minimum(val, cap)


def ssim(x, y) -> np.ndarray:
    """Per-image SSIM (Wang et al. 2004; dm-pix, 11×11 Gaussian window, σ 1.5).

    Images smaller than 11 pixels on a side use a window of the image size.
    """
    x, y = _check_pair(x, y, "ssim")
    if x.ndim < 3:
        raise ValueError(f"ssim: expected [..., H, W, C] images, got shape {x.shape}")
    if x.shape[-1] > 4 and x.shape[-3] <= 4:
        # Read as NHWC, an NCHW image is C rows high with W channels: SSIM's
        # window shrinks to its C × H and the score moves (0.956 for 0.990).
        raise ValueError(f"ssim: shape {x.shape} looks like [..., C, H, W] (NCHW); the "
                         f"metrics take [..., H, W, C] (NHWC) images")
    size = int(min(11, x.shape[-3], x.shape[-2]))
    with x64_off():  # under jax_enable_x64 dm-pix would filter the float32 images in float64
        val = dm_pix.ssim(jnp.asarray(x), jnp.asarray(y), max_val=1.0, filter_size=size)
    return np.asarray(val, np.float64)


def _levels(x, y, bins: int, name: str):
    """x and y clipped to [0, 1] and binned into ``bins`` equal-width levels."""
    if int(bins) < 2:
        raise ValueError(f"{name}: bins must be >= 2, got {bins}")
    x, y = _check_pair(x, y, name)
    u = np.minimum((np.clip(x.ravel(), 0, 1) * bins).astype(np.int64), bins - 1)
    v = np.minimum((np.clip(y.ravel(), 0, 1) * bins).astype(np.int64), bins - 1)
    return u, v


def nmi(x, y, bins: int = 256) -> float:
    """Normalised mutual information of two arrays (paper 002, footnote 1).

    Values are clipped to [0, 1] and binned into ``bins`` equal-width bins; the
    entropies and MI use natural logs; NMI = I(U;V) / mean(H(U), H(V)).
    Two constant arrays have H = 0; NMI is then defined as 1 if both are the
    same constant bin and 0 otherwise. Biased upwards for few pixels per
    cell (module docstring); :func:`ami` is its chance-adjusted companion.
    """
    u, v = _levels(x, y, bins, "nmi")
    n = u.size
    joint = np.zeros((bins, bins), np.float64)
    np.add.at(joint, (u, v), 1.0)
    pu, pv, pj = joint.sum(1) / n, joint.sum(0) / n, joint / n
    nz = pj > 0
    mi = float(np.sum(pj[nz] * np.log(pj[nz] / np.outer(pu, pv)[nz])))
    hu = float(-np.sum(pu[pu > 0] * np.log(pu[pu > 0])))
    hv = float(-np.sum(pv[pv > 0] * np.log(pv[pv > 0])))
    denom = 0.5 * (hu + hv)
    if denom == 0.0:
        return float(np.array_equal(u, v))
    return mi / denom


def ami(x, y, bins: int = 256) -> float:
    """Mutual information of :func:`nmi`'s binned levels, adjusted for chance.

    scikit-learn's ``adjusted_mutual_info_score`` (arithmetic mean) on the
    same ``bins`` levels as :func:`nmi`: ≈ 0 in expectation for unrelated
    arrays whatever their size (NMI's floor is not), 1 when the levels
    determine each other; it can be slightly negative. Both arrays constant:
    1 (scikit-learn's convention for identical one-cluster labelings).
    """
    # Imported here: the GPU machines' image has no scikit-learn, and every
    # other metric (and the attacks that import this module) works without it.
    from sklearn.metrics import adjusted_mutual_info_score

    u, v = _levels(x, y, bins, "ami")
    return float(adjusted_mutual_info_score(u, v, average_method="arithmetic"))


def label_accuracy(pred, true) -> float:
    """Fraction of predicted labels equal to the true ones."""
    pred, true = np.asarray(pred), np.asarray(true)
    if pred.shape != true.shape:
        raise ValueError(f"label_accuracy: shapes differ: {pred.shape} vs {true.shape}")
    return float(np.mean(pred == true)) if pred.size else float("nan")


def multiset_label_accuracy(pred, true) -> float:
    """|multiset(pred) ∩ multiset(true)| / len(true): order-free label accuracy."""
    pred, true = np.asarray(pred).ravel(), np.asarray(true).ravel()
    if pred.shape != true.shape:
        raise ValueError(f"multiset_label_accuracy: shapes differ: {pred.shape} vs {true.shape}")
    if not true.size:
        return float("nan")
    k = int(max(pred.max(), true.max())) + 1
    return float(np.minimum(np.bincount(pred, minlength=k), np.bincount(true, minlength=k)).sum()
                 / true.size)


def match_reconstructions(x_rec, x_true) -> np.ndarray:
    """Hungarian matching of a batch of reconstructions to targets on MSE.

    Args:
      x_rec: [B, H, W, C] reconstructions.
      x_true: [B, H, W, C] targets.

    Returns:
      int [B] permutation ``perm`` such that ``x_rec[perm[i]]`` is matched to
      ``x_true[i]`` (minimum total MSE).
    """
    x_rec, x_true = _check_pair(x_rec, x_true, "match_reconstructions")
    cost = np.mean((x_true[:, None] - x_rec[None]) ** 2, axis=tuple(range(2, x_rec.ndim + 1)))
    rows, cols = linear_sum_assignment(cost)
    perm = np.empty(len(rows), np.int64)
    perm[rows] = cols
    return perm


class BatchScore(NamedTuple):
    """Scores of one victim's batch after matching.

    MSE, PSNR and SSIM are means of per-image values over the batch; NMI and
    AMI are computed once over the matched batch's pooled pixels (paper 002
    scores the batch as one pair of vectors), so they depend on the batch size.
    """

    mse: float
    psnr: float
    ssim: float
    nmi: float
    label_acc: float
    ami: float = float("nan")

    def as_dict(self) -> dict:
        return self._asdict()


def score_batch(x_rec, x_true, labels_rec=None, labels_true=None) -> BatchScore:
    """Match reconstructions to targets (Hungarian on MSE), then score.

    Labels are compared as multisets (:func:`multiset_label_accuracy`);
    label accuracy is NaN when labels are not given. The reconstructions are
    clipped to [0, 1] first; the targets must lie in [0, 1].

    Raises:
      ValueError: for integer images, shapes that differ, NaN, or targets
        outside [0, 1].
    """
    _check_pair(x_rec, x_true, "score_batch")  # dtypes, shapes, NaN
    x_rec = np.clip(np.asarray(x_rec, np.float32), 0.0, 1.0)
    x_true = np.asarray(x_true, np.float32)
    if x_true.min() < -1e-6 or x_true.max() > 1.0 + 1e-6:
        # The reconstruction is clipped to [0, 1]; a target outside it (0..255,
        # standardised) would be scored against it as if it were in range.
        raise ValueError(f"score_batch: the target images lie in [{x_true.min():.4g}, "
                         f"{x_true.max():.4g}], not [0, 1] (standardised or 0..255 images? "
                         f"score them in [0, 1])")
    perm = match_reconstructions(x_rec, x_true)
    xm = x_rec[perm]
    if labels_rec is not None and labels_true is not None:
        # Label inference recovers a batch's label multiset, not an order:
        # score the size of the multiset intersection over the batch size.
        lacc = multiset_label_accuracy(labels_rec, labels_true)
    else:
        lacc = float("nan")
    return BatchScore(float(np.mean(mse(xm, x_true))), float(np.mean(psnr(xm, x_true))),
                      float(np.mean(ssim(xm, x_true))), nmi(xm, x_true), lacc, ami(xm, x_true))
