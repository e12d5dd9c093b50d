"""Checks of attacks/sgi.py (paper 002, Chu et al. 2023, Alg 2)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attacks import run_attack
from defenses.pruning import random_mask
from fedsim.client import masked_mean_loss
from fedsim.typing import Observation


def test_support_mask_of_a_weight_upload_drops_the_withheld_weights():
    """Kills S2 (sgi.py ``run_many``: ``from_weight_upload(o) if u == "weights" else o`` → ``o``).

    Reference: Alg 2 lines 3–4 and the sgi.py docstring, in numpy. A weight
    upload ŵ = (w_g + Δ) ⊙ k (k: the client's keep mask) is carried as
    Δ' = ŵ − w_g. SGI attacks the view Δ' ⊙ 1[ŵ ≠ 0], whose support (the
    ``support`` mask) is 1[ŵ ≠ 0 and Δ' ≠ 0]; a withheld weight (ŵ = 0,
    Δ' = −w_g ≠ 0) is not in it. ``extras["mask_density"]`` is that mask's
    mean over all coordinates (here ≈ 0.7 of the dense density, not 1).
    """
    rng = np.random.default_rng(0)
    params = {"dense": {"kernel": jnp.asarray(rng.normal(0, 1, (48, 5)), jnp.float32),
                        "bias": jnp.asarray(rng.normal(0, 1, 5), jnp.float32)}}

    def apply_fn(p, x):
        return x.reshape(x.shape[0], -1) @ p["dense"]["kernel"] + p["dense"]["bias"]

    x = jax.random.uniform(jax.random.key(1), (1, 4, 4, 3))
    y = jnp.array([4])
    g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, jnp.ones(1))
    delta = jax.tree_util.tree_map(lambda a: -0.25 * a, g)
    keep = random_mask(jax.random.key(5), params, 0.3)
    carried = jax.tree_util.tree_map(lambda d, w, k: (w + d) * k - w, delta, params, keep)
    obs = Observation(carried, params, apply_fn, "fedsgd", 0.25, 1, 1, 1, y, (4, 4, 3), 5)
    rec = run_attack("sgi", obs, {"iterations": 1, "upload": "weights", "mask": "support"},
                     jax.random.key(7))
    w_hat = [np.asarray(w, np.float64) + np.asarray(c, np.float64) for w, c in
             zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(carried))]
    support = [(wh != 0) & (np.asarray(c) != 0) for wh, c in
               zip(w_hat, jax.tree_util.tree_leaves(carried))]
    want = sum(int(s.sum()) for s in support) / sum(s.size for s in support)
    dense = np.mean(np.concatenate([np.asarray(c).ravel() != 0
                                    for c in jax.tree_util.tree_leaves(carried)]))
    assert want < 0.9 * dense  # the withheld weights are a visible share
    assert rec.extras["mask_density"] == pytest.approx(want, rel=1e-6)
