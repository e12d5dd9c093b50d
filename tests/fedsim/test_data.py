import gzip
from pathlib import Path

import numpy as np
import pytest

from fedsim import data
from fedsim.data import DatasetError, load_dataset, read_idx

FMNIST = Path("/usr/share/datasets/fashion-mnist")


def _write_idx(path, arr, gz=True):
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    raw = header + arr.astype(np.uint8).tobytes()
    (gzip.open if gz else open)(path, "wb").write(raw)


def test_read_idx_roundtrip(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "a.gz", arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "a.gz"), arr)
    _write_idx(tmp_path / "b", arr, gz=False)
    np.testing.assert_array_equal(read_idx(tmp_path / "b"), arr)


def test_corrupt_and_missing_idx_files_are_named(tmp_path):
    arr = np.zeros((4, 2, 2), np.uint8)
    _write_idx(tmp_path / "t.gz", arr)
    raw = gzip.open(tmp_path / "t.gz").read()
    gzip.open(tmp_path / "trunc.gz", "wb").write(raw[:-3])
    with pytest.raises(DatasetError, match="trunc.gz.*truncated"):
        read_idx(tmp_path / "trunc.gz")
    gzip.open(tmp_path / "bad.gz", "wb").write(b"\x01\x02\x03\x04garbage")
    with pytest.raises(DatasetError, match="bad.gz.*magic"):
        read_idx(tmp_path / "bad.gz")
    with pytest.raises(DatasetError, match="missing.gz"):
        read_idx(tmp_path / "missing.gz")


def test_fake_fashion_mnist_folder_is_read(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    for stem, n in (("train", 30), ("t10k", 10)):
        _write_idx(tmp_path / f"{stem}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(tmp_path / f"{stem}-labels-idx1-ubyte.gz", rng.integers(0, 10, n))
    ds = load_dataset("fashion_mnist", source="idx", data_dir=str(tmp_path), image_size=16)
    assert ds.x_train.shape == (30, 16, 16, 1) and ds.x_test.shape == (10, 16, 16, 1)
    assert ds.x_train.min() >= 0 and ds.x_train.max() <= 1 and ds.y_train.dtype == np.int32
    monkeypatch.setenv("FEDSIM_FASHION_MNIST_DIR", str(tmp_path))
    assert load_dataset("fashion_mnist").x_train.shape == (30, 28, 28, 1)


def test_missing_idx_folder_says_how_to_get_it(tmp_path):
    with pytest.raises(DatasetError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion_mnist", source="idx", data_dir=str(tmp_path))


def test_tfds_source_under_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=12):
        ds = load_dataset("mnist", image_size=16)
        assert ds.x_train.shape == (12, 16, 16, 1) and ds.num_classes == 10
        assert ds.mean.shape == (1,) and ds.std.shape == (1,)
        c = load_dataset("cifar10", max_train=5)
        assert c.x_train.shape == (5, 32, 32, 3)
        faces = load_dataset("celeb_a", image_size=16)  # default label: the Male attribute
        assert set(np.unique(faces.y_train)) <= {0, 1} and faces.groups is not None
        ids = load_dataset("celeb_a", image_size=16, label_key="identity")
        np.testing.assert_array_equal(ids.y_train, ids.groups)
        with pytest.raises(DatasetError, match="label_key"):
            load_dataset("celeb_a", label_key="Nope")


def test_synthetic_is_seeded():
    a, b, c = data.synthetic_dataset(seed=1), data.synthetic_dataset(seed=1), data.synthetic_dataset(seed=2)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.x_train, c.x_train)


@pytest.mark.skipif(not FMNIST.exists(), reason="apt package dataset-fashion-mnist not installed")
def test_real_fashion_mnist_offline():
    ds = load_dataset("fashion_mnist", image_size=16)
    assert ds.x_train.shape == (60000, 16, 16, 1) and ds.x_test.shape == (10000, 16, 16, 1)
    assert np.bincount(ds.y_train).tolist() == [6000] * 10
