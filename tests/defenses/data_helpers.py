"""A stand-in loader for reproduction scripts' ``--dataset`` tests (no network here)."""

import dataclasses

import numpy as np


def serve_synthetic(monkeypatch, name="cifar10", channels=3, writers=None):
    """Make ``fedsim.data.load_dataset`` serve a synthetic dataset for ``name`` only.

    Args:
      monkeypatch: pytest's fixture; the loader is restored after the test.
      name: the one dataset name served; any other raises ``DatasetError``.
      channels: image channels (3 for a CIFAR-10 stand-in).
      writers: give the training examples this many writer ids (round-robin),
        for natural partitions; None leaves the dataset without ids.

    Returns:
      The stand-in loader; its ``calls`` list records (name, image_size) per call.
    """
    import fedsim.data
    import fedsim.simulation
    from fedsim.data import DatasetError, synthetic_dataset

    def load(requested, *, image_size=None, **_):
        if requested != name:
            raise DatasetError(f"test loader serves only {name!r}, not {requested!r}")
        load.calls.append((requested, image_size))
        ds = synthetic_dataset(seed=0, image_size=image_size or 32, channels=channels)
        if writers is not None:
            ds = dataclasses.replace(ds, groups=np.arange(len(ds.y_train)) % writers)
        return ds

    load.calls = []
    monkeypatch.setattr(fedsim.data, "load_dataset", load)
    monkeypatch.setattr(fedsim.simulation, "load_dataset", load)
    return load
