"""PriPrune (Chu et al. 2023, "Pruning as a Privacy Defense for FL", Alg 3, Eq 6–8): a learnt, per-client defense mask.

Per client and per parameter j, α_j = P(not shared) (logits θ_j, α = σ(θ)).
Local training (Alg 3) interleaves, at every local step on a batch,

* a weight step on the local loss L(w) (the client keeps training its full
  local model: Pseudo-Pruning never prunes locally), and
* a step on θ minimising (Eq 6)

      λ_acc · L(w ⊙ (1 − v) + w_g ⊙ v) + λ_pri · L_pri(α) + λ_sha · Σ_j α_j,

  with v the Gumbel-softmax "not shared" sample (Eq 7, temperature τ) and
  L_pri = Σ_{l,j} −(N_l / Σ_l N_l)(|g_j| / Σ_{j∈l} |g_j|) log α_j (Eq 8), g
  the step's gradient (large-gradient weights are pushed to "not shared").

After local training the defense mask is m̂ = 1[α > ½] (= argmax(α, 1 − α))
and the client uploads its weights ŵ = w ⊙ (1 − m̂) (``upload="weights"``,
Alg 3 line 13, averaged by the server with withheld weights as 0, Alg 1
line 11) or its update Δ ⊙ (1 − m̂) (``upload="update"``); see
:func:`defenses.pruning.masks.withhold`. Pseudo-Pruning: the client keeps its
local weights and m̂ and starts the next round from
w_g ⊙ (1 − m̂) + w_local ⊙ m̂; θ carries over across rounds.

Interpretation (the paper's equations are garbled, see
``shared/papers/README.md``): L_acc is evaluated on the model the server would
effectively receive from this client — a withheld coordinate is 0 in a weight
upload (the global value in an update upload) — so withholding a weight costs
accuracy there in proportion to how much the model needs it, while λ_pri
pushes informative (large-gradient) weights to be withheld and λ_sha charges
every withheld weight. (Alg 3 lines 6–7 compose the soft mask between the
client's previous local weights and the global ones instead; that term
rewards withholding wherever the stale local value fits the local data
better, and says nothing about the model the federation receives, so we use
the server's view — a stated deviation.) The weight step uses the plain local loss (Pseudo-Pruning
trains withheld weights locally). θ is updated with Adam (``alpha_lr``): the
raw per-coordinate gradients of Eq 6 are O(1/d), far below any step size
shared with the weights, and Adam's scale invariance makes λ_acc:λ_pri:λ_sha
the only thing that matters. θ starts at logit(``alpha_init``). Like α itself
(Alg 3 line 3, α_i^t = α_i^{t−1}), θ's Adam state persists across the client's
rounds (``alpha_state="persist"``, the default), so θ follows the running
average of the Eq 6 gradient: a coordinate that L_pri pushes in every round
crosses ½ after about |logit(alpha_init)|/alpha_lr steps, while one whose
gradient sign changes from step to step (the first-order L_acc term of an
unimportant weight) wanders much less. With ``alpha_state="fresh"`` (the
first version) every round starts a new Adam state, whose first step is
±``alpha_lr`` by the gradient's sign alone.

Balance point (why λ_sha needs the model size): with one local step the
λ_acc term is ~0 (w = w_g at the step), and the θ_j-gradient of the other two
terms vanishes at α_j* = λ_pri·c_j/λ_sha with c_j = (N_l/N)·|g_j|/Σ_{j∈l}|g_j|,
so a weight ends up withheld (α > ½) iff |g_j| > (λ_sha·N / (2·λ_pri)) × the
mean |g| of its layer. L_pri is normalised, λ_sha·Σα is not, so the same λ's
mean a different threshold for a different N; the reproduction scales λ_sha
by N_paper/N (FEMNIST Conv-2, N_paper = 6.6·10⁶) to keep the paper's
threshold (6.6× the layer mean for λ_pri = 10, λ_sha = 2e-5).
``PriPruneConfig.reference_size`` = N_paper makes the client update do that
scaling for whatever model it trains.

Base pruning is composed through the engine's "layer" defense (e.g.
:func:`defenses.pruning.global_mask.masked_gradient`): pruned weights get no
gradient, stay 0 in the local model and hence 0 in Δ.

Guarantee: withheld coordinates are exactly 0 in the upload (tested on the
observer's view); privacy is empirical (SGI NMI/PSNR).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax

from fedsim.client import LocalTraining, epoch_order, masked_mean_loss
from fedsim.hooks import (Defense, DefenseContext, identity, register_defense,
                          register_simulation_plugin)
from fedsim.typing import ClientOutput, CohortData
from fedsim.x64 import x64_invariant
from defenses.pruning.gumbel import gumbel_tree
from defenses.pruning.masks import check_upload, pseudo_pruning_begin, withhold


@dataclasses.dataclass(frozen=True)
class PriPruneConfig:
    """PriPrune hyper-parameters.

    The paper gives two grids: "Hyperparameter Selection"'s search, λ_acc ∈ {1, 5, 10}, λ_pri ∈ {1, 5, 10, 15, 20},
    λ_sha ∈ {1e-4, 2e-5}; the appendix's setup, λ_acc ∈ {1, 5, 10}, λ_pri ∈ {1, 10, 15},
    λ_sha ∈ {2e-5, 2e-6}.
    """

    lambda_acc: float = 1.0
    lambda_pri: float = 10.0
    lambda_sha: float = 2e-5
    tau: float = 0.5
    alpha_lr: float = 0.1
    alpha_init: float = 0.1
    upload: str = "update"
    alpha_state: str = "persist"
    # λ_sha is meant for a model of this many parameters: the client update uses
    # λ_sha · reference_size / N for its model's N (module docstring, "Balance
    # point"); None: λ_sha as given.
    reference_size: int | None = None

    def __post_init__(self):
        check_upload(self.upload)
        r = self.reference_size
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 1):
            raise ValueError(f"priprune reference_size must be a positive integer (a model's "
                             f"parameter count) or absent, got {r!r}")
        if self.alpha_state not in ("persist", "fresh"):
            raise ValueError(f"priprune alpha_state must be 'persist' or 'fresh', got "
                             f"{self.alpha_state!r}")
        for f in ("lambda_acc", "lambda_pri", "lambda_sha", "tau", "alpha_lr", "alpha_init"):
            v = getattr(self, f)
            # bool is an int: `tau: true` would otherwise pass as 1.0.
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"priprune {f} must be a finite number, got {v!r}")
            if isinstance(v, int) and abs(v) > 2**31 - 1:
                # A Python int enters the jitted step as int32 (an OverflowError there).
                raise ValueError(f"priprune {f}: the integer {v} does not fit in 32 bits; "
                                 f"write it as a float ({float(v):g})")
        for f in ("lambda_acc", "lambda_pri", "lambda_sha"):
            if getattr(self, f) < 0:
                raise ValueError(f"priprune {f} must be >= 0, got {getattr(self, f)}")
        if self.tau <= 0 or self.alpha_lr <= 0:
            raise ValueError(f"priprune tau and alpha_lr must be > 0, got tau={self.tau}, "
                             f"alpha_lr={self.alpha_lr}")
        if not 0 < self.alpha_init < 1:
            raise ValueError(f"priprune alpha_init must be in (0, 1), got {self.alpha_init}")


def priprune_defense(hp: PriPruneConfig) -> Defense:
    """The upload-stage half of PriPrune: final mask m̂ = 1[α > ½] and Pseudo-Pruning.

    Its state is ``{"theta": logits of α, "local": w_local, "withheld": m̂}`` and, with
    ``alpha_state="persist"``, ``"alpha_opt"``: θ's Adam state.
    Used with :func:`priprune_client_update`, which trains θ.
    """
    theta0 = float(jnp.log(hp.alpha_init) - jnp.log1p(-hp.alpha_init))

    def init(params):
        f32 = lambda l: jnp.zeros(jnp.shape(l), jnp.float32)
        theta = jax.tree_util.tree_map(lambda l: f32(l) + theta0, params)
        extra = ({"alpha_opt": alpha_optimizer(hp).init(theta)} if hp.alpha_state == "persist"
                 else {})
        return {**extra, "theta": theta,
                "local": jax.tree_util.tree_map(jnp.zeros_like, params),
                "withheld": jax.tree_util.tree_map(f32, params)}

    def apply(update, state, *, key=None, context=None):
        del key
        withheld = jax.tree_util.tree_map(lambda t: (t > 0).astype(jnp.float32), state["theta"])
        keep = jax.tree_util.tree_map(lambda m: 1.0 - m, withheld)
        out = withhold(update, keep, hp.upload,
                       None if context is None else context.global_params)
        local = context.params if context is not None and context.params is not None \
            else state["local"]
        return out, {**state, "local": local, "withheld": withheld}

    # Found by this mark, not by name: a renamed or masked PriPrune (``_replace``
    # keeps ``init``; the engine's error naming wraps it with functools.wraps,
    # which copies the mark) is still PriPrune to its client update and its
    # rate report (priprune_config_of).
    init.priprune_config = hp
    return Defense(init=init, apply=apply, stage="upload", name="priprune",
                   begin_round=pseudo_pruning_begin)


def priprune_config_of(defense: Defense | None) -> PriPruneConfig | None:
    """The :class:`PriPruneConfig` a :func:`priprune_defense` was built with; None otherwise.

    Read from a mark on the defense's ``init``, so it survives renaming
    (``_replace(name=...)``), the global mask around it (pruned FL) and the
    engine's error naming; it does not depend on ``defense.name``.
    """
    return None if defense is None else getattr(defense.init, "priprune_config", None)


@register_defense("priprune")
def priprune(lambda_acc: float = 1.0, lambda_pri: float = 10.0, lambda_sha: float = 2e-5,
             tau: float = 0.5, alpha_lr: float = 0.1, alpha_init: float = 0.1,
             upload: str = "update", alpha_state: str = "persist",
             reference_size: int | None = None) -> Defense:
    """PriPrune for configs: ``defenses: [{name: priprune, ...}]`` (Alg 3, Eq 6–8).

    Deviation: the default ``upload="update"`` uploads Δ ⊙ (1 − m̂); Alg 3
    line 13 uploads the masked weights, ``upload="weights"``. The default is
    kept for compatibility with the runs recorded before the option; the
    reproduction (``benchmarks/reproduce_chu2023.py``) names its semantics.

    :func:`priprune_defense` carrying :func:`priprune_client_update` as its
    ``local_training``, so a :class:`~fedsim.simulation.Simulation` built from
    the config trains θ with the weights. It composes with base pruning
    (``pruning:``, which masks every local step's gradient, PriPrune's paper
    setting, e.g. PriPrune on PruneFL) and with other "layer" defenses; not with
    other "upload", "data" or "example" defenses (a ConfigError names them).
    The arguments are :class:`PriPruneConfig`'s. λ_sha is not normalised by the
    model size (module docstring, "Balance point"): to keep the paper's
    threshold on a model of N parameters, give the paper's λ_sha with
    ``reference_size`` = N_paper (FEMNIST Conv-2: 6,603,710), and the client
    update uses λ_sha·N_paper/N, as ``benchmarks/reproduce_chu2023.py`` does.
    """
    hp = PriPruneConfig(lambda_acc=lambda_acc, lambda_pri=lambda_pri, lambda_sha=lambda_sha,
                        tau=tau, alpha_lr=alpha_lr, alpha_init=alpha_init, upload=upload,
                        alpha_state=alpha_state, reference_size=reference_size)
    return priprune_defense(hp)._replace(local_training=priprune_client_update(hp))


def alpha_optimizer(hp: PriPruneConfig) -> optax.GradientTransformation:
    """The optimizer of θ = logit(α) (module docstring).

    :func:`fedsim.x64.x64_invariant`: under ``jax_enable_x64`` optax's Adam
    would compute its bias correction in float64.
    """
    return x64_invariant(optax.adam(hp.alpha_lr))


def privacy_loss(theta, grad):
    """Eq 8: Σ_l (N_l/N) Σ_j (|g_j| / Σ_{j∈l} |g_j|) · (−log α_j)."""
    t_leaves = jax.tree_util.tree_leaves(theta)
    g_leaves = jax.tree_util.tree_leaves(grad)
    total = sum(t.size for t in t_leaves)
    loss = 0.0
    for t, g in zip(t_leaves, g_leaves):
        a = jnp.abs(g)
        share = a / jnp.maximum(jnp.sum(a), 1e-30)
        loss = loss + (t.size / total) * jnp.sum(share * -jax.nn.log_sigmoid(t))
    return loss


def priprune_client_update(hp: PriPruneConfig):
    """A ``client_update_factory`` for :class:`fedsim.simulation.Simulation` (Alg 3).

    ``defenses["upload"]`` must be :func:`priprune_defense` with the same
    ``hp`` (found by :func:`priprune_config_of`, whatever its name);
    ``defenses["layer"]`` (optional) masks the gradient (base pruning). Data
    and example stages are not supported here (ValueError).
    """

    def factory(apply_fn, tx, settings: LocalTraining, defenses):
        defenses = dict(defenses or {})
        up = defenses.get("upload")
        up_hp = priprune_config_of(up)
        if up_hp is None:
            raise ValueError("PriPrune training needs defenses['upload'] = priprune_defense(hp)"
                             + ("" if up is None else f", got {up.name!r}"))
        if up_hp != hp:
            # The upload's hp decides what the server sees (upload="weights"
            # or "update"); the client update's, the view L_acc is taken on
            # and α's optimiser: two hp would train α for another upload.
            raise ValueError(f"PriPrune's upload defense was built with {up_hp} but its client "
                             f"update with {hp}; build both from one PriPruneConfig")
        extra = set(defenses) - {"upload", "layer"}
        if extra:
            raise ValueError(f"PriPrune training supports only 'layer' and 'upload' defenses, "
                             f"got {sorted(extra)}")
        layer = defenses.get("layer", identity("layer"))
        B, spe = settings.effective_batch, settings.steps_per_epoch
        alpha_tx = alpha_optimizer(hp)
        persist = hp.alpha_state == "persist"

        def client_update(global_params, data: CohortData, client_state, key) -> ClientOutput:
            cs = dict(client_state)
            lambda_sha = hp.lambda_sha
            if hp.reference_size is not None:  # N is static: the model's shapes
                n = sum(l.size for l in jax.tree_util.tree_leaves(global_params))
                lambda_sha = hp.lambda_sha * hp.reference_size / n
            k_begin, k_order, k_steps, k_up = jax.random.split(key, 4)
            params, cs["upload"] = up.begin_round(global_params, cs["upload"], key=k_begin)
            epochs = settings.num_steps // spe
            orders = jax.vmap(lambda e: epoch_order(jax.random.fold_in(k_order, e), data.mask))(
                jnp.arange(epochs))
            pad = spe * B - settings.n_max
            orders = jnp.concatenate([orders, jnp.full((epochs, pad), -1, orders.dtype)], axis=1)
            batches = orders.reshape(epochs * spe, B)
            theta = cs["upload"]["theta"]

            def step(carry, inputs):
                params, opt_state, theta, a_state, lstate = carry
                s, idx = inputs
                valid = idx >= 0
                safe = jnp.where(valid, idx, 0)
                mask = jnp.where(valid, data.mask[safe], 0.0)
                x, y = data.x[safe], data.y[safe]
                k_g, k_layer = jax.random.split(jax.random.fold_in(k_steps, s))

                def do(_):
                    loss, g = jax.value_and_grad(masked_mean_loss, argnums=1)(
                        apply_fn, params, x, y, mask)
                    ctx = DefenseContext(params=params, x=x, y=y, mask=mask, apply_fn=apply_fn,
                                         global_params=global_params, step=s,
                                         num_examples=data.n)
                    g, ls = layer.apply(g, lstate, key=k_layer, context=ctx)

                    def objective(th):
                        v = gumbel_tree(k_g, th, hp.tau)
                        # The server's view of this client's model: a withheld
                        # weight is 0 (weight upload) or the global one (update).
                        fill = (jax.tree_util.tree_map(jnp.zeros_like, global_params)
                                if hp.upload == "weights" else global_params)
                        shared = jax.tree_util.tree_map(
                            lambda w, f, vv: w * (1 - vv) + f * vv, params, fill, v)
                        acc = masked_mean_loss(apply_fn, shared, x, y, mask)
                        pri = privacy_loss(th, jax.lax.stop_gradient(g))
                        sha = sum(jnp.sum(jax.nn.sigmoid(t)) for t in jax.tree_util.tree_leaves(th))
                        return hp.lambda_acc * acc + hp.lambda_pri * pri + lambda_sha * sha

                    gt = jax.grad(objective)(theta)
                    upd_t, new_a = alpha_tx.update(gt, a_state, theta)
                    upd, new_opt = tx.update(g, opt_state, params)
                    return ((optax.apply_updates(params, upd), new_opt,
                             optax.apply_updates(theta, upd_t), new_a, ls),
                            (loss.astype(jnp.float32), jnp.float32(1.0)))

                def skip(_):
                    # float32 as the engine's loss and step count, whatever
                    # jax_enable_x64 (the branches must agree; a float64 count
                    # would divide a float32 run's loss in float64).
                    zero = jnp.zeros((), jnp.float32)
                    return (params, opt_state, theta, a_state, lstate), (zero, zero)

                return jax.lax.cond(jnp.any(valid & (mask > 0)), do, skip, None)

            a_state0 = cs["upload"]["alpha_opt"] if persist else alpha_tx.init(theta)
            carry0 = (params, tx.init(params), theta, a_state0, cs.get("layer", ()))
            (params, _, theta, a_state, lstate), (losses, taken) = jax.lax.scan(
                step, carry0, (jnp.arange(batches.shape[0]), batches))
            if "layer" in cs:
                cs["layer"] = lstate
            loss = jnp.sum(losses) / jnp.maximum(jnp.sum(taken), 1.0)
            delta = jax.tree_util.tree_map(lambda a, b: a - b, params, global_params)
            st = {**cs["upload"], "theta": theta, **({"alpha_opt": a_state} if persist else {})}
            delta, cs["upload"] = up.apply(delta, st, key=k_up,
                                           context=DefenseContext(params=params,
                                                                  global_params=global_params))
            return ClientOutput(delta, cs, loss, data.n.astype(jnp.float32))

        return client_update

    return factory


def defense_rate(withheld) -> jax.Array:
    """p̂: the fraction of coordinates PriPrune withholds (Fig 5b)."""
    leaves = jax.tree_util.tree_leaves(withheld)
    return sum(jnp.sum(l) for l in leaves) / sum(l.size for l in leaves)


@register_simulation_plugin
def report_defense_rate(sim) -> None:
    """Log ``priprune_rate`` each round: p̂ averaged over the round's cohort (Fig 5b).

    Attached to a simulation whose upload defense is PriPrune (from a config
    or built by hand); reads each cohort client's withheld mask from the
    server state after the round (a client skipped for a non-finite update
    keeps its previous mask).
    """
    if priprune_config_of(sim.defenses.get("upload")) is None:
        return

    @jax.jit
    def cohort_rate(withheld, ids):
        rates = jax.vmap(lambda i: defense_rate(jax.tree_util.tree_map(lambda w: w[i], withheld))
                         )(ids)
        return jnp.mean(rates)

    def callback(round_idx: int, row: dict, *, state) -> dict:
        del row
        ids = jnp.asarray(sim.cohort(round_idx), jnp.int32)
        return {"priprune_rate": float(cohort_rate(state.client_states["upload"]["withheld"],
                                                   ids))}

    sim.round_callbacks.append(callback)
