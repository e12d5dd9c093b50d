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


def test_an_env_dir_without_the_files_is_named_not_passed_over(tmp_path, monkeypatch):
    # Before: it fell back to /usr/share/datasets/fashion-mnist without a word.
    monkeypatch.setenv("FEDSIM_FASHION_MNIST_DIR", str(tmp_path / "nope"))
    with pytest.raises(DatasetError, match=r"FEDSIM_FASHION_MNIST_DIR=.*nope holds no "
                                           r"train-images-idx3-ubyte.gz"):
        load_dataset("fashion_mnist")


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


def test_synthetic_data_does_not_share_its_draws_with_the_partition():
    """The partitions draw from default_rng(seed); the data must come from another stream.

    From that stream, the class templates would be its first draws, and every
    image would lie within 0.3 of 0.7 × its class's template (module code).
    """
    ds = data.synthetic_dataset(seed=3, num_train=200, num_test=10)
    same_stream = np.random.default_rng(3).uniform(0.0, 1.0, (ds.num_classes, 16, 16, 1))
    noise = ds.x_train - 0.7 * same_stream[ds.y_train]
    assert not np.all((noise >= -1e-6) & (noise <= 0.3 + 1e-6))


@pytest.mark.skipif(not FMNIST.exists(), reason="apt package dataset-fashion-mnist not installed")
def test_real_fashion_mnist_offline():
    ds = load_dataset("fashion_mnist", image_size=16)
    assert ds.x_train.shape == (60000, 16, 16, 1) and ds.x_test.shape == (10000, 16, 16, 1)
    assert np.bincount(ds.y_train).tolist() == [6000] * 10


class _FakeTfds:
    """tfds stand-in: nothing prepared; records whether a download was attempted."""

    def __init__(self, urls):
        self.urls, self.downloads = urls, []
        urls_ = urls

        class Builder:
            url_infos = {u: None for u in urls_}
        self._builder = Builder

    def builder_cls(self, name):
        return self._builder

    def data_source(self, name, *, split, data_dir=None, download=True):
        if not download:
            raise FileNotFoundError(f"{name} not prepared in {data_dir}")
        self.downloads.append((name, split))
        raise ConnectionError("download attempted")


def _no_network(monkeypatch):
    for v in data._PROXY_VARIABLES:
        monkeypatch.delenv(v, raising=False)
    probed = []

    def refuse(address, timeout=None):
        probed.append((address, timeout))
        raise OSError("Network is unreachable")
    monkeypatch.setattr(data.socket, "create_connection", refuse)
    return probed


def test_offline_download_fails_at_once_naming_dataset_and_hosts(monkeypatch):
    probed = _no_network(monkeypatch)
    fake = _FakeTfds(["https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
                      "http://mirror.example.org:8080/cifar.tgz"])
    with pytest.raises(DatasetError, match=r"'cifar10' is not prepared.*www\.cs\.toronto\.edu"):
        data._open_tfds_splits(fake, "cifar10", "/data/tfds")
    assert fake.downloads == []  # tfds' retrying download was never started
    assert sorted(a for a, _ in probed) == [("mirror.example.org", 8080), ("www.cs.toronto.edu", 443)]
    assert all(t == data.DOWNLOAD_PROBE_TIMEOUT for _, t in probed)


def test_reachable_host_proxy_or_unknown_urls_let_tfds_download(monkeypatch):
    _no_network(monkeypatch)
    fake = _FakeTfds([])  # tfds registers no URL: nothing to probe
    with pytest.raises(ConnectionError):
        data._open_tfds_splits(fake, "mystery", None)
    assert fake.downloads == [("mystery", "train")]
    fake = _FakeTfds(["https://www.cs.toronto.edu/x.tgz"])
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")  # a direct probe cannot tell
    with pytest.raises(ConnectionError):
        data._open_tfds_splits(fake, "cifar10", None)
    assert fake.downloads == [("cifar10", "train")]
    monkeypatch.delenv("HTTPS_PROXY")

    class Socket:
        def close(self):
            pass
    monkeypatch.setattr(data.socket, "create_connection", lambda address, timeout=None: Socket())
    fake = _FakeTfds(["https://www.cs.toronto.edu/x.tgz"])
    with pytest.raises(ConnectionError):
        data._open_tfds_splits(fake, "cifar10", None)
    assert fake.downloads == [("cifar10", "train")]


def test_load_dataset_reports_an_unreachable_download_as_one_error(monkeypatch):
    pytest.importorskip("tensorflow_datasets")
    _no_network(monkeypatch)
    with pytest.raises(DatasetError, match="'cifar10' is not prepared.*cannot be reached"):
        load_dataset("cifar10", data_dir="/nonexistent/tfds")


def test_resizing_gives_the_same_images_under_x64():
    # jax.image.resize builds its weights in the default float: under
    # jax_enable_x64 the float32 images were resized in float64, so a run on
    # resized data (data.image_size) changed with the flag.
    import jax

    x = np.random.default_rng(0).random((5, 28, 28, 1)).astype(np.float32)
    plain = data.resize_images(x, 16)
    with jax.enable_x64(True):
        wide = data.resize_images(x, 16)
    assert plain.dtype == wide.dtype == np.float32 and plain.shape == (5, 16, 16, 1)
    np.testing.assert_array_equal(wide, plain)


def test_the_synthetic_dataset_is_never_seeded_silently():
    """Its examples are drawn from its seed, so the caller must give one (a
    Simulation gives the config's); real datasets need none."""
    from fedsim.data import DatasetError, synthetic_dataset
    with pytest.raises(DatasetError, match="seed="):
        load_dataset("synthetic")
    with pytest.raises(TypeError, match="seed"):
        synthetic_dataset(image_size=8)
    a, b = (load_dataset("synthetic", image_size=8, seed=s) for s in (3, 4))
    assert not np.array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.x_train, load_dataset("synthetic", image_size=8, seed=3).x_train)
