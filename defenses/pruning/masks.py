"""Masks as pytrees of {0, 1} and the magnitude/random mask builders.

A mask has the structure of the parameters, float32 leaves in {0, 1}: 1 keeps
(shares / trains) a coordinate, 0 prunes it. Scores are ranked over the WHOLE
model (global ranking, as PruneFL, SNIP and the defense pruning of Chu et al.
2023, §3 and §5, and GC in Sun et al. 2021, §5), and exactly ``round(p·d)``
coordinates are pruned, ties broken by position, so a rate p always prunes the
same count whatever the values.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from fedsim.typing import PRNGKey, PyTree


def check_rate(p, name: str = "p") -> float:
    """Validate a pruning rate in [0, 1]."""
    if isinstance(p, (bool, np.bool_)):  # float(True) is 1.0: prune everything
        raise ValueError(f"{name} must be a number in [0, 1], got {p!r}")
    try:
        p = float(p)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in [0, 1], got {p!r}") from None
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {p}")
    return p


def num_params(tree: PyTree) -> int:
    """Total number of coordinates d of a pytree."""
    return sum(int(jnp.size(l)) for l in jax.tree_util.tree_leaves(tree))


def flatten(tree: PyTree) -> jax.Array:
    """All leaves concatenated into one float vector [d]."""
    return jnp.concatenate([jnp.ravel(l) for l in jax.tree_util.tree_leaves(tree)])


def unflatten(vec: jax.Array, like: PyTree) -> PyTree:
    """Inverse of :func:`flatten`: split ``vec`` back into ``like``'s structure.

    Raises:
      ValueError: unless ``vec`` is a vector of exactly ``like``'s size (a longer
        one used to lose its tail without a word).
    """
    leaves, treedef = jax.tree_util.tree_flatten(like)
    total = sum(int(jnp.size(l)) for l in leaves)
    if jnp.ndim(vec) != 1 or jnp.shape(vec)[0] != total:
        raise ValueError(f"unflatten: expected a vector of the tree's {total} coordinates, got "
                         f"shape {tuple(jnp.shape(vec))}")
    out, i = [], 0
    for l in leaves:
        n = int(jnp.size(l))
        out.append(vec[i:i + n].reshape(jnp.shape(l)).astype(jnp.result_type(l)))
        i += n
    return jax.tree_util.tree_unflatten(treedef, out)


def ones_like(tree: PyTree) -> PyTree:
    """The all-keep mask."""
    return jax.tree_util.tree_map(lambda l: jnp.ones(jnp.shape(l), jnp.float32), tree)


def apply_mask(tree: PyTree, mask: PyTree) -> PyTree:
    """``tree ⊙ mask`` leaf-wise (pruned coordinates become exactly 0).

    Raises:
      ValueError: when ``mask`` is not a pytree of ``tree``'s structure and leaf
        shapes (:func:`check_mask_fits`).
    """
    check_mask_fits(tree, mask)
    return jax.tree_util.tree_map(lambda t, m: t * m.astype(jnp.result_type(t)), tree, mask)


def check_mask_fits(tree: PyTree, mask: PyTree, what: str = "mask") -> None:
    """Refuse a mask whose pytree structure or leaf shapes differ from ``tree``'s.

    Shapes only (free under ``jit``). A leaf of shape (out,) against an
    (in, out) kernel used to broadcast and mask whole columns without a word,
    and another structure failed with jax's "pytree structure error", which
    names neither argument.

    Raises:
      ValueError: naming the first leaf (by its path) that does not fit.
    """
    t_leaves, t_def = jax.tree_util.tree_flatten_with_path(tree)
    m_leaves, m_def = jax.tree_util.tree_flatten(mask)
    if t_def.num_leaves != m_def.num_leaves or \
            jax.tree_util.tree_structure(tree) != m_def:
        raise ValueError(f"{what}: its pytree structure differs from the parameters' "
                         f"({m_def.num_leaves} leaves against {t_def.num_leaves}); a mask has "
                         f"one {{0,1}} leaf per parameter leaf")
    for (path, t), m in zip(t_leaves, m_leaves):
        if jnp.shape(m) != jnp.shape(t):
            raise ValueError(f"{what}: leaf {jax.tree_util.keystr(path)} has shape "
                             f"{tuple(jnp.shape(m))}, the parameter {tuple(jnp.shape(t))}")


def density(mask: PyTree) -> jax.Array:
    """Fraction of kept coordinates of a mask."""
    return jnp.sum(flatten(mask)) / num_params(mask)


def mask_from_scores(scores: PyTree, p: float, prune: str = "lowest",
                     eligible: PyTree | None = None, rate_of_eligible: bool = False) -> PyTree:
    """Prune exactly ``round(p·d)`` coordinates ranked by score over the model.

    Args:
      scores: pytree of scores (same structure as the params).
      p: pruning rate in [0, 1] (a Python float: the count is static).
      prune: "lowest" prunes the lowest scores (magnitude pruning, SNIP,
        SynFlow), "highest" the highest (the Largest defense).
      eligible: optional {0,1} mask; only coordinates with 1 may be pruned.
        ``p`` stays a rate of d (the whole model); the count is capped at the
        eligible count; ineligible coordinates are 1 in the result (combine
        with the eligibility mask yourself). Used by iterative schemes and the
        Mix defense.
      rate_of_eligible: ``p`` is a rate of the eligible count instead of d
        (``round(p·#eligible)`` pruned; the count is traced, the shapes static).
        The defense pruning uses it: its rate is a fraction of what the base
        scheme lets the client share.

    Returns:
      A {0, 1} float32 mask with ``min(round(p·d), #eligible)`` (or
      ``round(p·#eligible)``) zeros among the eligible coordinates.
    """
    p = check_rate(p)
    if prune not in ("lowest", "highest"):
        raise ValueError(f"prune must be 'lowest' or 'highest', got {prune!r}")
    if eligible is not None:
        check_mask_fits(scores, eligible, "eligible")
    if rate_of_eligible:
        if eligible is None:
            raise ValueError("rate_of_eligible=True needs an eligible mask")
        # round half to even, as Python's round() for the static count.
        n_eligible = sum(jnp.sum(e > 0, dtype=jnp.int32)
                         for e in jax.tree_util.tree_leaves(eligible))
        k = rate_count(p, n_eligible)
    else:
        k = int(round(p * num_params(scores)))
    return _keep_tree(scores, eligible, k, prune == "highest")


def _rate_pieces(p: float) -> list[float]:
    """``p`` as an exact sum of floats of at most 8 significant bits each (at most 7)."""
    pieces, rest = [], float(p)
    # Pieces below 2**-100 change p·n (n < 2**31) by less than 2**-69: dropped, as
    # float32 could not hold them.
    while rest >= 2.0 ** -100:
        mantissa, exponent = math.frexp(rest)
        piece = math.ldexp(math.floor(mantissa * 256) / 256, exponent)
        pieces.append(piece)
        rest -= piece  # exact: piece holds rest's top 8 bits
    return pieces


#: p·n within this distance of a half counts as a half (:func:`rate_count`).
HALF_TOLERANCE = 2.0 ** -20


def _two_sum(a, b):
    """``a + b`` as (sum, rounding error), exactly (Knuth's TwoSum, no FMA needed)."""
    s = a + b
    b_virtual = s - a
    return s, (a - (s - b_virtual)) + (b - b_virtual)


def rate_count(p: float, n) -> jax.Array:
    """``round(p·n)`` (half to even, as Python's ``round``) for a static rate and a traced count.

    ``jnp.round(p * n)`` rounds p·n to float32's 24 bits first, so for counts of a
    few 10⁵ and more (a Conv-2 upload) it is off by one whenever p·n lies within
    that error of a half: 0.3 × 3,897,298 = 1,169,189.4 becomes 1,169,189.5 in
    float32, then 1,169,190. Here p is split into 8-bit pieces and n into 16-bit
    halves, so every partial product is exact in float32; their integer parts are
    summed in int32 and their fractional parts with a compensated sum (error
    ~10⁻¹³). A p·n within :data:`HALF_TOLERANCE` of a half counts as a half, so
    a decimal rate rounds as written, as Python's float64 ``round(p * n)`` does:
    0.1 × 5 → 0 and 0.3 × 5 → 2, although the binary 0.1 and 0.3 make the exact
    products 0.5 + 3·10⁻¹⁷ and 1.5 − 6·10⁻¹⁷.

    Args:
      p: the rate, a Python float in [0, 1].
      n: a count in [0, 2³¹), traced or not.
    """
    n = jnp.asarray(n, jnp.int32)
    halves = (((n >> 16) << 16).astype(jnp.float32), (n & 0xFFFF).astype(jnp.float32))
    whole, frac, err = jnp.int32(0), jnp.float32(0.0), jnp.float32(0.0)
    for piece in _rate_pieces(p):
        for h in halves:
            t = jnp.float32(piece) * h
            t_whole = jnp.floor(t)
            whole = whole + t_whole.astype(jnp.int32)
            frac, e = _two_sum(frac, t - t_whole)
            err = err + e
    carry = jnp.floor(frac)
    whole = whole + carry.astype(jnp.int32)
    rest = (frac - carry) + err  # in (−ε, 1 + ε): only ~10⁻¹³ outside [0, 1)
    tie = jnp.abs(rest - 0.5) <= HALF_TOLERANCE
    up = jnp.where(tie, whole % 2 == 1, rest > 0.5)
    return whole + up.astype(jnp.int32)


def mask_pruning_count(scores: PyTree, k, prune: str, eligible: PyTree) -> PyTree:
    """Prune exactly ``k`` eligible coordinates (``k`` may be traced), ranked by score.

    The count-level form of :func:`mask_from_scores` for callers whose count
    depends on the data (the Mix defense: ``round(p̂_random·n_shared)``).
    """
    if prune not in ("lowest", "highest"):
        raise ValueError(f"prune must be 'lowest' or 'highest', got {prune!r}")
    return _keep_tree(scores, eligible, k, prune == "highest")


def _order_key(s, eligible, highest: bool):
    """Order-preserving uint32 keys of float scores (ineligible ones rank last)."""
    s = jnp.ravel(s).astype(jnp.float32)
    if highest:
        s = -s
    if eligible is not None:
        # Ineligible coordinates rank last, so they are pruned only if k
        # exceeds the eligible count (it never does for callers that cap p).
        s = jnp.where(jnp.ravel(eligible) > 0, s, jnp.inf)
    s = jnp.where(s == 0, 0.0, s)  # -0.0 and +0.0 tie
    bits = jax.lax.bitcast_convert_type(s, jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


@functools.partial(jax.jit, static_argnums=(3,))
def _keep_tree(scores, eligible, k, highest: bool):
    """1 except at the k lowest scores over the whole pytree (ties by position), k traced.

    Same result as a stable argsort of :func:`flatten` (scores), but in
    O(33·d) and without materialising the flat vector: a bisection over the
    scores' order-preserving uint32 keys finds the k-th smallest value T, then
    ties at T are broken by position (leaf order, then row-major) with a
    cumulative sum per leaf offset by the earlier leaves' tie counts. An
    argsort of d = 2·10⁶ floats took ~2 s on the shared CPU. Going through the
    flat vector (XLA:CPU concatenates the leaves, then the mask is split back)
    made one client's Conv-2 share mask 2.7–2.8× slower than this
    (``benchmarks/mask_selection_cpu.py``).
    """
    leaves, treedef = jax.tree_util.tree_flatten(scores)
    elig = [None] * len(leaves) if eligible is None else jax.tree_util.tree_leaves(eligible)
    keys = [_order_key(s, e, highest) for s, e in zip(leaves, elig)]
    k = jnp.asarray(k, jnp.int32)

    def count_at_most(t):
        return sum(jnp.sum(key <= t) for key in keys)

    def body(_, lohi):
        lo, hi = lohi
        mid = lo + (hi - lo) // 2
        enough = count_at_most(mid) >= k
        return jnp.where(enough, lo, mid + 1), jnp.where(enough, mid, hi)

    lo, _ = jax.lax.fori_loop(0, 33, body, (jnp.uint32(0), jnp.uint32(0xFFFFFFFF)))
    n_ties = k - sum(jnp.sum(key < lo) for key in keys)
    out, ties_before = [], jnp.int32(0)
    for leaf, key, e in zip(leaves, keys, elig):
        ties = key == lo
        tie_rank = jnp.cumsum(ties, dtype=jnp.int32) + ties_before
        ties_before = ties_before + jnp.sum(ties, dtype=jnp.int32)
        pruned = (key < lo) | (ties & (tie_rank <= n_ties))
        keep = jnp.where(pruned & (k > 0), 0.0, 1.0).astype(jnp.float32)
        if e is not None:
            keep = jnp.where(jnp.ravel(e) > 0, keep, 1.0)
        out.append(keep.reshape(jnp.shape(leaf)))
    return jax.tree_util.tree_unflatten(treedef, out)


def magnitude_mask(tree: PyTree, p: float, prune: str = "lowest", eligible: PyTree | None = None,
                   rate_of_eligible: bool = False) -> PyTree:
    """Mask pruning the ``p`` fraction of coordinates of smallest (or largest) |value|.

    ``eligible`` / ``rate_of_eligible`` as in :func:`mask_from_scores`.
    """
    return mask_from_scores(jax.tree_util.tree_map(jnp.abs, tree), p, prune, eligible,
                            rate_of_eligible)


def random_mask(key: PRNGKey, like: PyTree, p: float) -> PyTree:
    """Mask pruning a uniformly random set of exactly ``round(p·d)`` coordinates."""
    scores = unflatten(jax.random.uniform(key, (num_params(like),), jnp.float32), like)
    return mask_from_scores(scores, p, "lowest")


def pseudo_pruning_begin(global_params: PyTree, state: dict, *, key=None, context=None):
    """Pseudo-Pruning's start model (paper 002, "Pruning as a Privacy Defense for FL", Fig 3; L_acc in Eq 6).

    w_start = w_global ⊙ (1 − m̂) + w_local_prev ⊙ m̂, with m̂ = ``state["withheld"]``
    (1 where the client withheld the weight last round) and ``state["local"]``
    the client's previous local weights: withheld weights stay on the client and
    re-enter local training. A ``Defense.begin_round`` for upload defenses
    whose state carries ``local`` and ``withheld``.
    """
    del key, context
    start = jax.tree_util.tree_map(
        lambda g, l, m: g * (1 - m).astype(g.dtype) + l * m.astype(g.dtype),
        global_params, state["local"], state["withheld"])
    return start, state


#: What a client of pruned FL uploads (paper 002, Alg 1): ``"weights"`` — its
#: masked weights ŵ = w ⊙ m̂, averaged by the server with withheld weights
#: counting as 0 (Alg 1 line 11, the paper's semantics); ``"update"`` — its
#: masked update Δ ⊙ m̂, so a withheld coordinate keeps its global value.
UPLOAD_SEMANTICS = ("weights", "update")


def check_upload(upload: str) -> str:
    """Validate an upload semantics name (see :data:`UPLOAD_SEMANTICS`)."""
    if upload not in UPLOAD_SEMANTICS:
        raise ValueError(f"upload must be one of {', '.join(UPLOAD_SEMANTICS)}; got {upload!r}")
    return upload


def withhold(update: PyTree, keep: PyTree, upload: str, global_params: PyTree | None = None
             ) -> PyTree:
    """The client's upload, in update form, with the coordinates where ``keep == 0`` withheld.

    * ``"update"``: Δ ⊙ keep.
    * ``"weights"``: the weight upload ŵ = (w_g + Δ) ⊙ keep written as the
      update ŵ − w_g = Δ ⊙ keep − w_g ⊙ (1 − keep). FedAvg with the server
      optimizer SGD(lr = 1) turns these into w_g + Σ_i p_i (ŵ_i − w_g) =
      Σ_i p_i ŵ_i, exactly Alg 1 line 11 (a withheld weight counts as 0 in
      the average); the server recovers ŵ = w_g + upload and reads the mask
      off its zeros (SGI, Alg 2 line 3).

    Raises:
      ValueError: for ``"weights"`` without ``global_params``.
    """
    if check_upload(upload) == "update":
        return apply_mask(update, keep)
    if global_params is None:
        raise ValueError("weight uploads need the global params (context.global_params)")
    return jax.tree_util.tree_map(
        lambda u, k, g: u * k.astype(u.dtype) - g * (1 - k).astype(g.dtype),
        update, keep, global_params)
