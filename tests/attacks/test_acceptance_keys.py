"""The acceptance experiments' attack key is its own stream (no reuse of the model's init key)."""

import jax
import numpy as np

from attacks import acceptance
from attacks.api import Reconstruction


def _key_data(key):
    return np.asarray(jax.random.key_data(key))


def test_attack_key_is_not_the_model_init_key():
    for seed in (0, 1, 7):
        assert not np.array_equal(_key_data(acceptance.attack_key(seed)),
                                  _key_data(jax.random.key(seed)))
    assert not np.array_equal(_key_data(acceptance.attack_key(0)),
                              _key_data(acceptance.attack_key(1)))


def test_attack_and_score_passes_the_attack_stream(monkeypatch):
    seen = []

    def fake_run_many(observations, config, key):
        seen.append(key)
        return [Reconstruction(x=np.zeros((1, 2, 2, 1), np.float32),
                               labels=np.zeros(1, np.int32), loss=0.0)]

    monkeypatch.setitem(acceptance.ATTACKS, "fake", fake_run_many)
    x = np.zeros((1, 2, 2, 1), np.float32)
    acceptance.attack_and_score("fake", [None], [x], [np.zeros(1, np.int32)], {}, seed=0)
    assert np.array_equal(_key_data(seen[0]), _key_data(acceptance.attack_key(0)))
    # the model of fedsgd_observations is initialised from jax.random.key(init_seed = 0)
    assert not np.array_equal(_key_data(seen[0]), _key_data(jax.random.key(0)))
