""""Did you mean" hints in the attack suite's errors (the helper: tests/fedsim/test_suggest.py)."""

import pytest


def test_attack_names_and_config_keys_are_matched():
    from attacks import run_attack
    from attacks.gradient_inversion import AttackConfigError, parse_config

    with pytest.raises(ValueError, match=r"unknown attack 'inverting_gradient'.*; did you mean "
                                         r"'inverting_gradients'\?$"):
        run_attack("inverting_gradient", None, {}, None)
    with pytest.raises(AttackConfigError, match=r"unknown key\(s\) \['iteratons'\].*; did you "
                                                r"mean 'iterations'\?$"):
        parse_config({"iterations": 100, "tv": 0.0}, {"iteratons": 3})


def test_a_misspelt_grant_is_matched():
    from attacks.cli import validate_attack_section
    from fedsim.config import ConfigError, load_config

    cfg = load_config(None, ["attack={name: dlg, grants: {batch_sise: true}}"])
    with pytest.raises(ConfigError, match=r"'attack\.grants'.*; did you mean 'batch_size'\?$"):
        validate_attack_section(cfg)
