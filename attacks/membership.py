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

import functools
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy.stats import rankdata

from attacks.labels import last_layer
from fedsim import models
from fedsim.client import cross_entropy
from fedsim.x64 import x64_invariant


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


#: Examples per call in :func:`loss_scores`, :func:`gradient_norm_scores` and
#: :func:`features`. Their memory (a chunk's forward pass and per-example
#: gradients) then stays that of this many examples however large the set:
#: all at once, the forward pass of 10,000 CIFAR-10 images through VGG-11
#: alone would hold gigabytes of activations.
BATCH_SIZE = 256


def _check_examples(x, y, batch_size, num_classes=None) -> tuple[jax.Array, jax.Array]:
    x, y = jnp.asarray(x), jnp.asarray(y)
    if y.ndim != 1 or x.ndim < 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"membership: x {tuple(x.shape)} and y {tuple(y.shape)} must hold the "
                         "same number of examples (x [n, ...], y [n] integer labels)")
    if x.shape[0] == 0:
        raise ValueError("membership: no examples to score")
    if not jnp.issubdtype(y.dtype, jnp.integer):
        raise ValueError(f"membership: y must be integer class labels, got {y.dtype} (one-hot "
                         f"or float labels? pass the class indices)")
    # Out of range, the cross-entropy of a label was NaN (≥ C) or a finite wrong
    # number (< 0), and the scores went on without a word.
    low, high = int(jnp.min(y)), int(jnp.max(y))
    if low < 0 or (num_classes is not None and high >= num_classes):
        raise ValueError(f"membership: y must be classes in [0, "
                         f"{num_classes if num_classes is not None else 'C'}); got labels from "
                         f"{low} to {high}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ValueError(f"membership: batch_size must be an integer >= 1, got {batch_size!r}")
    return x, y


def _num_classes(apply_fn, params, x) -> int:
    """The model's logits per example (shapes only)."""
    x = jnp.asarray(x)
    return int(jax.eval_shape(apply_fn, params, jax.ShapeDtypeStruct((1, *x.shape[1:]),
                                                                    x.dtype)).shape[-1])


def _in_batches(fn, x, y, batch_size: int):
    """``fn(x, y)`` over chunks of ``batch_size`` examples (``lax.map``), concatenated.

    A set of at most ``batch_size`` examples is one chunk of its own size (no
    padding); a larger one is padded with repeats of its last example to whole
    chunks, and the padding is dropped.
    """
    n = x.shape[0]
    if n <= batch_size:
        return fn(x, y)
    pad = (-n) % batch_size
    chunks = [jnp.concatenate([a, jnp.repeat(a[-1:], pad, axis=0)])
              .reshape((-1, batch_size) + a.shape[1:]) for a in (x, y)]
    out = jax.lax.map(lambda c: fn(*c), tuple(chunks))
    return jax.tree_util.tree_map(lambda o: o.reshape((-1,) + o.shape[2:])[:n], out)


def per_example_losses(apply_fn, params, x, y) -> jax.Array:
    return cross_entropy(apply_fn(params, x), y)


# ``settings`` (:func:`fedsim.models.trace_settings`) is in each jit's key so that a
# call inside ``models.im2col_max_batch`` / ``conv_implementation`` traces again.
@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _losses(apply_fn, params, x, y, batch_size, settings):
    return _in_batches(lambda xb, yb: per_example_losses(apply_fn, params, xb, yb), x, y,
                       batch_size)


def loss_scores(apply_fn, params, x, y, *, batch_size: int = BATCH_SIZE) -> np.ndarray:
    """Membership score −loss (Yeom et al. 2018), in chunks of ``batch_size`` examples."""
    x, y = _check_examples(x, y, batch_size)
    _check_examples(x, y, batch_size, _num_classes(apply_fn, params, x))
    return -np.asarray(_losses(apply_fn, params, x, y, int(batch_size), models.trace_settings()))


def _last_layer_grads(apply_fn, params, x, y, num_classes):
    def one(xi, yi):
        g = jax.grad(lambda p: cross_entropy(apply_fn(p, xi[None]), yi[None])[0])(params)
        return jnp.ravel(last_layer(g, num_classes)["kernel"])

    return jax.vmap(one)(x, jnp.asarray(y))


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6))
def _grads(apply_fn, params, x, y, num_classes, batch_size, settings):
    return _in_batches(lambda xb, yb: _last_layer_grads(apply_fn, params, xb, yb, num_classes),
                       x, y, batch_size)


def gradient_norm_scores(apply_fn, params, x, y, num_classes: int, *,
                         batch_size: int = BATCH_SIZE) -> np.ndarray:
    """Membership score −‖∇_{W_last} ℓ(x, y)‖₂ (small gradients: seen in training),
    in chunks of ``batch_size`` examples."""
    x, y = _check_examples(x, y, batch_size, int(num_classes))
    grads = _grads(apply_fn, params, x, y, int(num_classes), int(batch_size),
                   models.trace_settings())
    return -np.linalg.norm(np.asarray(grads), axis=1)


class MIAFeatures(NamedTuple):
    """The four white-box features of paper 000 §6.1 (per example)."""

    ranked_posteriors: jax.Array  # [n, K] softmax sorted descending
    loss: jax.Array               # [n, 1]
    last_layer_grad: jax.Array    # [n, P] flattened last-layer kernel gradient
    label_onehot: jax.Array       # [n, K]


def _chunk_features(apply_fn, params, x, y, num_classes) -> MIAFeatures:
    logits = apply_fn(params, x)
    post = -jnp.sort(-jax.nn.softmax(logits, -1), axis=-1)
    loss = cross_entropy(logits, y)[:, None]
    grads = _last_layer_grads(apply_fn, params, x, y, num_classes)
    return MIAFeatures(post, loss, grads, jax.nn.one_hot(y, num_classes, dtype=post.dtype))


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6))
def _features(apply_fn, params, x, y, num_classes, batch_size, settings):
    return _in_batches(lambda xb, yb: _chunk_features(apply_fn, params, xb, yb, num_classes),
                       x, y, batch_size)


def features(apply_fn, params, x, y, num_classes: int, *,
             batch_size: int = BATCH_SIZE) -> MIAFeatures:
    """The white-box features of every example, in chunks of ``batch_size``."""
    x, y = _check_examples(x, y, batch_size, int(num_classes))
    return _features(apply_fn, params, x, y, int(num_classes), int(batch_size),
                     models.trace_settings())


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


def _scale(v: jax.Array) -> jax.Array:
    """Each column's standard deviation, 1 where it is (about) 0.

    A column constant in the attacker's known set (the one-hot column of a
    class it holds no example of, a gradient entry that is always 0) is then
    only centred: dividing by its std of 0 (+1e-6) once turned an example of
    that class into an input of 1e6, scored about -1e6 (always a non-member).
    """
    s = v.std(0)
    return jnp.where(s > 1e-6, s, 1.0)


def _standardise(f: MIAFeatures, stats=None):
    """``f`` standardised per column by ``stats`` (each feature's ``(mean, scale)``);
    without ``stats``, by its own (:func:`_scale`), which are returned too."""
    if stats is None:
        stats = jax.tree_util.tree_map(lambda v: (v.mean(0), _scale(v)), tuple(f),
                                       is_leaf=lambda v: isinstance(v, jax.Array))
    return MIAFeatures(*[(v - m) / s for v, (m, s) in zip(f, stats)]), stats


def train_learned_attack(f_members: MIAFeatures, f_nonmembers: MIAFeatures, key, *,
                         steps: int = 300, lr: float = 1e-3):
    """Train the learned attack on the attacker's known members / non-members.

    Args:
      f_members: features of the attacker's known members.
      f_nonmembers: features of its known non-members.
      key: the attack network's initialisation key.
      steps: full-batch Adam steps (an integer ≥ 1).
      lr: Adam's learning rate (> 0).

    Returns:
      ``(net_params, stats)`` for :func:`learned_scores`.
    """
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"train_learned_attack: steps must be an integer >= 1, got {steps!r}")
    if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and np.isfinite(lr) and lr > 0):
        raise ValueError(f"train_learned_attack: lr must be a finite number > 0, got {lr!r}")
    f_all = MIAFeatures(*[jnp.concatenate([a, b]) for a, b in zip(f_members, f_nonmembers)])
    if not all(bool(jnp.all(jnp.isfinite(v))) for v in f_all):
        raise ValueError("train_learned_attack: the attack features contain NaN or inf")
    f_all, stats = _standardise(f_all)
    labels = jnp.concatenate([jnp.ones(len(f_members.loss), jnp.float32),
                              jnp.zeros(len(f_nonmembers.loss), jnp.float32)])
    params = AttackNet().init(key, f_all)
    return _fit_attack(params, f_all, labels, steps=int(steps), lr=float(lr)), stats


@functools.partial(jax.jit, static_argnames=("steps", "lr"))
def _fit_attack(params, f_all: MIAFeatures, labels, *, steps: int, lr: float):
    # Module-level and jitted once per (shapes, steps, lr): the features are
    # arguments, not closed-over constants, so training the attack under several
    # keys (reproduce_tan2024's median over keys) compiles it only once.
    net = AttackNet()
    tx = x64_invariant(optax.adam(lr))  # the same numbers under jax_enable_x64

    def loss_fn(p):
        return jnp.mean(optax.sigmoid_binary_cross_entropy(net.apply(p, f_all), labels))

    def step(carry, _):
        p, s = carry
        u, s = tx.update(jax.grad(loss_fn)(p), s, p)
        return (optax.apply_updates(p, u), s), None

    (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), None, length=steps)
    return params


def learned_scores(net_params, stats, f: MIAFeatures) -> np.ndarray:
    """Membership logits of the learned attack."""
    f, _ = _standardise(f, stats)
    return np.asarray(AttackNet().apply(net_params, f))
