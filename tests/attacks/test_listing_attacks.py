"""``fedsim list attacks``: the section the attack package contributes (entry point
``fedsim.listings``), one entry per registered attack with its config keys."""

import re

import pytest

from attacks.api import ATTACK_REGISTRY, listing
from attacks.gradient_inversion import AttackConfigError
from fedsim.cli import main


def test_every_registered_attack_is_listed_with_its_config_keys_and_docstring(capsys):
    entries = dict(listing())
    assert {shown.split("(")[0] for shown in entries} == set(ATTACK_REGISTRY)
    ig = next(s for s in entries if s.startswith("inverting_gradients("))
    assert entries[ig] == "Inverting Gradients against one victim's upload."
    assert "iterations=1000" in ig and "shard_victims=False" in ig
    assert main(["list", "attacks"]) == 0  # through the installed entry point
    out = capsys.readouterr().out
    assert out.startswith("attacks (attack: {name: NAME, config: {...}}):")
    for shown, line in entries.items():
        assert f"  {shown}\n      {line}\n" in out


@pytest.mark.parametrize("name", sorted(ATTACK_REGISTRY))
def test_the_listed_config_keys_are_exactly_those_the_attack_accepts(name):
    """The listing is read from ``run.config_keys``; the check that refuses an
    unknown key names what it allows. The two must be the same set, or the
    listing would show a key the attack refuses, or hide one it takes."""
    run = ATTACK_REGISTRY[name]
    with pytest.raises(AttackConfigError, match="unknown key") as err:
        run.check_config({"no_such_key": 1})
    allowed = re.search(r"allowed: ([^;]*)", str(err.value)).group(1).split(", ")
    assert set(allowed) == set(run.config_keys)
