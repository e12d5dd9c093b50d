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


def random_zeroing_upload(rate=0.5):
    """An upload-stage test defense: zero each coordinate of Δ with probability ``rate``.

    Every client draws its own pattern from its upload key, so clients send
    different coordinates — what the ``sender_mean`` aggregation is about.
    """
    import jax
    import jax.numpy as jnp

    from fedsim.hooks import Defense

    def apply(delta, state, *, key, context=None):
        leaves, tree = jax.tree_util.tree_flatten(delta)
        keys = jax.random.split(key, len(leaves))
        kept = [jnp.where(jax.random.bernoulli(k, 1.0 - rate, l.shape), l, 0.0)
                for k, l in zip(keys, leaves)]
        return jax.tree_util.tree_unflatten(tree, kept), state

    return Defense(init=lambda params: (), apply=apply, stage="upload", name="random_zeroing")
