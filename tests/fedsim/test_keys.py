import jax
import numpy as np
import pytest

from fedsim.keys import (ENGINE_INIT, ENGINE_ROUNDS, experiment_key, numpy_generator,
                         stream_index)
from fedsim.models import init_params
from fedsim.simulation import Simulation

from .helpers import small_config, small_dataset


def _data(key):
    return tuple(np.asarray(jax.random.key_data(key)).tolist())


def engine_keys(seed, rounds):
    """Every key the engine derives for ``rounds`` rounds, written out independently of
    fedsim.simulation: init, the round root, each round's key and its two halves."""
    root = jax.random.key(seed)
    keys = {"init": jax.random.fold_in(root, 0), "rounds": jax.random.fold_in(root, 1)}
    for r in range(rounds):
        rk = jax.random.fold_in(keys["rounds"], r)
        keys[f"round {r}"] = rk
        keys[f"round {r} sample"], keys[f"round {r} clients"] = jax.random.split(rk)
    return {name: _data(k) for name, k in keys.items()}


def test_split_of_the_seed_key_hands_out_the_engines_keys():
    # Why fedsim.keys exists: with partitionable threefry, split(k)[i] is fold_in(k, i),
    # so split(key(seed)) gives work beside a run the engine's init and round keys.
    first, second = jax.random.split(jax.random.key(3))
    engine = engine_keys(3, 0)
    assert _data(first) == engine["init"] and _data(second) == engine["rounds"]


def test_engine_uses_the_documented_streams():
    cfg = small_config(**{"seed": 5})
    sim = Simulation(cfg, dataset=small_dataset())
    expected = init_params(sim.model, sim.dataset.input_shape,
                           jax.random.fold_in(jax.random.key(5), ENGINE_INIT))
    jax.tree_util.tree_map(np.testing.assert_array_equal, sim.init_state().params, expected)
    rk = jax.random.fold_in(jax.random.fold_in(jax.random.key(5), ENGINE_ROUNDS), 4)
    assert [_data(k) for k in sim.round_keys(4)] == [_data(k) for k in jax.random.split(rk)]


@pytest.mark.parametrize("seed", [0, 1, 17])
def test_experiment_keys_never_equal_an_engine_key_or_each_other(seed):
    names = ["chu2023/A/init/conv2", "chu2023/A/mask/conv2/random/0.1",
             "chu2023/A/mask/conv2/random/0.5", "chu2023/A/attack/conv2/8", "x"]
    ours = [_data(experiment_key(seed, n)) for n in names]
    assert len(set(ours)) == len(names)
    assert not set(ours) & set(engine_keys(seed, 300).values())
    # Children of a named stream do not meet the engine's keys either.
    kids = {_data(jax.random.fold_in(experiment_key(seed, "x"), i)) for i in range(300)}
    assert not kids & set(engine_keys(seed, 300).values())


def test_experiment_key_is_a_function_of_seed_and_name():
    assert _data(experiment_key(2, "a")) == _data(experiment_key(2, "a"))
    assert _data(experiment_key(2, "a")) != _data(experiment_key(3, "a"))
    assert 2 <= stream_index("a") < 2**32


@pytest.mark.parametrize("name", ["", None, 3])
def test_experiment_key_needs_a_name(name):
    with pytest.raises(ValueError, match="non-empty name"):
        experiment_key(0, name)


def test_numpy_generator_is_not_the_partitions_generator_nor_another_names():
    # fedsim.partition draws from default_rng(seed); a named generator must not
    # repeat those draws, nor another name's, and must repeat its own.
    def draws(g):
        return g.integers(0, 2**31, 16).tolist()

    partitions = draws(np.random.default_rng(4))
    a, b = draws(numpy_generator(4, "a")), draws(numpy_generator(4, "b"))
    assert a != partitions and b != partitions and a != b
    assert a == draws(numpy_generator(4, "a"))
    assert a != draws(numpy_generator(5, "a"))
    with pytest.raises(ValueError, match="non-empty name"):
        numpy_generator(4, "")
