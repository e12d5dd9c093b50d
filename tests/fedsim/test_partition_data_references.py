"""Partitions other than Dirichlet's share law, and the data loader's numbers.

Each test checks the code against a property stated in the module's docstring
or an independent numpy computation, never against a value the code produced.
"""

import gzip

import numpy as np
import pytest

from fedsim import data, partition
from fedsim.data import load_dataset


def test_shards_are_dealt_to_clients_at_random():
    """Kills ``assign = np.arange(num_shards).reshape(...)`` (shards dealt in label order).

    Reference: McMahan et al. 2017 §3 (and the ``shards`` docstring): the label-
    sorted shards are dealt to clients at random. With 10 balanced classes of 100
    examples, 50 clients and 2 shards each there are 10 shards per class, so a
    client's two shards come from one class with probability 9/99 only: about 45
    of the 50 clients hold two classes (Binomial(50, 90/99), sd 2). Dealt in label
    order, every client's two shards are neighbours of one class: none holds two.
    """
    labels = np.repeat(np.arange(10), 100)
    parts = partition.shards(labels, 50, 2, seed=0)
    two_classes = sum(len(np.unique(labels[p])) == 2 for p in parts)
    assert two_classes >= 35, two_classes


def test_shards_hold_a_random_subset_of_their_class():
    """Kills ``order = np.argsort(labels, kind="stable")`` (no shuffle inside a class).

    Reference: ``shards`` shuffles before its stable sort, so the 10 examples of
    a shard are a uniform 10-subset of their class's 100. Labels here are sorted
    by index, so a class's examples are 100 consecutive indices; the range of a
    uniform 10-subset of 100 has expectation 100·9/11 ≈ 82 (order statistics),
    while an unshuffled shard is 10 consecutive indices (range 9).
    """
    labels = np.repeat(np.arange(10), 100)
    parts = partition.shards(labels, 50, 2, seed=0)
    spans = [np.ptp(p[labels[p] == c]) for p in parts for c in np.unique(labels[p])]
    assert np.median(spans) > 50, np.median(spans)
    capped = partition.shards(labels, 50, 2, seed=0, examples_per_client=10)
    spans = [np.ptp(p[labels[p] == c]) for p in capped for c in np.unique(labels[p])]
    assert np.median(spans) > 20, np.median(spans)  # 5 of 100: expected range 100·4/6 ≈ 67


@pytest.mark.parametrize("seed", range(5))
def test_dirichlet_accepts_a_client_with_exactly_min_size_examples(seed):
    """Kills ``min(len(p) for p in out) > min_size`` (``>=`` made strict).

    Reference: the ``dirichlet`` docstring: it resamples until every client has
    *at least* ``min_size`` examples. Four examples of one class over two
    clients with ``min_size=2`` can only be two each; with α = 1 the share s₁ is
    uniform and the cut ⌊4·s₁⌋ is 2 with probability 1/4 a draw, so one of the
    100 draws gives it (all fail with probability 0.75¹⁰⁰). A strict test can
    never accept it and raises.
    """
    labels = np.zeros(4, dtype=np.int64)
    parts = partition.dirichlet(labels, 2, 1.0, seed, min_size=2)
    assert [len(p) for p in parts] == [2, 2]
    assert sorted(np.concatenate(parts).tolist()) == [0, 1, 2, 3]


def test_a_natural_subset_draws_distinct_ids():
    """Kills ``choice(ids, num_clients, replace=True)`` in ``natural``.

    Reference: the docstring: ``num_clients`` ids are *kept*, each id one
    client, so the subset's clients are distinct ids with disjoint examples. Five
    draws with replacement from six ids are all distinct with probability
    6!/6⁵ ≈ 0.09 only; 20 seeds find a repeat.
    """
    groups = np.repeat(np.arange(6), 3)
    for seed in range(20):
        parts = partition.natural(groups, 5, seed=seed)
        assert len(parts) == 5
        ids = [int(np.unique(groups[p])[0]) for p in parts]
        assert len(set(ids)) == 5, (seed, ids)
        allidx = np.concatenate(parts)
        assert len(np.unique(allidx)) == len(allidx) == 15


def test_pad_indices_keeps_the_first_n_max_examples_and_counts_them():
    """Kills ``counts.astype(np.int32)`` (counts not capped at n_max) and
    ``p[-min(len(p), n_max):]`` (the last examples kept).

    Reference: the ``pad_indices`` docstring: clients with more than ``n_max``
    examples keep their first ``n_max``; the counts are the examples in the
    matrix (the engine's FedAvg weights).
    """
    idx, counts = partition.pad_indices([np.array([9, 4, 7, 1, 3]), np.array([2, 8])], n_max=3)
    assert idx.tolist() == [[9, 4, 7], [2, 8, -1]]
    assert counts.tolist() == [3, 2]
    assert counts.tolist() == [int((row >= 0).sum()) for row in idx]


# --- data ---------------------------------------------------------------------


def test_normalisation_statistics_are_the_training_splits_pixel_moments():
    """Kills ``mean = ds.x_test.mean(...)`` and ``std = x_train.std(axis=(1, 2)).mean(0)``.

    Reference: the ``Dataset`` docstring: ``mean``/``std`` are the per-channel
    mean and std of ``x_train`` (the split the run keeps), i.e. over every
    pixel of every training image, here computed in float64 with numpy.
    """
    ds = load_dataset("synthetic", max_train=300, max_test=100, seed=0)
    pixels = ds.x_train.astype(np.float64).reshape(-1, ds.x_train.shape[-1])
    np.testing.assert_allclose(ds.mean, pixels.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(ds.std, pixels.std(axis=0), rtol=1e-5)


def test_max_train_and_max_test_keep_the_first_examples_with_their_labels():
    """Kills ``y_train=ds.y_train[-max_train:]`` and ``x_test/y_test[-max_test:]``.

    Reference: the ``load_dataset`` docstring: ``max_train`` (``max_test``) keeps
    only the *first* examples, so the subset is the full split's prefix, images
    and labels alike.
    """
    full = load_dataset("synthetic", seed=0)
    sub = load_dataset("synthetic", max_train=100, max_test=40, seed=0)
    np.testing.assert_array_equal(sub.x_train, full.x_train[:100])
    np.testing.assert_array_equal(sub.y_train, full.y_train[:100])
    np.testing.assert_array_equal(sub.x_test, full.x_test[:40])
    np.testing.assert_array_equal(sub.y_test, full.y_test[:40])


def test_max_train_keeps_the_natural_ids_of_the_examples_it_keeps(monkeypatch):
    """Kills ``groups=ds.groups`` (natural ids not cut with ``max_train``).

    Reference: ``Dataset.groups`` is one natural id per training example
    (``[N]``); after ``max_train`` it must be the kept examples' ids, else the
    ``natural`` partition deals out indices past N.
    """
    real = data.synthetic_dataset

    def with_groups(**kw):
        ds = real(**kw)
        return data.dataclasses.replace(ds, groups=np.arange(len(ds.y_train)) // 7)

    monkeypatch.setattr(data, "synthetic_dataset", with_groups)
    ds = load_dataset("synthetic", max_train=50, seed=0)
    np.testing.assert_array_equal(ds.groups, np.arange(50) // 7)


def test_synthetic_data_has_every_class_and_stays_in_the_unit_interval():
    """Kills ``rng.integers(0, num_classes - 1, n)`` and noise weight 0.3 -> 0.7.

    Reference: the module docstring: images are float32 in [0, 1], and the
    dataset has ``num_classes`` classes; 2,000 uniform labels over 10 classes
    leave one out with probability 10·0.9²⁰⁰⁰ ≈ 0.
    """
    ds = data.synthetic_dataset(seed=0)
    assert ds.x_train.min() >= 0.0 and ds.x_train.max() <= 1.0
    assert ds.x_test.min() >= 0.0 and ds.x_test.max() <= 1.0
    assert set(np.unique(ds.y_train).tolist()) == set(range(ds.num_classes)) == set(range(10))


def _write_idx(path, arr):
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def test_idx_images_are_their_bytes_over_255(tmp_path):
    """Kills ``/ 256.0`` in the IDX reader.

    Reference: the module docstring: images are float in [0, 1], so an unsigned
    byte v is v / 255 (255 -> 1.0, the brightest pixel).
    """
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (6, 28, 28)).astype(np.uint8)
    raw[0, 0, 0] = 255
    for stem in ("train", "t10k"):
        _write_idx(tmp_path / f"{stem}-images-idx3-ubyte.gz", raw)
        _write_idx(tmp_path / f"{stem}-labels-idx1-ubyte.gz", np.arange(6))
    ds = load_dataset("fashion_mnist", source="idx", data_dir=str(tmp_path))
    np.testing.assert_allclose(ds.x_train[..., 0], raw / 255.0, rtol=1e-6, atol=0)
    assert ds.x_train.max() == 1.0


def _triangle_weights(n_in: int, n_out: int) -> np.ndarray:
    """Antialiased linear resampling matrix [n_out, n_in] (half-pixel centres).

    The triangle (tent) kernel of linear interpolation, stretched by the
    downscale factor when shrinking (antialiasing), sampled at input coordinate
    (o + ½)·n_in/n_out − ½ and normalised over the pixels inside the image.
    """
    scale = n_out / n_in
    support = max(1.0, 1.0 / scale)
    centres = (np.arange(n_out) + 0.5) / scale - 0.5
    w = np.maximum(0.0, 1.0 - np.abs(np.arange(n_in)[None, :] - centres[:, None]) / support)
    return w / w.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("size", [16, 11, 40])
def test_resize_is_antialiased_bilinear(size):
    """Kills ``method="cubic"`` and ``antialias=False`` in ``resize_images``.

    Reference: the docstring, "bilinear (antialiased) resize": a separable
    tent-filter resampling written here in numpy (float64), the filter widened
    by the factor 28/size when shrinking. Without antialiasing a 28 -> 11 resize
    reads 2 of every ~2.5 rows only; a cubic kernel weighs 4 rows with negative
    lobes.
    """
    x = np.random.default_rng(0).random((3, 28, 28, 2)).astype(np.float32)
    wh = _triangle_weights(28, size)
    expected = np.einsum("oh,nhwc,pw->nopc", wh, x.astype(np.float64), wh)
    np.testing.assert_allclose(data.resize_images(x, size), expected, rtol=0, atol=1e-5)
