"""The six base pruning schemes of pruned FL (Chu et al. 2023, "Evaluated Pruning Methods" and the appendix's Table 1).

Each scheme returns a global {0,1} mask (1 = kept) pruning a fraction ``p`` of
the *prunable* weights: every weight matrix / conv kernel (leaves with ndim ≥
2). Biases are never pruned (as in SNIP, GraSP, SynFlow and PruneFL, which
prune connections). Exactly ``round(p · d_w)`` weights are pruned, ranked over
the whole model (global ranking).

Schedules (paper Table 1): SNIP, GraSP and SynFlow are one-shot at
initialisation on the server (SynFlow iterates its own scoring 100 times,
data-free); PruneFL and FedDST re-prune during training (``reconfigure``).
Random is one-shot here (Table 1 lists it as iterative; re-drawing a random
mask during training only discards trained weights, so we keep it fixed —
deviation).

* Random: uniform scores.
* SNIP (Lee et al. 2019, Eq 6): connection sensitivity |g ⊙ w| on a batch.
* GraSP (Wang et al. 2020, Eq 8): S = −w ⊙ (H g) of the loss (temperature T
  on the logits, T = 200 as in their code); the highest scores are removed.
* SynFlow (Tanaka et al. 2020, Alg 1): R = 1ᵀ f(1; |w| ⊙ m), score
  |∂R/∂w ⊙ w|, n iterations with the exponential schedule
  p_k = 1 − (1 − p)^(k/n). Biases are zeroed in the linearised network and
  each kernel is divided by its mean |w|: R is then positively homogeneous
  in every kernel, so the scores change by one common factor and the ranking
  is the same, while float32 cannot overflow (our addition).
* PruneFL (Jiang et al. 2022): server-side magnitude re-pruning of the global
  model; at reconfiguration k of K the rate is p·k/K (iterative, ending at
  p). Deviation: PruneFL's importance is the accumulated squared gradient of
  a dense probe with an adaptive rate; we use |w| of the averaged model with
  a fixed final rate p (the paper uses a fixed rate 0.3, Assumption 2).
* FedDST (Bibikar et al. 2022): dynamic sparse training at constant density
  1 − p: each reconfiguration drops the ``drop_fraction`` smallest-|w| active
  weights and regrows as many inactive ones. Deviation: FedDST regrows on
  clients by gradient magnitude and aggregates masks by vote; we regrow on
  the server at random (SET, Mocanu et al. 2018), since the server holds no
  data, keeping FedDST's defining property (constant sparsity, mask moving
  during training). Regrown weights start at 0.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fedsim.client import masked_mean_loss
from fedsim.hooks import register_mask_reconfiguration, register_mask_scheme
from fedsim.typing import PRNGKey, PyTree
from defenses.pruning.masks import check_rate, mask_from_scores, num_params, unflatten

SCHEMES = ("random", "snip", "grasp", "synflow", "prunefl", "feddst")
ITERATIVE = ("prunefl", "feddst")


def prunable(params: PyTree) -> PyTree:
    """1 on weight matrices / kernels (ndim ≥ 2), 0 on biases and scales."""
    return jax.tree_util.tree_map(
        lambda l: jnp.full(jnp.shape(l), 1.0 if jnp.ndim(l) >= 2 else 0.0, jnp.float32), params)


def _count(params) -> int:
    return int(sum(jnp.size(l) for l in jax.tree_util.tree_leaves(params) if jnp.ndim(l) >= 2))


def prune_weights(scores: PyTree, params: PyTree, p: float, prune: str = "lowest",
                  alive: PyTree | None = None) -> PyTree:
    """Mask pruning ``round(p · d_w)`` prunable weights by score (globally ranked).

    Args:
      scores: per-coordinate scores.
      params: the parameters (define which leaves are prunable).
      p: rate of the prunable weights to prune.
      prune: "lowest" or "highest" scores go.
      alive: optional current mask; already-pruned weights count towards the
        total and stay pruned.
    """
    p = check_rate(p)
    elig = prunable(params)
    target = int(round(p * _count(params)))
    if alive is not None:
        already = int(round(float(sum(jnp.sum((1 - a) * e) for a, e in zip(
            jax.tree_util.tree_leaves(alive), jax.tree_util.tree_leaves(elig))))))
        elig = jax.tree_util.tree_map(jnp.multiply, elig, alive)
        target = max(target - already, 0)
    d = num_params(params)
    # mask_from_scores prunes round(q·d) coordinates; pick q so that it is ``target``.
    q = target / d
    new = mask_from_scores(scores, q, prune, eligible=elig)
    if alive is not None:
        new = jax.tree_util.tree_map(jnp.multiply, new, alive)
    return new


def random_scheme(key: PRNGKey, params: PyTree, p: float) -> PyTree:
    """Random pruning: a uniformly random set of weights."""
    scores = unflatten(jax.random.uniform(key, (num_params(params),), jnp.float32), params)
    return prune_weights(scores, params, p)


def snip(params, apply_fn, x, y, p: float) -> PyTree:
    """SNIP: prune the lowest connection sensitivities |∂L/∂w ⊙ w| on batch (x, y)."""
    mask = jnp.ones(x.shape[0], jnp.float32)
    g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
    return prune_weights(jax.tree_util.tree_map(lambda a, b: jnp.abs(a * b), g, params), params, p)


def grasp(params, apply_fn, x, y, p: float, temperature: float = 200.0) -> PyTree:
    """GraSP: remove the highest S = −w ⊙ Hg (gradient-flow preservation).

    Wang, Zhang & Grosse 2020, Eq 8, with the logits divided by ``temperature``
    (their T = 200) for g and Hg alike; Hg is one forward-over-reverse product.
    Deviations from the authors' code: it scores a copy whose Linear layers are
    re-initialised (Xavier normal) on a class-balanced batch; here the model as
    given is scored on the caller's batch. Scores are not normalised (their
    division by |ΣS| does not change the ranking).

    Measured here (docs/pruning.md): on Conv-2, which has no normalisation
    layers, GraSP at p = 0.1 already removes mostly negative weights (the mean
    of the first conv kernel goes from ~0 to 0.07), the logits grow ~400×, and
    the model stays at chance under FedAvg.
    """
    mask = jnp.ones(x.shape[0], jnp.float32)
    loss = lambda w: masked_mean_loss(lambda q, xx: apply_fn(q, xx) / temperature, w, x, y, mask)
    grad_fn = jax.grad(loss)
    g = jax.lax.stop_gradient(grad_fn(params))
    _, hg = jax.jvp(grad_fn, (params,), (g,))
    scores = jax.tree_util.tree_map(lambda w, h: -w * h, params, hg)
    return prune_weights(scores, params, p, prune="highest")


def synflow(params, apply_fn, input_shape, p: float, iterations: int = 100) -> PyTree:
    """SynFlow: iterative data-free synaptic-flow pruning (exponential schedule)."""
    elig = prunable(params)
    lin = jax.tree_util.tree_map(
        lambda w, e: jnp.abs(w) / jnp.maximum(jnp.mean(jnp.abs(w)), 1e-12) * e, params, elig)
    ones = jnp.ones((1,) + tuple(input_shape), jnp.float32)

    @jax.jit
    def scores_of(mask):
        def R(w):
            return jnp.sum(apply_fn(jax.tree_util.tree_map(jnp.multiply, w, mask), ones))
        g = jax.grad(R)(lin)
        return jax.tree_util.tree_map(lambda a, b: jnp.abs(a * b), g, lin)

    mask = jax.tree_util.tree_map(jnp.ones_like, elig)
    for k in range(1, iterations + 1):
        pk = 1.0 - (1.0 - p) ** (k / iterations)
        # Re-rank all weights each iteration; pruned ones score 0 and stay pruned.
        mask = prune_weights(scores_of(mask), params, pk, alive=mask)
    return mask


def prunefl_reprune(params, mask, p: float, k: int, num_reconfigs: int) -> PyTree:
    """PruneFL-style reconfiguration k (1-based) of K: magnitude re-pruning to rate p·k/K."""
    rate = p * min(1.0, k / max(num_reconfigs, 1))
    scores = jax.tree_util.tree_map(jnp.abs, params)
    return prune_weights(scores, params, rate, alive=mask)


def feddst_prune_regrow(key: PRNGKey, params, mask, drop_fraction: float) -> PyTree:
    """FedDST-style prune-and-regrow at constant density (server side, random regrowth)."""
    drop_fraction = check_rate(drop_fraction, "drop_fraction")
    elig = prunable(params)
    active = jax.tree_util.tree_map(jnp.multiply, mask, elig)
    inactive = jax.tree_util.tree_map(lambda m, e: (1 - m) * e, mask, elig)
    n_active = int(sum(jnp.sum(a) for a in jax.tree_util.tree_leaves(active)))
    n_inactive = int(sum(jnp.sum(i) for i in jax.tree_util.tree_leaves(inactive)))
    # Only as many can regrow as are inactive: dropping more would lower the
    # density (at p < drop_fraction / (1 + drop_fraction) the rate drifted to
    # drop_fraction·(1 − p), e.g. 0.18 at p = 0.1).
    n_drop = min(int(round(drop_fraction * n_active)), n_inactive)
    d = num_params(params)
    if n_drop == 0:
        return mask
    # Drop the smallest-|w| active weights.
    dropped = mask_from_scores(jax.tree_util.tree_map(jnp.abs, params), n_drop / d, "lowest",
                               eligible=active)
    new = jax.tree_util.tree_map(jnp.multiply, mask, dropped)
    # Regrow as many among the weights that were inactive before this step.
    scores = unflatten(jax.random.uniform(key, (d,), jnp.float32), params)
    grow = mask_from_scores(scores, n_drop / d, "lowest", eligible=inactive)
    grown = jax.tree_util.tree_map(lambda g, i: (1 - g) * i, grow, inactive)
    return jax.tree_util.tree_map(lambda a, b: jnp.clip(a + b, 0, 1), new, grown)


def initial_mask(scheme: str, key: PRNGKey, params, p: float, *, apply_fn=None, x=None, y=None,
                 input_shape=None, synflow_iterations: int = 100) -> PyTree:
    """The mask a scheme uses from round 0.

    One-shot schemes prune to ``p`` here; PruneFL starts dense (it prunes at
    reconfigurations); FedDST starts at its constant density 1 − p, at random.

    Raises:
      ValueError: for an unknown scheme or missing data for SNIP/GraSP.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown pruning scheme {scheme!r}; allowed: {', '.join(SCHEMES)}")
    p = check_rate(p, "pruning rate p")
    if scheme in ("snip", "grasp") and (x is None or y is None or apply_fn is None):
        raise ValueError(f"scheme {scheme!r} needs apply_fn and a data batch (x, y)")
    if scheme == "random" or scheme == "feddst":
        return random_scheme(key, params, p)
    if scheme == "snip":
        return snip(params, apply_fn, x, y, p)
    if scheme == "grasp":
        return grasp(params, apply_fn, x, y, p)
    if scheme == "synflow":
        if apply_fn is None or input_shape is None:
            raise ValueError("scheme 'synflow' needs apply_fn and input_shape")
        return synflow(params, apply_fn, input_shape, p, synflow_iterations)
    return jax.tree_util.tree_map(jnp.ones_like, prunable(params))  # prunefl: dense start


def one_shot_mask(scheme: str, key: PRNGKey, params, p: float, *, apply_fn=None, x=None, y=None,
                  input_shape=None, synflow_iterations: int = 100,
                  drop_fraction: float = 0.2) -> PyTree:
    """A scheme's mask at rate ``p`` on the initial model, for a mask fixed from round 0.

    The one-shot schemes are :func:`initial_mask`. The iterative ones take their
    first step at once: PruneFL one magnitude re-pruning straight to ``p``
    (:func:`prunefl_reprune` with K = 1), FedDST its random start at density
    1 − p followed by one prune-and-regrow of ``drop_fraction``
    (:func:`feddst_prune_regrow`; the key is split between the two draws).
    Deviation, for PruneFL and FedDST: their later reconfigurations are not
    made (``benchmarks/reproduce_chu2023.py`` part B runs PruneFL's schedule).
    This is what a config's ``pruning.scheme`` gives (registered below) and
    what part A of the reproduction attacks.

    Raises:
      ValueError: as :func:`initial_mask`.
    """
    if scheme == "prunefl":
        return prunefl_reprune(params, initial_mask("prunefl", key, params, p), p, 1, 1)
    if scheme == "feddst":  # two draws: split, not the key and a child of it
        k_mask, k_regrow = jax.random.split(key)
        return feddst_prune_regrow(k_regrow, params, initial_mask(scheme, k_mask, params, p),
                                   drop_fraction)
    return initial_mask(scheme, key, params, p, apply_fn=apply_fn, x=x, y=y,
                        input_shape=input_shape, synflow_iterations=synflow_iterations)


FEDDST_DROP_FRACTION = 0.2

#: Each registered scheme's docstring (what ``fedsim list schemes`` shows): the
#: module docstring above, one line each, with its deviations from the scheme's
#: paper. Paper 002 lists the six with their schedules in its appendix's Table 1.
DESCRIPTIONS = {
    "random": "Random: uniform scores; one-shot at initialisation (Table 1 lists it as "
              "iterative; kept fixed here, a deviation).",
    "snip": "SNIP (Lee et al. 2019, Eq 6): connection sensitivity |g ⊙ w| on a batch; one-shot "
            "at initialisation.",
    "grasp": "GraSP (Wang et al. 2020, Eq 8): removes the highest −w ⊙ (H g), T = 200; "
             "one-shot at initialisation.",
    "synflow": "SynFlow (Tanaka et al. 2020, Alg 1): data-free synaptic flow, iterated "
               "scoring; one-shot at initialisation.",
    "prunefl": "PruneFL (Jiang et al. 2022): server-side magnitude re-pruning, rate p·k/K; "
               "iterative (pruning.reconfigurations). Deviation: |w| of the averaged model, "
               "not PruneFL's accumulated squared-gradient importance.",
    "feddst": "FedDST (Bibikar et al. 2022): constant density 1 − p, prune and regrow "
              f"{FEDDST_DROP_FRACTION:g} of the active weights; iterative "
              "(pruning.reconfigurations). Deviation: regrown on the server at random (SET), "
              "not on the clients by gradient.",
}


def _register(scheme: str) -> None:
    @register_mask_scheme(scheme)
    def build(params, p, *, key, apply_fn=None, x=None, y=None, input_shape=None,
              synflow_iterations: int = 100, reconfigurations: int = 1):
        if scheme == "prunefl" and reconfigurations > 1:  # the first of K steps: rate p/K
            return prunefl_reprune(params, initial_mask("prunefl", key, params, p), p, 1,
                                   reconfigurations)
        return one_shot_mask(scheme, key, params, p, apply_fn=apply_fn, x=x, y=y,
                             input_shape=input_shape, synflow_iterations=synflow_iterations,
                             drop_fraction=FEDDST_DROP_FRACTION)

    build.__doc__ = DESCRIPTIONS[scheme]


for _scheme in SCHEMES:
    _register(_scheme)


@register_mask_reconfiguration("prunefl")
def prunefl_reconfiguration(params, mask, p: float, *, k: int, num: int, key=None) -> PyTree:
    """PruneFL's reconfiguration k of ``num`` (k = 0 made the initial mask):
    magnitude re-pruning of the global model to rate p·(k+1)/num among the weights
    still alive (:func:`prunefl_reprune`), the same schedule part B of the
    reproduction runs. Deviation: PruneFL (Jiang et al.) scores by importance
    (accumulated squared gradients over the time a step costs); magnitude is the
    importance proxy used throughout this package."""
    del key
    return prunefl_reprune(params, mask, p, k + 1, num)


@register_mask_reconfiguration("feddst")
def feddst_reconfiguration(params, mask, p: float, *, k: int, num: int, key) -> PyTree:
    """FedDST's reconfiguration k of ``num``: one prune-and-regrow at constant
    density (:func:`feddst_prune_regrow`), its drop fraction annealed as
    0.2·(1 + cos(π k / num))/2 (FedDST, Bibikar et al. 2022, after RigL's
    cosine schedule). Deviation: made on the server's model, not on the
    clients with mask aggregation."""
    del p
    drop = FEDDST_DROP_FRACTION * (1 + math.cos(math.pi * k / num)) / 2
    return feddst_prune_regrow(key, params, mask, drop)
