"""Config defaults that change a run's numbers, against the references they follow.

A default is what every config that omits the key runs with, and what the
checkpoints of earlier runs were hashed under; these are the values the
papers and docstrings name.
"""

import hashlib
import json

from fedsim.checkpoint import config_fingerprint
from fedsim.config import Config, load_config


def test_the_default_server_is_plain_fedavg():
    """Kills a default ``weighting`` of "uniform", ``aggregation`` "sender_mean",
    ``server_optimizer`` other than "sgd" or ``server_lr`` other than 1.

    Reference: McMahan et al. 2017, Alg 1 (w ← Σ_k n_k/n · w_k, every
    coordinate over the whole cohort) and the ``fedsim.server`` module
    docstring: plain FedAvg is SGD(lr = 1) on the pseudo-gradient −Δ̄.
    """
    t = Config().training
    assert (t.weighting, t.aggregation, t.server_optimizer, t.server_lr) == (
        "examples", "mean", "sgd", 1.0)


def test_the_default_shards_and_cohort_follow_mcmahan():
    """Kills a default ``classes_per_client`` other than 2 or ``clients_per_round``
    other than 10 (of 100 clients).

    Reference: McMahan et al. 2017 §3: the pathological non-IID split gives each
    of K = 100 clients 2 shards, and C = 0.1 of them train each round.
    """
    cfg = Config()
    assert cfg.data.classes_per_client == 2
    assert (cfg.data.num_clients, cfg.training.clients_per_round) == (100, 10)


def _hash_without(cfg, *paths):
    """The fingerprint rule written out: sha256 of the sorted JSON config without
    output, name, attack, training.rounds, the dense pruning section, the
    accounting section (no δ set), the unset server hyperparameters and ``paths``."""
    d = cfg.to_dict()
    for key in ("output", "name", "attack", "pruning", "accounting"):
        del d[key]
    del d["training"]["rounds"], d["training"]["dtype"]
    for key in ("server_momentum", "server_b1", "server_b2", "server_tau"):
        del d["training"][key]
    for section, key in paths:
        del d[section][key]
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def test_32_unrolled_steps_and_the_uniform_fill_are_the_defaults_earlier_runs_hash_under():
    """Kills ``UNROLL_STEPS = 16`` and a default ``observer.fill`` of "sorted_cut".

    Reference: the ``fedsim.checkpoint._as_hashed_before`` docstring:
    ``training.unroll_steps`` is hashed only where it is not 32, "the unrolling
    every earlier run used", and ``uniform`` is the new default fill (hashed
    where clients are observed). So a config without the keys hashes as one with
    ``unroll_steps`` 32 and no such key, and as one that sets the fill to
    uniform; a config observing clients hashes its fill.
    """
    plain = load_config(None, ["data.dataset=synthetic"])
    assert plain.training.unroll_steps == 32
    explicit = load_config(None, ["data.dataset=synthetic", "training.unroll_steps=32"])
    expected = _hash_without(explicit, ("training", "unroll_steps"), ("observer", "fill"))
    assert config_fingerprint(plain) == config_fingerprint(explicit) == expected
    observed = ["data.dataset=synthetic", "observer.clients=[0]", "observer.rounds=[0]"]
    assert config_fingerprint(load_config(None, observed)) == config_fingerprint(
        load_config(None, observed + ["observer.fill=uniform"]))
    assert load_config(None, observed).observer.fill == "uniform"
