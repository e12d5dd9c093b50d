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
