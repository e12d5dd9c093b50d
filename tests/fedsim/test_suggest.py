""""Did you mean" hints: the helper, and the errors that end with one."""

import pytest

from fedsim.config import ConfigError, load_config
from fedsim.suggest import close_matches, did_you_mean, did_you_mean_each

from .helpers import small_config


def test_close_matches_offers_the_nearest_name_and_nothing_for_a_stranger():
    keys = ["training.rounds", "training.lr", "data.num_clients"]
    assert close_matches("training.rouns", keys) == ["training.rounds"]
    assert close_matches("LeNet5", ["lenet5", "lenet", "mlp"]) == ["lenet5"]  # any case
    assert close_matches("zzz", keys) == []
    assert close_matches(["gc"], ["gc"]) == [] and close_matches(3, ["3"]) == []  # not a name
    assert did_you_mean("zzz", keys) == ""
    assert did_you_mean("dirichlt", ["iid", "dirichlet"]) == "; did you mean 'dirichlet'?"


def test_several_unknown_names_get_one_hint_each_where_they_have_one():
    allowed = ["iterations", "restarts", "tv"]
    assert did_you_mean_each({"iteratons"}, allowed) == "; did you mean 'iterations'?"
    assert did_you_mean_each({"restats", "zzz", "iteratons"}, allowed) == (
        "; did you mean 'iterations' for 'iteratons', 'restarts' for 'restats'?")
    assert did_you_mean_each({"zzz", "qqq"}, allowed) == ""


@pytest.mark.parametrize("overrides, message", [
    (["rouds=2"], r"--set rouds: unknown config key; .*; did you mean 'training\.rounds'\?$"),
    (["training.rouns=2"], r"did you mean 'training\.rounds'\?$"),
    (["clientsperround=3"], r"did you mean 'training\.clients_per_round'\?$"),
    (["data.partition=dirichlt"], r"allowed values: .*; did you mean 'dirichlet'\?$"),
    (["model.name=LeNet5x"], r"'model\.name'.*; did you mean 'lenet5'\?$"),
    (["pruning.scheme=snipp"], r"'pruning\.scheme'.*; did you mean 'snip'\?$"),
])
def test_config_errors_end_with_the_close_match(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_a_misspelt_key_in_a_config_file_is_matched_in_its_section(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("training: {roundz: 3}\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'training\.roundz'; allowed keys "
                                          r"in 'training': .*; did you mean 'rounds'\?$"):
        load_config(path)


def test_a_stranger_gets_no_hint():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["nonsense=1"])
    assert "did you mean" not in str(err.value)


def test_defense_names_and_their_arguments_are_matched():
    from fedsim.hooks import build_defense

    with pytest.raises(ValueError, match=r"unknown defense 'dp_gausian'.*; did you mean "
                                         r"'dp_gaussian'\?$"):
        build_defense("dp_gausian")
    with pytest.raises(ValueError, match=r"it takes noise_multiplier, .*; did you mean "
                                         r"'noise_multiplier'\?$"):
        build_defense("dp_gaussian", noise_multipler=1.0)


def test_model_names_are_matched():
    from fedsim.models import build_model

    with pytest.raises(ValueError, match=r"did you mean 'resnet10'\?$"):
        build_model("resnet_10")


def test_an_unknown_tfds_name_is_named_as_unknown_with_the_close_match():
    from fedsim.data import DatasetError, load_dataset

    with pytest.raises(DatasetError, match=r"unknown dataset 'fashion_mnst'.*; did you mean "
                                           r"'fashion_mnist'\?$"):
        load_dataset("fashion_mnst", source="tfds")


def test_the_configs_own_checks_still_pass_a_good_config():
    small_config()  # no hint machinery in the way of a valid config
