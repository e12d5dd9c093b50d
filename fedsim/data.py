"""Datasets: real data through tensorflow-datasets, offline Fashion-MNIST, synthetic.

Images are returned as float32 NHWC arrays in [0, 1] with int32 labels, so
attack metrics (PSNR on [0, 1]) apply directly; ``Dataset.mean``/``std`` give
per-channel normalisation statistics of the training split for models that
want normalised inputs.

Sources, in the order ``source="auto"`` tries them for ``fashion_mnist``:

1. ``idx``: the Fashion-MNIST IDX files of the Debian package
   ``dataset-fashion-mnist`` (``apt-get install dataset-fashion-mnist``), in
   ``/usr/share/datasets/fashion-mnist`` or ``$FEDSIM_FASHION_MNIST_DIR``.
   Read with numpy: this is the offline default. (tfds cannot use these files
   directly: Debian re-gzipped them, so tfds' registered checksums reject them;
   the uncompressed contents are identical to upstream.)
2. ``tfds``: ``tfds.data_source(name)`` (array_record, no TensorFlow needed);
   downloads and prepares the dataset when a network is available.

Other names (mnist, cifar10, svhn_cropped, celeb_a, emnist/...) use ``tfds``.
``synthetic`` is a small learnable dataset for tests.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import socket
import urllib.parse
from pathlib import Path

import numpy as np

from fedsim.suggest import did_you_mean

FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
KNOWN_DATASETS = ("fashion_mnist", "mnist", "cifar10", "svhn_cropped", "celeb_a", "emnist",
                  "synthetic")


class DatasetError(RuntimeError):
    """A dataset could not be found or read; the message says how to get it."""


@dataclasses.dataclass(frozen=True)
class Dataset:
    """An in-memory dataset.

    Attributes:
      name: dataset name.
      x_train: float32 [N, H, W, C] in [0, 1].
      y_train: int32 [N].
      x_test: float32 [M, H, W, C] in [0, 1].
      y_test: int32 [M].
      num_classes: number of classes.
      mean: float32 [C] per-channel mean of ``x_train``.
      std: float32 [C] per-channel std of ``x_train``.
      groups: optional int32 [N] natural client ids (writer/identity) for
        natural partitions; None when the source has none.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    mean: np.ndarray
    std: np.ndarray
    groups: np.ndarray | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


def load_dataset(
    name: str,
    *,
    image_size: int | None = None,
    source: str = "auto",
    data_dir: str | None = None,
    max_train: int | None = None,
    max_test: int | None = None,
    label_key: str | None = None,
    seed: int | None = None,
) -> Dataset:
    """Load a dataset by name.

    Args:
      name: one of :data:`KNOWN_DATASETS` or any tfds name.
      image_size: resize images to image_size × image_size (e.g. 16, 28, 32);
        None keeps the native size.
      source: "auto", "idx" (Fashion-MNIST IDX files) or "tfds".
      data_dir: tfds data_dir, or the IDX folder when ``source="idx"``.
      max_train: keep only the first ``max_train`` training examples.
      max_test: keep only the first ``max_test`` test examples.
      label_key: tfds feature used as label (e.g. an attribute of celeb_a).
      seed: seed of the synthetic dataset, which needs one (its examples are
        drawn from it); real datasets do not depend on it.

    Raises:
      DatasetError: if the data cannot be found; says how to get it. Also for
        ``synthetic`` without a seed.
    """
    if name == "synthetic":
        if seed is None:
            raise DatasetError("load_dataset('synthetic') needs seed=: its examples are drawn "
                               "from it (a Simulation passes the config's seed)")
        ds = synthetic_dataset(seed=seed, image_size=image_size or 16)
    elif name == "fashion_mnist" and source in ("auto", "idx"):
        folder = _find_fashion_mnist_idx(data_dir if source == "idx" else None)
        if folder is not None:
            ds = _load_idx_fashion_mnist(folder)
        elif source == "idx":
            raise DatasetError(
                "Fashion-MNIST IDX files not found in "
                f"{data_dir or ', '.join(FASHION_MNIST_DIRS)}: install them with "
                "'apt-get install dataset-fashion-mnist' or set FEDSIM_FASHION_MNIST_DIR")
        else:
            ds = _load_tfds(name, data_dir, label_key)
    elif source in ("auto", "tfds"):
        ds = _load_tfds(name, data_dir, label_key)
    else:
        raise DatasetError(f"data.source={source!r} is not valid for {name!r}; allowed: auto, tfds"
                           + (", idx" if name == "fashion_mnist" else ""))
    if max_train is not None:
        ds = dataclasses.replace(ds, x_train=ds.x_train[:max_train], y_train=ds.y_train[:max_train],
                                 groups=None if ds.groups is None else ds.groups[:max_train])
    if max_test is not None:
        ds = dataclasses.replace(ds, x_test=ds.x_test[:max_test], y_test=ds.y_test[:max_test])
    if image_size is not None and ds.x_train.shape[1] != image_size:
        ds = dataclasses.replace(ds, x_train=resize_images(ds.x_train, image_size),
                                 x_test=resize_images(ds.x_test, image_size))
    mean = ds.x_train.mean(axis=(0, 1, 2)).astype(np.float32)
    std = ds.x_train.std(axis=(0, 1, 2)).astype(np.float32)
    return dataclasses.replace(ds, mean=mean, std=std)


def resize_images(x: np.ndarray, size: int, chunk: int = 4096) -> np.ndarray:
    """Bilinear (antialiased) resize of NHWC images to size × size, in chunks.

    Computed in float32 as without ``jax_enable_x64``: under x64,
    ``jax.image.resize`` builds its interpolation weights in float64 and the
    float32 images were resized in float64, so a run's data (and every number
    after it) changed with the flag (``fedsim.x64``).
    """
    import jax
    import jax.numpy as jnp

    from fedsim.x64 import x64_off

    resize = jax.jit(lambda b: jax.image.resize(
        b, (b.shape[0], size, size, b.shape[3]), method="linear", antialias=True))
    with x64_off():
        out = [np.asarray(resize(jnp.asarray(x[i:i + chunk], jnp.float32)))
               for i in range(0, len(x), chunk)]
    return np.clip(np.concatenate(out), 0.0, 1.0).astype(np.float32)


# --- Fashion-MNIST from IDX files ------------------------------------------

def _find_fashion_mnist_idx(explicit: str | None) -> Path | None:
    """The directory holding the IDX files: ``explicit``, else
    ``$FEDSIM_FASHION_MNIST_DIR``, else the Debian package's.

    Raises:
      DatasetError: ``$FEDSIM_FASHION_MNIST_DIR`` is set but holds no IDX files
        (it used to fall back to the package's files without a word, so a run
        meant for other files trained on those).
    """
    env = os.environ.get("FEDSIM_FASHION_MNIST_DIR")
    if not explicit and env and not (Path(env) / "train-images-idx3-ubyte.gz").exists():
        raise DatasetError(f"FEDSIM_FASHION_MNIST_DIR={env} holds no train-images-idx3-ubyte.gz; "
                           "point it at the directory with the Fashion-MNIST IDX files, or unset it")
    candidates = [explicit] if explicit else [env, *FASHION_MNIST_DIRS]
    for c in candidates:
        if c and (Path(c) / "train-images-idx3-ubyte.gz").exists():
            return Path(c)
    return None


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (optionally gzipped) into a numpy array.

    Raises:
      DatasetError: if the file is missing, truncated or not IDX.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DatasetError(f"cannot read IDX file {path}: {e}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DatasetError(f"{path} is not an unsigned-byte IDX file (bad magic number)")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims))
    if len(raw) - offset != expected:
        raise DatasetError(f"{path} is truncated or corrupt: header says {dims} "
                           f"({expected} bytes) but it holds {len(raw) - offset}")
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(dims)


def _load_idx_fashion_mnist(folder: Path) -> Dataset:
    def images(stem):
        return (read_idx(folder / f"{stem}-images-idx3-ubyte.gz")[..., None] / 255.0).astype(np.float32)

    def labels(stem):
        return read_idx(folder / f"{stem}-labels-idx1-ubyte.gz").astype(np.int32)

    x_tr, y_tr, x_te, y_te = images("train"), labels("train"), images("t10k"), labels("t10k")
    if len(x_tr) != len(y_tr) or len(x_te) != len(y_te):
        raise DatasetError(f"Fashion-MNIST files in {folder}: image and label counts differ")
    return Dataset("fashion_mnist", x_tr, y_tr, x_te, y_te, 10, np.zeros(1), np.ones(1))


# --- tensorflow-datasets ---------------------------------------------------

_TEST_SPLIT = {"celeb_a": "test", "svhn_cropped": "test"}


# Environment variables that route downloads through a proxy: a direct TCP
# probe of the download host says nothing then.
_PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy",
                    "ALL_PROXY")
DOWNLOAD_PROBE_TIMEOUT = 5.0  # seconds per host


def _download_hosts(tfds, name: str) -> list[tuple[str, int]]:
    """(host, port) of the URLs tfds registers for ``name``; [] where it registers none."""
    try:
        infos = tfds.builder_cls(name.split("/")[0].split(":")[0]).url_infos or {}
    except Exception:  # unknown name, no checksums file, ...: tfds reports it later
        return []
    hosts = set()
    for url in infos:
        parts = urllib.parse.urlparse(url)
        if parts.hostname:
            hosts.add((parts.hostname, parts.port or (80 if parts.scheme == "http" else 443)))
    return sorted(hosts)


def _check_download_reachable(tfds, name: str, data_dir: str | None) -> None:
    """Fail at once where a download cannot work.

    tfds retries a failed download 10 times with exponential back-off (minutes
    on an offline machine) before it raises; this probes the registered download
    hosts with one TCP connection each (``DOWNLOAD_PROBE_TIMEOUT`` s) instead.
    It passes where any host answers, where tfds registers no URL for the
    dataset, or where a proxy is configured (a direct probe cannot tell then).

    Raises:
      DatasetError: naming the dataset, the unreachable hosts and ``data_dir``.
    """
    if any(os.environ.get(v) for v in _PROXY_VARIABLES):
        return
    hosts = _download_hosts(tfds, name)
    if not hosts:
        return
    for host, port in hosts:
        try:
            socket.create_connection((host, port), timeout=DOWNLOAD_PROBE_TIMEOUT).close()
            return
        except OSError:
            continue
    raise DatasetError(
        f"dataset {name!r} is not prepared in data_dir "
        f"({data_dir or 'the tensorflow-datasets default'}) and its download host(s) "
        f"{', '.join(h for h, _ in hosts)} cannot be reached (no network?). Download it once "
        "on a machine with internet access and point data.data_dir at the prepared copy.")


def _open_tfds_splits(tfds, name: str, data_dir: str | None) -> dict:
    """The train and test data sources; a dataset not prepared yet is downloaded."""
    names = ("train", _TEST_SPLIT.get(name, "test"))
    try:
        return {s: tfds.data_source(name, split=s, data_dir=data_dir, download=False)
                for s in names}
    except Exception:  # not prepared here (or another problem the download reports)
        pass
    _check_download_reachable(tfds, name, data_dir)
    return {s: tfds.data_source(name, split=s, data_dir=data_dir) for s in names}


def _load_tfds(name: str, data_dir: str | None, label_key: str | None) -> Dataset:
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise DatasetError(f"tensorflow-datasets is needed for {name!r}: {e}") from None
    hint = (" For offline Fashion-MNIST: 'apt-get install dataset-fashion-mnist'."
            if name == "fashion_mnist" else "")
    try:
        splits = _open_tfds_splits(tfds, name, data_dir)
    except DatasetError as e:
        raise DatasetError(f"{e}{hint}") from None
    except Exception as e:  # tfds raises many types (download, not found, ...)
        if type(e).__name__ == "DatasetNotFoundError":  # a name tfds does not know
            known = [*KNOWN_DATASETS, *tfds.list_builders(with_community_datasets=False)]
            raise DatasetError(
                f"unknown dataset {name!r}: not one fedsim makes or reads itself "
                f"(synthetic; fashion_mnist) nor one tensorflow-datasets registers"
                f"{did_you_mean(name, known)}") from None
        raise DatasetError(
            f"cannot load dataset {name!r} through tensorflow-datasets "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200]}). It needs internet access "
            f"once to download, or a prepared copy in data_dir.{hint}") from None
    (train, test) = splits.values()
    x_tr, y_tr, g_tr, nc = _source_to_numpy(train, name, label_key, tfds)
    x_te, y_te, _, _ = _source_to_numpy(test, name, label_key, tfds)
    return Dataset(name, x_tr, y_tr, x_te, y_te, nc, np.zeros(1), np.ones(1), g_tr)


# Default label feature per dataset; celeb_a has attributes (binary) and
# identities: ``label_key: identity`` or any attribute name (e.g. Smiling).
_DEFAULT_LABEL = {"celeb_a": "Male"}


def _scalar(v):
    """A feature value as a scalar (tfds nests some, e.g. celeb_a identity)."""
    while isinstance(v, dict):
        v = next(iter(v.values()))
    return v


def _source_to_numpy(src, name, label_key, tfds):
    features = src.dataset_info.features
    image_key = "image"
    if label_key is None:
        label_key = _DEFAULT_LABEL.get(name, "label")
    n = len(src)
    xs, ys, gs = [], [], []
    for i in range(n):
        ex = src[i]
        xs.append(ex[image_key])
        lab = ex[label_key] if label_key in ex else ex.get("attributes", {}).get(label_key)
        if lab is None:
            attrs = sorted(ex.get("attributes", {}))
            raise DatasetError(f"dataset {name!r} has no label feature {label_key!r} (data.label_key); "
                               f"features: {sorted(ex)}" + (f", attributes: {attrs}" if attrs else ""))
        ys.append(_scalar(lab))
        for gk in ("writer_id", "identity", "user_id"):
            if gk in ex:
                gs.append(_scalar(ex[gk]))
    x = np.stack(xs).astype(np.float32) / 255.0
    if x.ndim == 3:
        x = x[..., None]
    y = np.asarray(ys).astype(np.int32)
    try:
        nc = int(features[label_key].num_classes)
    except Exception:
        nc = int(y.max()) + 1
    groups = np.asarray(gs).astype(np.int64) if len(gs) == n and n else None
    return x, y, groups, nc


# --- synthetic ---------------------------------------------------------------

def synthetic_dataset(*, seed: int, image_size: int = 16, channels: int = 1,
                      num_classes: int = 10, num_train: int = 2000, num_test: int = 500) -> Dataset:
    """A small, learnable image dataset: class templates plus noise, in [0, 1].

    Used by unit tests so they need no files. Deterministic in ``seed``, from
    its own stream (:func:`fedsim.keys.numpy_generator`): the partitions draw
    from ``np.random.default_rng(seed)``, and a dataset drawn from that same
    stream would share its bits with the partition of the same run.
    """
    from fedsim.keys import numpy_generator  # fedsim.keys imports jax; data need not
    rng = numpy_generator(seed, "data/synthetic")
    templates = rng.uniform(0.0, 1.0, (num_classes, image_size, image_size, channels))

    def draw(n):
        y = rng.integers(0, num_classes, n).astype(np.int32)
        x = 0.7 * templates[y] + 0.3 * rng.uniform(0.0, 1.0, (n, image_size, image_size, channels))
        return x.astype(np.float32), y

    x_tr, y_tr = draw(num_train)
    x_te, y_te = draw(num_test)
    return Dataset("synthetic", x_tr, y_tr, x_te, y_te, num_classes, np.zeros(1), np.ones(1))
