"""Observed uploads written to disk and read back (fedsim.observation_store)."""

import chex
import jax
import numpy as np
import pytest

from fedsim.checkpoint import config_fingerprint
from fedsim.observation_store import ObservationStoreError, load_round, round_path, save_round
from fedsim.simulation import Simulation

from .helpers import small_config, small_dataset


@pytest.fixture(scope="module")
def observed_round():
    cfg = small_config(**{"observer.clients": [1, 4], "observer.rounds": [1]})
    sim = Simulation(cfg, dataset=small_dataset(), donate=False)
    state, _ = sim.run_round(sim.init_state(), 0)
    _, res = sim.run_round(state, 1)
    assert [u.observation.client_id for u in res.observed] == [1, 4]
    return cfg, sim, res.observed


def _load(directory, cfg, sim, clients=(1, 4), fingerprint=None):
    return load_round(directory, 1, fingerprint or config_fingerprint(cfg),
                      jax.eval_shape(sim.init_state).params, sim.apply_fn, list(clients))


def test_a_round_reads_back_as_it_was_observed(tmp_path, observed_round):
    cfg, sim, uploads = observed_round
    path = save_round(tmp_path, uploads, config_fingerprint(cfg))
    assert path == round_path(tmp_path, 1) and [p.name for p in tmp_path.iterdir()] == [path.name]
    loaded = _load(tmp_path, cfg, sim)
    for want, got in zip(uploads, loaded):
        o, g = want.observation, got.observation
        chex.assert_trees_all_equal(g.update, o.update)
        chex.assert_trees_all_equal(g.params, o.params)
        np.testing.assert_array_equal(g.labels, o.labels)
        np.testing.assert_array_equal(got.x, want.x)
        np.testing.assert_array_equal(got.y, want.y)
        assert g.apply_fn is sim.apply_fn
        for name in ("algorithm", "lr", "local_steps", "batch_size", "num_examples",
                     "input_shape", "num_classes", "client_id", "round"):
            assert getattr(g, name) == getattr(o, name), name


def test_a_missing_foreign_or_mismatched_round_is_refused_by_name(tmp_path, observed_round):
    cfg, sim, uploads = observed_round
    with pytest.raises(ObservationStoreError, match=r"round_000001\.npz does not exist"):
        _load(tmp_path, cfg, sim)
    save_round(tmp_path, uploads, config_fingerprint(cfg))
    with pytest.raises(ObservationStoreError, match="different config"):
        _load(tmp_path, cfg, sim, fingerprint="0" * 16)
    with pytest.raises(ObservationStoreError, match=r"holds clients \[1, 4\], the config observes \[1, 2\]"):
        _load(tmp_path, cfg, sim, clients=(1, 2))
    # A file an earlier fingerprint wrote is read where the config accepts it.
    save_round(tmp_path, uploads, "1" * 16)
    assert len(_load(tmp_path, cfg, sim, fingerprint=("0" * 16, "1" * 16))) == 2
    with pytest.raises(ObservationStoreError, match=r"\(fingerprint 1{16} != 0{16}\)"):
        _load(tmp_path, cfg, sim, fingerprint=("0" * 16,))
    save_round(tmp_path, uploads, config_fingerprint(cfg))
    wider = Simulation(small_config(**{"model.name": "lenet"}), dataset=small_dataset())
    with pytest.raises(ObservationStoreError, match="does not match the model's parameters"):
        _load(tmp_path, cfg, wider)
    round_path(tmp_path, 1).write_bytes(b"garbage")
    with pytest.raises(ObservationStoreError, match="unreadable or corrupted"):
        _load(tmp_path, cfg, sim)


def test_uploads_of_several_rounds_are_refused(tmp_path, observed_round):
    cfg, _, uploads = observed_round
    other = uploads[1]._replace(observation=uploads[1].observation._replace(round=2))
    with pytest.raises(ValueError, match=r"one round, got rounds \[1, 2\]"):
        save_round(tmp_path, [uploads[0], other], config_fingerprint(cfg))
