"""Small configs and datasets for engine tests."""

from fedsim.config import load_config
from fedsim.data import synthetic_dataset


def small_config(**overrides):
    base = {
        "name": "test", "seed": 0,
        "data.dataset": "synthetic", "data.num_clients": 6, "data.partition": "dirichlet",
        "data.alpha": 1.0,
        "model.name": "mlp",
        "training.rounds": 2, "training.clients_per_round": 3, "training.batch_size": 16,
        "training.lr": 0.5, "training.client_parallelism": "loop",
        "eval.every": 1, "output.progress": False, "output.plots": False,
    }
    base.update(overrides)
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


def small_dataset(seed=0, n=600):
    return synthetic_dataset(seed=seed, image_size=16, num_train=n, num_test=200)
