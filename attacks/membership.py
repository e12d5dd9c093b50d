"""Membership inference: threshold attacks and a learned white-box attack.

Paper 000 §6.1 evaluates defenses with a white-box MIA (Nasr et al. 2019, ref.
[38]) by a *partial-knowledge* attacker who knows part of the training set.
Its inputs are four features of an example under the attacked model: the
ranked (sorted) posteriors, the classification loss, the gradient of the last
layer, and the one-hot true label; each goes through its own embedding
network and the concatenated embeddings through a 4-layer MLP.

* :func:`loss_scores`, :func:`gradient_norm_scores`: threshold attacks
  (Yeom et al. 2018: members have lower loss; gradient norm likewise). The
  score is "higher = more likely member"; AUC sweeps every threshold.
* :func:`train_learned_attack` / :func:`learned_scores`: the feature attack
  above. Stated deviations: embedding widths (64) and MLP widths
  (256-128-64-1) are ours (the paper does not give them); the attacker trains
  on its known members vs known non-members with Adam (lr 1e-3, full batch).
* :func:`auc`: ROC AUC by the Mann–Whitney rank statistic (ties count ½).

Guarantee: none (empirical attacks); AUC 0.5 = chance.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy.stats import rankdata

from attacks.labels import last_layer
from fedsim.client import cross_entropy


def auc(scores_members, scores_nonmembers) -> float:
    """ROC AUC that a member scores above a non-member (ties count ½)."""
    a = np.asarray(scores_members, np.float64).ravel()
    b = np.asarray(scores_nonmembers, np.float64).ravel()
    if a.size == 0 or b.size == 0:
        raise ValueError("auc needs at least one member and one non-member score")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("auc: scores contain NaN or inf")
    ranks = rankdata(np.concatenate([a, b]))
    u = ranks[: a.size].sum() - a.size * (a.size + 1) / 2
    return float(u / (a.size * b.size))


def per_example_losses(apply_fn, params, x, y) -> jax.Array:
    return cross_entropy(apply_fn(params, x), y)


def loss_scores(apply_fn, params, x, y) -> np.ndarray:
    """Membership score −loss (Yeom et al. 2018)."""
    return -np.asarray(per_example_losses(apply_fn, params, x, jnp.asarray(y)))


def _last_layer_grads(apply_fn, params, x, y, num_classes):
    def one(xi, yi):
        g = jax.grad(lambda p: cross_entropy(apply_fn(p, xi[None]), yi[None])[0])(params)
        return jnp.ravel(last_layer(g, num_classes)["kernel"])

    return jax.vmap(one)(x, jnp.asarray(y))


def gradient_norm_scores(apply_fn, params, x, y, num_classes: int) -> np.ndarray:
    """Membership score −‖∇_{W_last} ℓ(x, y)‖₂ (small gradients: seen in training)."""
    return -np.linalg.norm(np.asarray(_last_layer_grads(apply_fn, params, x, y, num_classes)), axis=1)


class MIAFeatures(NamedTuple):
    """The four white-box features of paper 000 §6.1 (per example)."""

    ranked_posteriors: jax.Array  # [n, K] softmax sorted descending
    loss: jax.Array               # [n, 1]
    last_layer_grad: jax.Array    # [n, P] flattened last-layer kernel gradient
    label_onehot: jax.Array       # [n, K]


def features(apply_fn, params, x, y, num_classes: int) -> MIAFeatures:
    y = jnp.asarray(y)
    logits = apply_fn(params, x)
    post = -jnp.sort(-jax.nn.softmax(logits, -1), axis=-1)
    loss = cross_entropy(logits, y)[:, None]
    grads = _last_layer_grads(apply_fn, params, x, y, num_classes)
    return MIAFeatures(post, loss, grads, jax.nn.one_hot(y, num_classes))


class AttackNet(nn.Module):
    """One embedding per feature, concatenated, then a 4-layer MLP → logit."""

    width: int = 64

    @nn.compact
    def __call__(self, f: MIAFeatures):
        embs = [nn.relu(nn.Dense(self.width)(v)) for v in f]
        h = jnp.concatenate(embs, -1)
        for w in (256, 128, 64):
            h = nn.relu(nn.Dense(w)(h))
        return nn.Dense(1)(h)[:, 0]


def _standardise(f: MIAFeatures, stats=None):
    if stats is None:
        stats = jax.tree_util.tree_map(lambda v: (v.mean(0), v.std(0) + 1e-6), tuple(f),
                                       is_leaf=lambda v: isinstance(v, jax.Array))
    return MIAFeatures(*[(v - m) / s for v, (m, s) in zip(f, stats)]), stats


def train_learned_attack(f_members: MIAFeatures, f_nonmembers: MIAFeatures, key, *,
                         steps: int = 300, lr: float = 1e-3):
    """Train the learned attack on the attacker's known members / non-members.

    Returns:
      ``(net_params, stats)`` for :func:`learned_scores`.
    """
    f_all = MIAFeatures(*[jnp.concatenate([a, b]) for a, b in zip(f_members, f_nonmembers)])
    f_all, stats = _standardise(f_all)
    labels = jnp.concatenate([jnp.ones(len(f_members.loss)), jnp.zeros(len(f_nonmembers.loss))])
    net = AttackNet()
    params = net.init(key, f_all)
    tx = optax.adam(lr)

    def loss_fn(p):
        return jnp.mean(optax.sigmoid_binary_cross_entropy(net.apply(p, f_all), labels))

    def step(carry, _):
        p, s = carry
        g = jax.grad(loss_fn)(p)
        u, s = tx.update(g, s, p)
        return (optax.apply_updates(p, u), s), None

    (params, _), _ = jax.jit(lambda c: jax.lax.scan(step, c, None, length=steps))((params, tx.init(params)))
    return params, stats


def learned_scores(net_params, stats, f: MIAFeatures) -> np.ndarray:
    """Membership logits of the learned attack."""
    f, _ = _standardise(f, stats)
    return np.asarray(AttackNet().apply(net_params, f))
