"""Checkpoints: every setting that changes a run's numbers is in the fingerprint,
and a given round restores that round's state.

Reference: the ``config_fingerprint`` docstring ("hash of everything in the
config that changes the numbers of a run", leaving out only ``output.*``,
``training.rounds``, ``name`` and ``attack``) and the module docstring (a
resumed run gives the same numbers). A setting hashed away lets a checkpoint
resume under another setting, and the run then reports numbers that neither
setting gives.
"""

import dataclasses

import numpy as np
import pytest

from fedsim.checkpoint import Checkpointer, accepted_fingerprints, config_fingerprint
from fedsim.config import Config

SECTIONS = ("data", "model", "training", "eval", "pruning", "observer", "accounting")


def _other(value, f: dataclasses.Field):
    """Another value of the field's kind (no validation is needed to hash a config)."""
    choices = f.metadata.get("choices")
    if choices:
        return next(c for c in choices if c != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.5
    if isinstance(value, list):
        return value + [3]
    if value is None:
        return 1e-5 if f.name.endswith("delta") else 3
    if isinstance(value, str):
        return value + "x"
    raise AssertionError(f"no other value for {f.name}={value!r}")


def _base() -> Config:
    """Defaults, with the sections whose keys only matter together switched on:
    an observer (its ``fill``), an iterative pruning scheme (its reconfigurations)."""
    cfg = Config()
    return dataclasses.replace(
        cfg, observer=dataclasses.replace(cfg.observer, clients=[0], rounds=[0]),
        pruning=dataclasses.replace(cfg.pruning, scheme="prunefl", reconfigurations=2))


def _variants():
    base = _base()
    yield "seed", dataclasses.replace(base, seed=base.seed + 1)
    yield "defenses[0].clip_norm", (
        dataclasses.replace(base, defenses=[{"name": "dp_gaussian", "clip_norm": 1.0}]),
        dataclasses.replace(base, defenses=[{"name": "dp_gaussian", "clip_norm": 1.5}]))
    for section in SECTIONS:
        sec = getattr(base, section)
        for f in dataclasses.fields(sec):
            if section == "training" and f.name == "rounds":
                continue  # documented: a finished run may be extended
            new = dataclasses.replace(sec, **{f.name: _other(getattr(sec, f.name), f)})
            yield f"{section}.{f.name}", dataclasses.replace(base, **{section: new})


@pytest.mark.parametrize("key,variant", list(_variants()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_setting_that_changes_the_numbers_changes_the_fingerprint(key, variant):
    """Kills hashing away ``seed`` (ck1), a defense's non-integral float read as
    an int (ck2), ``training.dtype`` float64 (ck3), ``observer.fill`` (ck4),
    ``pruning.reconfigurations`` of an iterative scheme (ck6), ``accounting``'s δ
    (ck7) and a non-default ``training.unroll_steps`` (ck8).

    Reference: the ``config_fingerprint`` docstring (see the module docstring):
    each such setting changes the run's numbers (or its ε), so a checkpoint of
    one must not be accepted by the other.
    """
    base, other = variant if isinstance(variant, tuple) else (_base(), variant)
    assert config_fingerprint(other) != config_fingerprint(base), key
    assert config_fingerprint(base) not in accepted_fingerprints(other), key


def test_restore_reads_the_round_it_is_asked_for(tmp_path):
    """Kills ``step = self.latest_round()`` (``rounds_done`` ignored).

    Reference: the ``restore`` docstring: the newest *or given* checkpoint. With
    rounds 1 and 2 saved, asking for round 1 gives round 1's arrays.
    """
    ck = Checkpointer(tmp_path / "ck", max_to_keep=3)
    states = {r: {"w": np.full(3, float(r), np.float32), "n": np.int32(r)} for r in (1, 2)}
    for r, s in states.items():
        ck.save(r, s, {"config_fingerprint": "f"})
    try:
        for r in (1, 2):
            got, meta = ck.restore(states[2], "f", rounds_done=r)
            np.testing.assert_array_equal(np.asarray(got["w"]), states[r]["w"])
            assert int(got["n"]) == r
        latest, _ = ck.restore(states[1], "f")
        np.testing.assert_array_equal(np.asarray(latest["w"]), states[2]["w"])
    finally:
        ck.close()


def test_a_server_hyperparameter_at_its_default_hashes_as_before_the_keys():
    """``training.server_b1`` etc. (2026-12-02): null and the chosen optimizer's
    own default build the optimizer every earlier run used, so both keep the
    fingerprint a config without the keys had; another value changes it (the
    parametrized test above), and so does the same value where it is not that
    optimizer's default (yogi's β2 is 0.999, adam's 0.99)."""
    from fedsim.config import load_config

    def fingerprint(*overrides):
        return config_fingerprint(load_config(None, list(overrides)))

    for name, b2 in (("adam", 0.99), ("yogi", 0.999), ("fedyogi", 0.999)):
        plain = fingerprint(f"training.server_optimizer={name}")
        assert fingerprint(f"training.server_optimizer={name}", f"training.server_b2={b2}") == plain
        assert fingerprint(f"training.server_optimizer={name}", "training.server_tau=1e-3") == plain
    assert fingerprint("training.server_optimizer=yogi", "training.server_b2=0.99") != \
        fingerprint("training.server_optimizer=yogi")
    assert fingerprint("training.server_optimizer=momentum", "training.server_momentum=0.9") == \
        fingerprint("training.server_optimizer=momentum")
