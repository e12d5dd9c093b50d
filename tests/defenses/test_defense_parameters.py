"""Every registered defense refuses a NaN, an infinite number or a bool by name when it is built.

A NaN passes any ``x < 0`` test, and a later ``x > 0`` then reads it as 0: dp_psac
built with ``noise_multiplier: nan`` trained with no noise at all. Checked for
every float parameter of every factory in the registry, so a new defense is
covered as soon as it registers (it only needs its required arguments below).
"""

import inspect

import pytest

from fedsim import hooks

# The arguments each factory needs besides the one under test.
REQUIRED = {
    "adaptive_client_level_dp": dict(noise_multiplier=1.0, clients_per_round=2,
                                     clipped_count_stddev=1.0),
    "client_level_dp": dict(clip_norm=1.0, noise_multiplier=1.0, clients_per_round=2),
    "dp_gaussian": dict(noise_multiplier=1.0), "dp_psac": dict(noise_multiplier=1.0),
    "dp_vmf": dict(kappa=50.0), "gc": dict(p=0.5), "natural_channel": dict(kappa=10.0),
    "parameter_channel": dict(kappa=10.0), "personalized_channel": dict(kappa=10.0),
    "prune_largest": dict(p=0.3), "prune_mix": dict(p_largest=0.2, p_random=0.2),
    "prune_random": dict(p=0.3), "soteria": dict(p_fc=0.3),
    "update_gaussian": dict(sigma=0.01), "update_laplace": dict(scale=0.01),
    "white_channel": dict(kappa=10.0),
}


def _float_parameters():
    hooks._load_defenses()
    for name, factory in sorted(hooks.DEFENSE_REGISTRY.items()):
        for p in inspect.signature(factory).parameters.values():
            if "float" in str(p.annotation):
                yield name, p.name


CASES = list(_float_parameters())


def test_the_registry_has_float_parameters_to_check():
    assert len({name for name, _ in CASES}) >= 15 and len(CASES) >= 25


@pytest.mark.parametrize("name,param", CASES)
# True: float(True) is 1.0, so a YAML ``clip_norm: true`` ran as C = 1 (``p: true``
# pruned everything) without a word.
@pytest.mark.parametrize("value", [float("nan"), float("inf"), True])
def test_a_non_finite_number_is_refused_by_name(name, param, value):
    factory = hooks.DEFENSE_REGISTRY[name]
    required = [p.name for p in inspect.signature(factory).parameters.values()
                if p.default is inspect.Parameter.empty
                and p.kind is not inspect.Parameter.VAR_KEYWORD]
    args = REQUIRED.get(name, {})
    missing = [r for r in required if r not in args]
    assert not missing, f"add {name}'s required arguments {missing} to REQUIRED"
    with pytest.raises(ValueError, match=param):
        hooks.build_defense(name, **{**args, param: value})


@pytest.mark.parametrize("param,value", [
    ("normalize", "abc"), ("max_examples", -5), ("max_examples", 2.5), ("image_size", True),
    ("source", 3), ("data_dir", [1, 2]), ("dataset_seed", True), ("dataset_seed", -1)])
def test_a_channels_data_loading_setting_of_the_wrong_type_is_refused_by_name(param, value):
    # They were coerced: normalize "abc" read as true, max_examples -5 dropped the
    # last 5 examples, a list data_dir was named as a directory, seed True drew seed 1.
    args = dict(kappa=10.0, dataset="synthetic", image_size=8, dataset_seed=0)
    with pytest.raises(ValueError, match=rf"natural_channel: {param} must be"):
        hooks.build_defense("natural_channel", **{**args, param: value})


def test_a_channel_whose_own_dataset_cannot_load_names_its_defense_entry():
    # Before: a DatasetError saying "data.source='abc'", the run's key, not the spec's.
    from fedsim.config import ConfigError, load_config
    from fedsim.simulation import Simulation

    cfg = load_config(None, [
        "data.dataset=synthetic", "data.image_size=12", "model.name=mlp", "data.num_clients=4",
        "training.clients_per_round=2",
        "defenses=[{name: natural_channel, kappa: 1.0, dataset: fashion_mnist, source: abc}]"])
    with pytest.raises(ConfigError, match=r"config key 'defenses\[0\]' \(natural_channel\): "
                                          r"cannot load the dataset its spec names"):
        Simulation(cfg)
