"""Defense specs: what a defense was built from, in full (fedsim.defense_spec)."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedsim.checkpoint import CheckpointError, check_hand_defenses, hand_defense_specs, make_meta
from fedsim.config import ConfigError
from fedsim.defense_spec import describe, factory_spec
from fedsim.hooks import Defense, build_defense, chain, mask_around, spec_of
from fedsim.simulation import Simulation
from tests.fedsim.helpers import small_config, small_dataset


class _Pair(NamedTuple):
    a: object
    b: object


def test_describe_is_equal_for_equal_values_and_differs_for_different_ones():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert describe(x) == describe(x.copy()) == describe(jnp.asarray(x))
    y = x.copy()
    y[2, 3] += 1e-6  # one element, far below numpy's printed precision
    assert describe(y) != describe(x)
    assert describe(x.reshape(4, 3)) != describe(x)  # same bytes, other shape
    assert describe(x.astype(np.float64)) != describe(x)
    assert describe(np.float32(0.5)) == describe(0.5) == "0.5"
    assert describe(_Pair(x, {"k": 1})) == describe(_Pair(x.copy(), {"k": 1}))
    assert describe(_Pair(x, {"k": 1})) != describe(_Pair(x, {"k": 2}))
    assert describe({"b": 1, "a": 2}) == describe({"a": 2, "b": 1})  # key order is not content
    assert describe([1, 2]) != describe((1, 2))
    assert describe(jax.random.key(0)) != describe(jax.random.key(1))


def test_factory_spec_fills_in_defaults():
    def factory(p, *, scale=2.0, mode="flat"):
        return p

    assert factory_spec("f", factory, (0.3,), {"mode": "x"}) == "f(p=0.3, scale=2.0, mode='x')"
    assert factory_spec("f", factory, (), {"p": 0.3}) == factory_spec("f", factory, (0.3,), {})


def test_a_registered_factory_gives_its_defense_a_spec_called_directly_or_by_name():
    from defenses.dp import dp_gaussian

    direct = dp_gaussian(1.0)
    by_name = build_defense("dp_gaussian", noise_multiplier=1.0)
    assert direct.spec == by_name.spec == (
        "dp_gaussian(noise_multiplier=1.0, clip_norm=1.0, clipping='flat')")
    assert direct._replace(name="mine").spec == direct.spec  # renaming keeps what it is
    assert dp_gaussian(1.0, clip_norm=2.0).spec != direct.spec
    hand = Defense(init=lambda p: (), apply=lambda v, s, **k: (v, s), stage="upload", name="h")
    assert hand.spec == "" and spec_of(hand) == "h"


def test_chains_and_masks_carry_their_parts_specs():
    from defenses.pruning import gc

    both = chain(gc(0.3), gc(0.5))
    assert both.spec == "gc(p=0.3)+gc(p=0.5)"
    assert mask_around({"w": jnp.ones(3)}, gc(0.3)).spec == "gc(p=0.3)+global_mask"


def test_defenses_of_one_name_but_other_makings_have_other_specs():
    """What a name leaves out: a channel's Σ_D, a mask's pattern, PriPrune's λ."""
    from defenses.channels import natural_channel
    from defenses.pruning import masked_gradient, priprune

    x = small_dataset().x_train
    one, two = (natural_channel(10.0, data=x[:200]), natural_channel(10.0, data=x[200:400]))
    assert one.name == two.name and one.spec != two.spec
    assert natural_channel(10.0, data=x[:200].copy()).spec == one.spec
    m1 = {"w": jnp.array([1.0, 0.0, 1.0])}
    m2 = {"w": jnp.array([1.0, 1.0, 0.0])}
    assert masked_gradient(m1).name == masked_gradient(m2).name
    assert masked_gradient(m1).spec != masked_gradient(m2).spec
    assert masked_gradient(m1).spec == masked_gradient({"w": np.array([1.0, 0.0, 1.0],
                                                                      np.float32)}).spec
    assert priprune(lambda_pri=10.0).name == priprune(lambda_pri=0.0).name
    assert priprune(lambda_pri=10.0).spec != priprune(lambda_pri=0.0).spec


def test_a_checkpoint_refuses_a_channel_calibrated_on_other_data(tmp_path):
    """Same name, same κ, other Σ_D: resuming under it would continue another run."""
    from defenses.channels import natural_channel

    ds = small_dataset()
    cfg = small_config()

    def sim(data):
        return Simulation(cfg, dataset=ds, defenses={"data": natural_channel(10.0, data=data)})

    written = sim(ds.x_train[:200])
    meta = make_meta(cfg, written, written.init_state())
    assert meta["hand_defenses"] == {"data": "natural_channel(kappa=10)"}
    assert meta["hand_defense_specs"] == hand_defense_specs(written)
    check_hand_defenses(meta, sim(ds.x_train[:200].copy()), tmp_path)  # the same making
    with pytest.raises(CheckpointError, match=r"data: natural_channel\(kappa=10\.0, statistics="
                                              r"None, data=array\[200, 16, 16, 1\]float32#"):
        check_hand_defenses(meta, sim(ds.x_train[200:400]), tmp_path)


def test_a_checkpoint_with_names_only_is_still_checked_by_name(tmp_path):
    """Checkpoints written before specs were recorded carry only the names."""
    from defenses.pruning import gc

    ds = small_dataset()
    sim = Simulation(small_config(), dataset=ds, defenses={"upload": gc(0.3)})
    check_hand_defenses({"hand_defenses": {"upload": "gc(p=0.3)"}}, sim, tmp_path)
    with pytest.raises(CheckpointError, match=r"upload: gc\(p=0\.5\) then, gc\(p=0\.3\) now"):
        check_hand_defenses({"hand_defenses": {"upload": "gc(p=0.5)"}}, sim, tmp_path)


def test_simulation_names_what_is_wrong_with_its_config_or_hand_defenses():
    cfg, ds = small_config(), small_dataset()
    d = build_defense("dp_gaussian", noise_multiplier=1.0)
    # Before: "dictionary update sequence element #0 ...", naming neither.
    for bad in ([d], "dp_gaussian", {"example": "dp_gaussian"}):
        with pytest.raises(TypeError, match=r"Simulation\(defenses=\.\.\.\) takes a mapping "
                                            r"\{stage: Defense\}"):
            Simulation(cfg, dataset=ds, defenses=bad)
    # Before: accepted, and the example-stage defense would have run at the upload.
    with pytest.raises(ValueError, match=r"acts at stage 'example' but was given under 'upload'"):
        Simulation(cfg, dataset=ds, defenses={"upload": d})
    with pytest.raises(TypeError, match=r"Simulation needs a fedsim.config.Config"):
        Simulation({"seed": 0}, dataset=ds)
    assert Simulation(cfg, dataset=ds, defenses={d.stage: d}).defenses == {"example": d}


def test_simulation_refuses_a_dataset_of_another_image_size_than_the_configs():
    ds = small_dataset()  # 16x16
    # Before: accepted; the run trained on 16x16 images while its config, results
    # and any channel calibrated on the run's data said 8x8.
    with pytest.raises(ConfigError, match=r"config key 'data.image_size' \(8\) does not match "
                                          r"the dataset .* images are 16x16"):
        Simulation(small_config(**{"data.image_size": 8}), dataset=ds)
    assert Simulation(small_config(**{"data.image_size": 16}), dataset=ds).dataset is ds
    assert Simulation(small_config(), dataset=ds).dataset is ds  # image_size unset
