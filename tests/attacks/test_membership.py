"""Membership inference: AUC against a brute-force count, and attacks beat chance on an overfit model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attacks import membership as MIA
from fedsim.data import synthetic_dataset
from fedsim.models import build_model, init_params, make_apply_fn
from tests.attacks.helpers import train_full_batch


def test_auc_matches_pairwise_count():
    rng = np.random.default_rng(0)
    a, b = rng.normal(1, 1, 50).round(1), rng.normal(0, 1, 40).round(1)
    brute = np.mean([(x > y) + 0.5 * (x == y) for x in a for y in b])
    assert MIA.auc(a, b) == pytest.approx(brute)
    assert MIA.auc([2, 3], [0, 1]) == 1.0 and MIA.auc([0], [0]) == 0.5
    with pytest.raises(ValueError, match="NaN"):
        MIA.auc([np.nan], [0.0])


@pytest.mark.slow
def test_attacks_beat_chance_on_overfit_model():
    ds = synthetic_dataset(seed=1, image_size=16, num_train=400, num_test=10)
    x, y = jnp.asarray(ds.x_train), jnp.asarray(ds.y_train)
    # Random labels on half the data make members memorised, not generalised.
    y = y.at[:200].set(jnp.asarray(np.random.default_rng(0).integers(0, 10, 200)))
    model = build_model("mlp")
    f = make_apply_fn(model)
    p = init_params(model, ds.input_shape, jax.random.key(0))
    mem = np.r_[0:100]       # members (trained on); 0..49 known to the attacker
    non = np.r_[200:300]     # non-members with equally random labels; 200..249 known
    y = y.at[200:300].set(jnp.asarray(np.random.default_rng(1).integers(0, 10, 100)))
    p = train_full_batch(f, p, x[mem], y[mem], steps=400)
    test_m, test_n = mem[50:], non[50:]
    assert MIA.auc(MIA.loss_scores(f, p, x[test_m], y[test_m]), MIA.loss_scores(f, p, x[test_n], y[test_n])) > 0.7
    assert MIA.auc(MIA.gradient_norm_scores(f, p, x[test_m], y[test_m], 10),
                   MIA.gradient_norm_scores(f, p, x[test_n], y[test_n], 10)) > 0.7
    feats = lambda idx: MIA.features(f, p, x[idx], y[idx], 10)
    net, stats = MIA.train_learned_attack(feats(mem[:50]), feats(non[:50]), jax.random.key(0))
    got = MIA.auc(MIA.learned_scores(net, stats, feats(test_m)), MIA.learned_scores(net, stats, feats(test_n)))
    assert got > 0.7, got


def _separable_features(rng, n, shift):
    """Features whose loss column alone separates members (shift < 0) from non-members."""
    return MIA.MIAFeatures(
        jnp.asarray(rng.random((n, 4)), jnp.float32),
        jnp.asarray(rng.normal(shift, 0.1, (n, 1)), jnp.float32),
        jnp.asarray(rng.normal(size=(n, 6)), jnp.float32),
        jax.nn.one_hot(rng.integers(0, 4, n), 4))


def test_learned_attack_separates_and_compiles_once_for_new_data():
    rng = np.random.default_rng(0)
    sizes = []
    for k in range(2):  # fresh features of the same shapes each time
        mem, non = _separable_features(rng, 40, -1.0), _separable_features(rng, 40, 1.0)
        net, stats = MIA.train_learned_attack(mem, non, jax.random.key(k), steps=60)
        sizes.append(MIA._fit_attack._cache_size())
        test_m, test_n = _separable_features(rng, 30, -1.0), _separable_features(rng, 30, 1.0)
        assert MIA.auc(MIA.learned_scores(net, stats, test_m), MIA.learned_scores(net, stats, test_n)) > 0.95
    # The features are arguments of the jitted fit, not baked-in constants.
    assert sizes[1] == sizes[0]


@pytest.mark.parametrize("kwargs, match", [
    ({"steps": 0}, "steps"), ({"steps": 2.5}, "steps"), ({"steps": True}, "steps"),
    ({"lr": 0.0}, "lr"), ({"lr": float("nan")}, "lr"), ({"lr": "1e-3"}, "lr"),
])
def test_learned_attack_refuses_bad_settings(kwargs, match):
    rng = np.random.default_rng(1)
    mem, non = _separable_features(rng, 8, -1.0), _separable_features(rng, 8, 1.0)
    with pytest.raises(ValueError, match=match):
        MIA.train_learned_attack(mem, non, jax.random.key(0), **kwargs)


def test_learned_attack_refuses_non_finite_features():
    rng = np.random.default_rng(2)
    mem, non = _separable_features(rng, 8, -1.0), _separable_features(rng, 8, 1.0)
    mem = mem._replace(loss=mem.loss.at[3, 0].set(jnp.nan))
    with pytest.raises(ValueError, match="NaN or inf"):
        MIA.train_learned_attack(mem, non, jax.random.key(0))
