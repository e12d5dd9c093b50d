"""Checks of attacks/membership.py, each against an independent computation."""

import jax
import jax.numpy as jnp
import numpy as np

from attacks import membership as MIA

D, K = 12, 4


def _linear(params, x):
    d = params["dense"]
    return x.reshape(x.shape[0], -1) @ d["kernel"] + d["bias"]


def test_gradient_norm_score_is_the_last_kernels_gradient_norm_in_closed_form():
    """Kills B3 (membership.py ``_last_layer_grads``: the bias gradient appended to the
    kernel's).

    Reference: for softmax regression z = xW + β and ℓ = CE(z, y),
    ∂ℓ/∂W = x ⊗ (p − e_y), so ‖∇_W ℓ‖₂ = ‖x‖₂·‖p − e_y‖₂ (numpy, float64). The
    score is −‖∇_{W_last} ℓ‖₂ (docstring of :func:`gradient_norm_scores`): the
    kernel's gradient only, not the bias's (which would add ‖p − e_y‖²).
    """
    rng = np.random.default_rng(0)
    w, beta = rng.normal(0, 0.5, (D, K)), rng.normal(0, 0.5, K)
    params = {"dense": {"kernel": jnp.asarray(w, jnp.float32),
                        "bias": jnp.asarray(beta, jnp.float32)}}
    x = rng.uniform(0, 1, (7, 2, 2, 3)).astype(np.float32)
    y = np.array([0, 1, 2, 3, 0, 2, 1], np.int32)
    xf = x.reshape(7, -1).astype(np.float64)
    z = xf @ w + beta
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = -np.linalg.norm(xf, axis=1) * np.linalg.norm(p - np.eye(K)[y], axis=1)
    got = MIA.gradient_norm_scores(_linear, params, jnp.asarray(x), jnp.asarray(y), K)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _features(rng, n, shift):
    return MIA.MIAFeatures(
        jnp.asarray(rng.normal(shift, 1, (n, 3)), jnp.float32),
        jnp.asarray(rng.normal(shift, 1, (n, 1)), jnp.float32),
        jnp.asarray(rng.normal(0, 1, (n, 5)), jnp.float32),
        jax.nn.one_hot(rng.integers(0, 3, n), 3))


def test_learned_attack_features_are_centred_and_scaled_per_column():
    """Kills B1 (membership.py ``_standardise``: ``(v − m) / s`` → ``v / s``, no centring).

    Reference: the docstring of :func:`_standardise` ("standardised per column"),
    checked two ways. (1) numpy: each column of the attacker's standardised
    known set has mean 0 and standard deviation 1. (2) a consequence: shifting
    every feature of the known and the scored sets by the same constant leaves
    the learned scores unchanged (same network key, same training), since the
    network only sees standardised features.
    """
    rng = np.random.default_rng(4)
    mem, non = _features(rng, 24, -1.0), _features(rng, 24, 1.0)
    test = _features(rng, 10, 0.0)
    both = MIA.MIAFeatures(*[jnp.concatenate([a, b]) for a, b in zip(mem, non)])
    std, _ = MIA._standardise(both)
    for v in std:
        np.testing.assert_allclose(np.asarray(v, np.float64).mean(0), 0.0, atol=1e-5)
        np.testing.assert_allclose(np.asarray(v, np.float64).std(0), 1.0, rtol=1e-4)
    net, stats = MIA.train_learned_attack(mem, non, jax.random.key(0), steps=20)
    shift = lambda f: MIA.MIAFeatures(*[v + 3.0 for v in f])
    net2, stats2 = MIA.train_learned_attack(shift(mem), shift(non), jax.random.key(0), steps=20)
    a = MIA.learned_scores(net, stats, test)
    b = MIA.learned_scores(net2, stats2, shift(test))
    np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-3)
