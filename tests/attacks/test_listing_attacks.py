"""``fedsim list attacks``: the section the attack package contributes (entry point
``fedsim.listings``), one entry per registered attack."""

from attacks.api import ATTACK_REGISTRY, listing
from fedsim.cli import main


def test_every_registered_attack_is_listed_with_its_first_docstring_line(capsys):
    entries = dict(listing())
    assert set(entries) == set(ATTACK_REGISTRY)
    assert entries["inverting_gradients"] == "Inverting Gradients against one victim's upload."
    assert main(["list", "attacks"]) == 0  # through the installed entry point
    out = capsys.readouterr().out
    assert out.startswith("attacks (attack: {name: NAME, config: {...}}):")
    for name, line in entries.items():
        assert f"  {name}\n      {line}\n" in out
