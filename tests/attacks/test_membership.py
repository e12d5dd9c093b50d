"""Membership inference: AUC against a brute-force count, and attacks beat chance on an overfit model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attacks import membership as MIA
from fedsim.data import synthetic_dataset
from fedsim import models
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


def test_a_class_the_known_set_lacks_is_scored_like_the_others():
    # The one-hot column of class 3 is 0 throughout the attacker's known set: its
    # std of 0 (+1e-6) turned an example of class 3 into an input of 1e6, which
    # scored about -1e6, a non-member whatever its loss.
    rng = np.random.default_rng(3)

    def feats(n, shift, classes):
        f = _separable_features(rng, n, shift)
        return f._replace(label_onehot=jax.nn.one_hot(rng.choice(classes, n), 4))

    known = (0, 1, 2)
    net, stats = MIA.train_learned_attack(feats(40, -1.0, known), feats(40, 1.0, known),
                                          jax.random.key(0), steps=60)
    test_m = [feats(15, -1.0, known), feats(15, -1.0, (3,))]
    test_n = [feats(15, 1.0, known), feats(15, 1.0, (3,))]
    unseen, _ = MIA._standardise(test_m[1], stats)
    # Centred only: 1 in its own column, as -1 in the others' (their mean 1/3, std ~0.47).
    np.testing.assert_allclose(np.asarray(unseen.label_onehot[:, 3]), 1.0)
    assert float(jnp.max(jnp.abs(unseen.label_onehot))) < 2
    scores = lambda fs: np.concatenate([MIA.learned_scores(net, stats, f) for f in fs])
    assert np.max(np.abs(scores(test_m + test_n))) < 1e3
    assert MIA.auc(scores(test_m), scores(test_n)) > 0.95


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


def _model(name):
    model = build_model(name)
    f = make_apply_fn(model)
    return f, init_params(model, (16, 16, 1), jax.random.key(0))


def _examples(n, seed=1):
    x = jax.random.uniform(jax.random.key(seed), (n, 16, 16, 1))
    return x, jnp.arange(n, dtype=jnp.int32) % 10


@pytest.mark.parametrize("name", ["mlp", "lenet5"])
def test_features_in_chunks_equal_one_call(name):
    f, p = _model(name)
    x, y = _examples(23)  # 23 = 4 chunks of 5 + 3, padded
    whole = MIA.features(f, p, x, y, 10, batch_size=64)
    chunked = MIA.features(f, p, x, y, 10, batch_size=5)
    for a, b in zip(chunked, whole):
        assert a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(MIA.gradient_norm_scores(f, p, x, y, 10, batch_size=5),
                               -np.linalg.norm(np.asarray(whole.last_layer_grad), axis=1),
                               rtol=1e-5)


def test_loss_scores_equal_one_example_at_a_time():
    f, p = _model("lenet5")
    x, y = _examples(11)
    logits = np.stack([np.asarray(f(p, x[i:i + 1]))[0] for i in range(11)]).astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    expected = -(logz - logits[np.arange(11), np.asarray(y)])  # −cross-entropy, by hand
    np.testing.assert_allclose(MIA.loss_scores(f, p, x, y, batch_size=4), expected, rtol=1e-5)


def test_chunked_features_plan_the_memory_of_a_chunk_not_of_the_set():
    from fedsim import memory
    f, p = _model("conv2")
    plan = lambda n, bs: memory.planned_bytes(MIA._features, f, p, *_examples(n), 10, bs,
                                              models.trace_settings())
    small, large = plan(256, 256), plan(2048, 256)
    if small is None:
        pytest.skip("this backend gives no memory analysis")
    # What the set's size must add: the features themselves (4 outputs per example).
    per_example = sum(int(np.prod(a.shape[1:])) for a in
                      MIA.features(f, p, *_examples(2), 10)) * 4
    assert large - small <= 1.5 * (2048 - 256) * per_example
    assert plan(2048, 4096) > 3 * large  # all at once: the activations of 2,048 examples


@pytest.mark.parametrize("x_shape,y_shape,batch_size,match", [
    ((5, 16, 16, 1), (4,), 8, "same number of examples"),
    ((5, 16, 16, 1), (5, 1), 8, "same number of examples"),
    ((0, 16, 16, 1), (0,), 8, "no examples"),
    ((5, 16, 16, 1), (5,), 0, "batch_size"),
    ((5, 16, 16, 1), (5,), 2.5, "batch_size"),
])
def test_bad_example_sets_are_named(x_shape, y_shape, batch_size, match):
    f, p = _model("mlp")
    x, y = jnp.zeros(x_shape), jnp.zeros(y_shape, jnp.int32)
    for call in (lambda: MIA.loss_scores(f, p, x, y, batch_size=batch_size),
                 lambda: MIA.gradient_norm_scores(f, p, x, y, 10, batch_size=batch_size),
                 lambda: MIA.features(f, p, x, y, 10, batch_size=batch_size)):
        with pytest.raises(ValueError, match=match):
            call()


@pytest.mark.parametrize("y,match", [
    # Before: optax's dtype message, not naming y.
    (jnp.zeros(5, jnp.float32), r"membership: y must be integer class labels, got float32"),
    # Before: NaN scores (>= C) or finite wrong ones (< 0), without a word.
    (jnp.asarray([0, 1, 12, 3, 4]), r"membership: y must be classes in \[0, 10\); got labels "
                                    r"from 0 to 12"),
    (jnp.asarray([0, -1, 2, 3, 4]), r"y must be classes in \[0, (10|C)\); got labels from -1"),
])
def test_labels_the_scores_would_misread_are_named(y, match):
    f, p = _model("mlp")
    x = jnp.zeros((5, 16, 16, 1))
    for call in (lambda: MIA.loss_scores(f, p, x, y),
                 lambda: MIA.gradient_norm_scores(f, p, x, y, 10),
                 lambda: MIA.features(f, p, x, y, 10)):
        with pytest.raises(ValueError, match=match):
            call()


def test_features_trace_again_inside_a_conv_implementation_block():
    # Jitted once per model, they must not reuse the other implementation's
    # executable (benchmarks/diagnose_mia_im2col.py compares the two).
    f, p = _model("conv2")
    x, y = _examples(6)
    before = MIA._features._cache_size()
    default = MIA.features(f, p, x, y, 10)
    with models.conv_implementation("xla"):
        xla = MIA.features(f, p, x, y, 10)
    assert MIA._features._cache_size() == before + 2
    # One example at a time, the gradient feature is an im2col GEMM by default
    # (IM2COL_MAX_BATCH), XLA's convolution inside the block: they round differently.
    assert not np.array_equal(default.last_layer_grad, xla.last_layer_grad)


def test_features_are_float32_and_the_same_under_x64():
    # jax.nn.one_hot without a dtype is float64 under jax_enable_x64.
    model = build_model("mlp", 10)
    apply_fn = make_apply_fn(model)
    params = init_params(model, (4, 4, 1), jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (3, 4, 4, 1), jnp.float32)
    y = jnp.array([0, 4, 9])
    plain = MIA._chunk_features(apply_fn, params, x, y, 10)
    with jax.enable_x64(True):
        wide = MIA._chunk_features(apply_fn, params, x, y, 10)
    for a, b in zip(plain, wide):
        assert a.dtype == b.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_the_learned_attack_trains_the_same_under_x64():
    # optax's Adam computed its bias correction in float64 under
    # jax_enable_x64 (fedsim.x64), and the labels were float64.
    rng = np.random.default_rng(0)  # float32 features, made once without x64
    mem, non = _separable_features(rng, 20, -1.0), _separable_features(rng, 20, 1.0)

    def fit():
        net, stats = MIA.train_learned_attack(mem, non, jax.random.key(0), steps=30)
        return net, MIA.learned_scores(net, stats, mem)

    plain_net, plain = fit()
    with jax.enable_x64(True):
        wide_net, wide = fit()
    for a, b in zip(jax.tree_util.tree_leaves(plain_net), jax.tree_util.tree_leaves(wide_net)):
        assert a.dtype == b.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    np.testing.assert_array_equal(wide, plain)
