"""Slow acceptance tests on real Fashion-MNIST (issue 3): batch 1, labels inferred."""

import pytest

from fedsim.data import load_dataset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fmnist():
    try:
        return load_dataset("fashion_mnist", image_size=16)
    except Exception as e:  # files absent on this machine
        pytest.skip(f"real Fashion-MNIST unavailable: {e}")


@pytest.mark.parametrize("model,attack,iterations,target", [
    ("mlp", "inverting_gradients", 1000, 30.0),
    ("mlp", "dlg", 300, 30.0),
    ("lenet", "inverting_gradients", 1000, 20.0),
    ("lenet", "dlg", 300, 20.0),
])
def test_batch_one_reconstruction(fmnist, model, attack, iterations, target):
    from attacks.acceptance import attack_and_score, fedsgd_observations
    obs, xs, ys = fedsgd_observations(fmnist, model, 2, init_seed=0, first_index=100)
    assert all(o.labels is None for o in obs)
    res = attack_and_score(attack, obs, xs, ys, {"iterations": iterations}, seed=0)
    assert res["mean"]["label_acc"] == 1.0
    assert res["min_psnr"] >= target, res
