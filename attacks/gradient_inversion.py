"""The shared gradient-matching core of DLG, Inverting Gradients and FedAvg inversion.

One jitted ``lax.scan`` over an optax optimizer optimises dummy inputs (and,
for DLG's joint mode, dummy label logits) so that what they *would* upload
matches what the victim uploaded. It is ``vmap``-ped over restarts and over
victims (each victim with its own global params, target and labels); the
best restart of each victim is the one with the lowest final attack loss.

What a dummy batch "would upload" is a ``simulate`` function:

* ``"gradient"``: the mean cross-entropy gradient at the global params (FedSGD,
  or FedAvg with one local step) — DLG and Inverting Gradients;
* ``"fedavg"``: local SGD unrolled over ``local_steps`` steps of mini-batches
  of ``batch_size`` at learning rate ``lr`` and the resulting
  Δ = w_S − w_0 (Geiping et al. 2020 §4, "multiple local steps"; the dummy
  examples' order within the epoch is a free variable, so a fixed order loses
  nothing).

Matching losses: ``"l2"`` Σ‖g − t‖² (DLG, Zhu et al. 2019 Eq. 4) and
``"cosine"`` 1 − ⟨g, t⟩/(‖g‖‖t‖) over all layers jointly (Geiping et al. 2020
Eq. 4), plus ``tv`` × total variation (mean absolute difference of
neighbouring pixels). Optimizers: ``"adam"`` (optionally on the *sign* of the
gradient, and with step decay ×0.1 at 3/8, 5/8, 7/8 of the iterations, as in
Geiping et al.'s reference settings) and ``"lbfgs"`` (``optax.lbfgs`` with its
zoom line search, DLG). The box constraint projects inputs onto [0, 1] after
every step.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from attacks.api import Reconstruction
from attacks.labels import infer_labels, observed_gradient
from fedsim import memory, models, random_draws
from fedsim.config import ConfigError
from fedsim.suggest import did_you_mean_each
from fedsim.typing import Observation, Params
from fedsim.x64 import x64_invariant


class AttackConfigError(ConfigError):
    """An invalid attack config; the message names the key and what is allowed.

    A :class:`fedsim.config.ConfigError` (and so a ``ValueError``): ``fedsim
    attack`` reports it as one line naming ``attack.config.<key>``, as it does
    the rest of the config.
    """


@dataclasses.dataclass(frozen=True)
class InversionConfig:
    """Static settings of one gradient-matching attack (hashable: a jit key).

    Attributes:
      loss: "cosine" or "l2".
      tv: weight of the total-variation prior.
      optimizer: "adam" or "lbfgs".
      lr: optimizer learning rate (Adam) / initial step scale (ignored by lbfgs).
      iterations: optimisation steps.
      restarts: independent random initialisations per victim.
      signed: Adam on the sign of the gradient (Geiping et al.).
      decay: step decay ×0.1 at 3/8, 5/8, 7/8 of the iterations.
      box: project inputs onto [0, 1] after every step.
      init: "uniform" on [0, 1] or "gaussian" (N(0.5, 0.25²)) dummy inputs.
      label_mode: "given" (labels fixed) or "joint" (optimise label logits, DLG).
      simulate: "gradient" or "fedavg".
      local_steps, local_batch, local_lr: the unrolled FedAvg training.
      masked: compare only the coordinates of SGI's mask (paper 002 Alg. 2): the
        target's non-zero coordinates (:func:`support_mask`), or, with
        ``mask_in_target``, the mask that comes with it. The one implementation
        of SGI's masking; :mod:`attacks.sgi` sets it.
      mask_in_target: with ``masked``, each target is ``{"gradient": g,
        "mask": m}`` (SGI's m = 1[w_g + Δ ≠ 0], read off the client's weights,
        Alg. 2 line 3) instead of a gradient whose zeros are the mask.
    """

    loss: str = "cosine"
    tv: float = 1e-4
    optimizer: str = "adam"
    lr: float = 0.1
    iterations: int = 1000
    restarts: int = 1
    signed: bool = True
    decay: bool = True
    box: bool = True
    init: str = "uniform"
    label_mode: str = "given"
    simulate: str = "gradient"
    local_steps: int = 1
    local_batch: int = 1
    local_lr: float = 0.1
    masked: bool = False
    mask_in_target: bool = False


_CHOICES = {"loss": ("cosine", "l2"), "optimizer": ("adam", "lbfgs"),
            "init": ("uniform", "gaussian"), "label_mode": ("given", "joint", "infer"),
            "simulate": ("gradient", "fedavg")}


#: Keys every gradient-matching attack takes beside its ``DEFAULTS``, with the
#: value their absence means (:func:`invert_victims` documents them).
OPTIONAL_KEYS = {"batch_size": None, "last_layer": None, "victims_per_call": None,
                 "shard_victims": False}


def config_keys(defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Every ``attack.config`` key a gradient-matching attack over ``defaults``
    takes, with its default (an attack's ``run.config_keys``, which ``fedsim list
    attacks`` shows)."""
    return {**defaults, **OPTIONAL_KEYS}


def refuse_unknown_keys(config: Mapping[str, Any], allowed) -> None:
    """Raise :class:`AttackConfigError` naming the keys of ``config`` not in ``allowed``
    (listing those, and the closest of them)."""
    unknown = set(config) - set(allowed)
    if unknown:
        raise AttackConfigError(f"attack.config: unknown key(s) {sorted(unknown)}; "
                                f"allowed: {', '.join(sorted(allowed))}"
                                f"{did_you_mean_each(unknown, allowed)}")


def parse_config(defaults: Mapping[str, Any], config: Mapping[str, Any],
                 extra_keys: Sequence[str] = ()) -> dict[str, Any]:
    """Merge ``config`` over ``defaults``; unknown keys and bad values raise.

    Raises:
      AttackConfigError: naming the offending ``attack.config.<key>``.
    """
    refuse_unknown_keys(config, set(defaults) | set(extra_keys))
    out = {**defaults, **config}
    for k, choices in _CHOICES.items():
        if k in out and out[k] not in choices:
            raise AttackConfigError(f"attack.config.{k}: {out[k]!r} is not allowed; "
                                    f"allowed: {', '.join(choices)}")
    for k in ("iterations", "restarts", "local_steps", "local_batch"):
        if k in out and not _is_positive_int(out[k]):
            raise AttackConfigError(f"attack.config.{k}: must be a positive integer (at most "
                                    f"2**31 - 1), got {out[k]!r}")
    for k in ("tv", "lr", "local_lr"):
        # NaN would pass a bare `< 0` and poison every step of the attack
        if k in out and not (_is_number(out[k]) and 0 <= out[k] < float("inf")):
            raise AttackConfigError(f"attack.config.{k}: must be a finite non-negative number, "
                                    f"got {out[k]!r}")
    for k in ("signed", "decay", "box", "shard_victims"):
        if k in out and not isinstance(out[k], bool):
            raise AttackConfigError(f"attack.config.{k}: must be true or false, got {out[k]!r}")
    if out.get("batch_size") is not None and not _is_positive_int(out["batch_size"]):
        raise AttackConfigError("attack.config.batch_size: must be a positive integer (or "
                                f"absent), got {out['batch_size']!r}")
    if out.get("last_layer") is not None and not isinstance(out["last_layer"], str):
        raise AttackConfigError("attack.config.last_layer: must be a parameter name (a string), "
                                f"got {out['last_layer']!r}")
    return out


def _is_positive_int(v) -> bool:
    # At most int32's largest: iterations = 3e9 passed and overflowed in the jitted loop.
    return (isinstance(v, (int, np.integer)) and not isinstance(v, bool)
            and 1 <= v <= 2**31 - 1)


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


# --- building blocks -----------------------------------------------------------

def total_variation(x: jax.Array) -> jax.Array:
    """Mean absolute difference of vertically and horizontally adjacent pixels.

    An image one pixel high (or wide) has no such pair in that direction,
    which then adds 0 (the mean of no differences was NaN).
    """
    dh = (jnp.mean(jnp.abs(x[..., 1:, :, :] - x[..., :-1, :, :])) if x.shape[-3] > 1
          else jnp.zeros((), x.dtype))
    dw = (jnp.mean(jnp.abs(x[..., :, 1:, :] - x[..., :, :-1, :])) if x.shape[-2] > 1
          else jnp.zeros((), x.dtype))
    return dh + dw


def _soft_ce(logits, targets):
    return jnp.mean(optax.softmax_cross_entropy(logits, targets))


def make_simulate(apply_fn, cfg: InversionConfig) -> Callable:
    """``simulate(params, x, y_probs) -> pytree`` the dummy batch would upload."""

    def grad_at(params, x, y):
        return jax.grad(lambda p: _soft_ce(apply_fn(p, x), y))(params)

    if cfg.simulate == "gradient":
        return grad_at

    def weighted_grad_at(params, x, y, w):
        def loss(p):
            per_example = optax.softmax_cross_entropy(apply_fn(p, x), y)
            return jnp.sum(per_example * w) / jnp.sum(w)
        return jax.grad(loss)(params)

    def fedavg(params, x, y):
        n = x.shape[0]
        b = min(cfg.local_batch, n)
        per_epoch = -(-n // b)
        # Pad to whole batches by wrapping around (static shapes); the wrapped
        # rows get weight 0, so a partial last batch is the mean over its real
        # rows, as the client's masked_mean_loss takes it (fedsim.client).
        slots = jnp.arange(per_epoch * b)
        idx = slots % n
        xb = x[idx].reshape((per_epoch, b) + x.shape[1:])
        yb = y[idx].reshape((per_epoch, b) + y.shape[1:])
        wb = (slots < n).astype(x.dtype).reshape(per_epoch, b)

        def step(p, s):
            i = s % per_epoch
            g = weighted_grad_at(p, xb[i], yb[i], wb[i])
            return jax.tree_util.tree_map(lambda w, gw: w - cfg.local_lr * gw, p, g), None

        final, _ = jax.lax.scan(step, params, jnp.arange(cfg.local_steps))
        return jax.tree_util.tree_map(lambda a, b0: a - b0, final, params)

    return fedavg


def support_mask(tree: Params) -> Params:
    """The {0,1} mask of a pytree's nonzero coordinates (SGI, paper 002 Alg 2 line 2)."""
    return jax.tree_util.tree_map(lambda u: (u != 0).astype(jnp.float32), tree)


def matching_loss(sim: Params, target: Params, kind: str) -> jax.Array:
    """Gradient-matching loss between two pytrees (see module docstring)."""
    s = jax.tree_util.tree_leaves(sim)
    t = jax.tree_util.tree_leaves(target)
    if kind == "l2":
        return sum(jnp.sum((a - b) ** 2) for a, b in zip(s, t))
    dot = sum(jnp.sum(a * b) for a, b in zip(s, t))
    ns = sum(jnp.sum(a * a) for a in s)
    nt = sum(jnp.sum(b * b) for b in t)
    return 1.0 - dot / jnp.maximum(jnp.sqrt(ns) * jnp.sqrt(nt), 1e-20)


def _optimizer(cfg: InversionConfig) -> optax.GradientTransformation:
    # x64_invariant: under jax_enable_x64, Adam's bias correction and L-BFGS's
    # line search would compute in float64 and the attack would round otherwise.
    return x64_invariant(_float_optimizer(cfg))


def _float_optimizer(cfg: InversionConfig) -> optax.GradientTransformation:
    if cfg.optimizer == "lbfgs":
        return optax.lbfgs()
    n = cfg.iterations
    lr = (optax.piecewise_constant_schedule(cfg.lr, {int(3 * n / 8): 0.1, int(5 * n / 8): 0.1,
                                                     int(7 * n / 8): 0.1})
          if cfg.decay else cfg.lr)
    parts = [optax.adam(lr)]
    if cfg.signed:
        parts.insert(0, optax.stateless(lambda u, p=None: jax.tree_util.tree_map(jnp.sign, u)))
    return optax.chain(*parts)


def make_objective(simulate: Callable, cfg: InversionConfig, num_classes: int) -> Callable:
    """Build ``objective(z, params, target, labels) -> loss``, the attack loss of a dummy.

    ``z`` is ``{"x": inputs [B, ...], "y": label logits [B, K]}`` (the logits are
    used in joint label mode only; otherwise ``labels`` are). ``simulate`` comes
    from :func:`make_simulate`.
    """
    joint = cfg.label_mode == "joint"

    def objective(z, params, target, labels):
        x = z["x"]
        y = jax.nn.softmax(z["y"]) if joint else jax.nn.one_hot(labels, num_classes, dtype=x.dtype)
        sim = simulate(params, x, y)
        if cfg.masked:
            # g(x̂) ⊙ m (and the target ⊙ m): coordinates outside the mask leave
            # both the dot product and the norms of the cosine loss.
            if cfg.mask_in_target:
                mask = target["mask"]
                target = jax.tree_util.tree_map(jnp.multiply, target["gradient"], mask)
            else:
                mask = support_mask(target)
            sim = jax.tree_util.tree_map(jnp.multiply, sim, mask)
        loss = matching_loss(sim, target, cfg.loss)
        return loss + cfg.tv * total_variation(x) if cfg.tv > 0 else loss

    return objective


def initial_dummy(key: jax.Array, cfg: InversionConfig, batch_size: int,
                  input_shape: tuple[int, ...], num_classes: int) -> dict:
    """The starting dummy ``{"x": [B, ...], "y": [B, K]}`` of one restart (``cfg.init``)."""
    kx, ky = jax.random.split(key)
    shape = (batch_size, *input_shape)
    # Flat draws, the same bits: a multi-dimensional one compiles seconds longer
    # on XLA:CPU (fedsim.random_draws).
    x0 = (random_draws.uniform(kx, shape, jnp.float32) if cfg.init == "uniform"
          else 0.5 + 0.25 * random_draws.normal(kx, shape, jnp.float32))
    return {"x": x0, "y": random_draws.normal(ky, (batch_size, num_classes), jnp.float32)}


def _is_float64(params: Params) -> bool:
    """Whether any leaf of the model is float64 (a ``training.dtype: float64`` run)."""
    return any(getattr(leaf, "dtype", None) == jnp.float64
               for leaf in jax.tree_util.tree_leaves(params))


def first_order_step(fn: Callable, opt: optax.GradientTransformation,
                     cfg: InversionConfig) -> Callable:
    """One step ``(z, opt_state), _ -> ((z, opt_state), loss)`` of a first-order optimizer.

    Outside joint label mode the label logits stay fixed; with ``cfg.box`` the
    inputs are clipped to [0, 1] after the step. For ``lax.scan``.
    """
    vg = jax.value_and_grad(fn)
    joint = cfg.label_mode == "joint"

    def step(carry, _):
        z, state = carry
        value, g = vg(z)
        if not joint:
            g = {**g, "y": jnp.zeros_like(g["y"])}
        upd, state = opt.update(g, state, z)
        z = optax.apply_updates(z, upd)
        if cfg.box:
            z = {**z, "x": jnp.clip(z["x"], 0.0, 1.0)}
        return (z, state), value

    return step


def make_inverter(apply_fn, cfg: InversionConfig, batch_size: int,
                  input_shape: tuple[int, ...], num_classes: int) -> Callable:
    """Build ``invert(params, target, labels, key) -> (x_all, y_all, losses)`` for one victim.

    ``x_all``: [R, B, ...] every restart's inputs; ``y_all``: [R, B] labels;
    ``losses``: [R] final attack loss per restart. Pure, jit- and vmap-able.
    """
    objective = make_objective(make_simulate(apply_fn, cfg), cfg, num_classes)
    opt = _optimizer(cfg)
    joint = cfg.label_mode == "joint"

    def one_restart(params, target, labels, key):
        z = initial_dummy(key, cfg, batch_size, input_shape, num_classes)
        if _is_float64(params):
            # A float64 model (training.dtype: float64) is attacked in float64,
            # from the float32 attack's start: the two differ by rounding only.
            # A float32 dummy against float64 gradients mixed the two, and
            # L-BFGS refused it (its line search's branches differed in type).
            z = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), z)
        fn = functools.partial(objective, params=params, target=target, labels=labels)
        state = opt.init(z)
        if cfg.optimizer == "lbfgs":
            if cfg.box:
                # The line search's cached value and gradient belong to the
                # unclipped point; after the projection they are stale.
                fresh = jax.value_and_grad(fn)
                vg = lambda z, state: fresh(z)
            else:
                vg = optax.value_and_grad_from_state(fn)

            def step(carry, _):
                z, state = carry
                value, g = vg(z, state=state)
                upd, state = opt.update(g, state, z, value=value, grad=g, value_fn=fn)
                z = optax.apply_updates(z, upd)
                if cfg.box:
                    z = {**z, "x": jnp.clip(z["x"], 0.0, 1.0)}
                return (z, state), value
        else:
            step = first_order_step(fn, opt, cfg)

        (z, _), trace = jax.lax.scan(step, (z, state), None, length=cfg.iterations)
        final = fn(z)
        final = jnp.where(jnp.isfinite(final), final, jnp.inf)
        y_out = jnp.argmax(z["y"], -1).astype(jnp.int32) if joint else labels
        return z["x"], y_out, final

    def invert(params, target, labels, key):
        keys = jax.random.split(key, cfg.restarts)
        return jax.vmap(one_restart, in_axes=(None, None, None, 0))(params, target, labels, keys)

    return invert


#: The mesh axis victims are split over when an attack shards them.
VICTIMS = "victims"


def victim_mesh(shard_victims: bool) -> Mesh | None:
    """The 1-D mesh over every device (of every process) named :data:`VICTIMS`,
    or None where the victims stay on one device: not asked for, or one device."""
    devices = jax.devices()
    return Mesh(np.array(devices), (VICTIMS,)) if shard_victims and len(devices) > 1 else None


@functools.lru_cache(maxsize=32)
def _compiled(apply_fn, cfg, batch_size, input_shape, num_classes, shared_params=False,
              mesh: Mesh | None = None):
    invert = make_inverter(apply_fn, cfg, batch_size, input_shape, num_classes)
    # Shared params (victims of one round) stay unbatched: a [V]-batched weight
    # turns every matmul into a batched one, measured slower on CPU.
    victims = jax.vmap(invert, in_axes=(None if shared_params else 0, 0, 0, 0))
    if mesh is not None:
        # Each device attacks its block of victims; the inputs come in whole
        # (every process holds them all) and the results go back whole to every
        # device (one all-gather), so that every process reads them. Victims
        # never interact, so nothing else crosses devices. check_vma=False for
        # the reason fedsim.sharding gives: the objective differentiates
        # through the replicated weights, which must not sum across devices.
        specs = (P() if shared_params else P(VICTIMS), P(VICTIMS), P(VICTIMS), P(VICTIMS))
        local = jax.shard_map(victims, mesh=mesh, in_specs=specs, out_specs=P(VICTIMS),
                              check_vma=False)
        victims = lambda *args: jax.lax.with_sharding_constraint(  # noqa: E731
            local(*args), NamedSharding(mesh, P()))

    def traced(*args):
        # Victims and restarts are vmapped and the objective differentiates with
        # respect to the weights: fedsim's Conv then takes im2col at the dummy
        # batches above its plain rule's (benchmarks/results/vmapped_conv_cpu.md).
        # Read while jit traces, so the block sits inside the traced function.
        with models.vmapped_instances():
            return victims(*args)

    return jax.jit(traced)


def invert_victims(apply_fn, cfg: InversionConfig, params: Params, targets: Params,
                   labels: jax.Array, keys: jax.Array, *, batch_size: int,
                   input_shape: tuple[int, ...], num_classes: int,
                   shared_params: bool = False,
                   victims_per_call: int | None = None,
                   shard_victims: bool = False) -> dict[str, np.ndarray]:
    """Run the attack on V victims at once (vmap over victims × restarts).

    Where all V at once would not fit in memory, in calls of as many as fit
    (:func:`choose_victims_per_call`), with a ``RuntimeWarning``: how many fit
    depends on the free memory, and split calls equal one call's results only up
    to float rounding, which signed Adam can amplify. Pass ``victims_per_call``
    to fix the split, and with it the numbers, across runs.

    With ``shard_victims`` and more than one device, each call's victims are
    split evenly over every device of every process (:func:`victim_mesh`,
    ``jax.shard_map``), the call padded to a multiple of the device count.
    Each device then plans and runs the attack on its block alone, so the
    memory check sizes a device's block. Across processes, each process
    attacks only its devices' blocks and every process gets all results. A
    victim's numbers then equal the unsharded ones up to float rounding, as
    for a split.

    Args:
      params, targets: pytrees with a leading victim axis [V, ...] (``params``
        without it when ``shared_params``: every victim started from the same
        global model).
      labels: int32 [V, B] (ignored in joint label mode).
      keys: [V] typed keys, one per victim.
      victims_per_call: attack the victims in calls of this many (the last one
        padded); ``None`` sizes the calls from the free memory. When sharding,
        a multiple of the device count.
      shard_victims: split each call's victims over all devices.

    Returns:
      dict with ``x`` [V, B, ...] best restart, ``labels`` [V, B], ``loss`` [V],
      ``restart_losses`` [V, R], ``victims_per_call``, ``devices`` (how many
      devices each call's victims were split over).

    Raises:
      FloatingPointError: if every restart of some victim ended non-finite.
      AttackMemoryError: not even one victim's attack fits in memory, or the
        given ``victims_per_call`` does not.
      AttackConfigError: ``victims_per_call`` is not a positive integer, or
        not a multiple of the device count when sharding.
    """
    static = (apply_fn, cfg, int(batch_size), tuple(input_shape), int(num_classes),
              bool(shared_params))
    fn = _compiled(*static)  # what one device runs on its victims: the plans' subject
    mesh = victim_mesh(shard_victims)
    n = 1 if mesh is None else mesh.size
    V = int(labels.shape[0])
    block = -(-V // n)  # a device's share of all V victims in one call
    args = ((params, targets, labels, keys) if block == V else
            (params if shared_params else _first(params, block), _first(targets, block),
             labels[:block], keys[:block]))
    if victims_per_call is None:
        k = choose_victims_per_call(fn, *args, shared_params) * n
        if k < block * n:
            warnings.warn(
                f"attacking {V} victims in calls of {k}: all at once would not fit in the "
                f"free memory. Split calls equal one call's results only up to float "
                f"rounding, and the split follows the free memory: set "
                f"attack.config.victims_per_call: {k} to get the same numbers on every run",
                RuntimeWarning, stacklevel=2)
    else:
        _check_positive(victims_per_call)  # before the modulo below
        if victims_per_call % n:
            raise AttackConfigError(
                f"attack.config.victims_per_call: {victims_per_call} is not a multiple of the "
                f"{n} devices the victims are sharded over (attack.config.shard_victims)")
        k = check_victims_per_call(victims_per_call // n, fn, *args, shared_params,
                                   devices=n) * n
    if mesh is not None:
        fn = _compiled(*static, mesh)
    parts = []
    if k == V:  # the common case: one call, on the arrays as given
        parts.append([np.asarray(a) for a in jax.block_until_ready(
            fn(params, targets, labels, keys))])
    for start in range(0, V if k != V else 0, k):
        # Every call has k victims, the last one padded with repeats of the
        # last victim (so one executable serves all calls); the padding is dropped.
        idx = jnp.asarray(np.minimum(np.arange(start, start + k), V - 1))
        take = lambda tree: jax.tree_util.tree_map(lambda a: a[idx], tree)
        args = (params if shared_params else take(params), take(targets), labels[idx], keys[idx])
        out = jax.block_until_ready(fn(*args))
        parts.append([np.asarray(a)[: min(k, V - start)] for a in out])
    x_all, y_all, losses = (np.concatenate(p) for p in zip(*parts))
    if not np.all(np.isfinite(losses).any(axis=1)):
        bad = np.flatnonzero(~np.isfinite(losses).any(axis=1)).tolist()
        raise FloatingPointError(f"attack loss is NaN/inf for every restart of victim(s) {bad}; "
                                 "lower attack.config.lr or check the observed update")
    best = np.argmin(losses, axis=1)
    v = np.arange(len(best))
    return {"x": x_all[v, best], "labels": y_all[v, best], "loss": losses[v, best],
            "restart_losses": losses, "victims_per_call": k, "devices": n}


_PLANS: dict = {}

#: What a vmapped inversion call really takes, as a multiple of XLA's plan for it.
#: On the 2-core XLA:CPU, Inverting Gradients on Conv-2 grew the resident memory
#: by 1.51–2.08× the plan at 8 and 32 victims, first and second call alike
#: (``benchmarks/results/attack_memory.md``), against 0.99–1.14× for the engine's
#: cohort step (``cohort_step_memory.md``). At 8 victims it stayed 2.06–2.07×
#: (first call) and 1.76–1.86× (second) with 5 or 40 iterations, single-threaded
#: Eigen or without XLA:CPU's thunk runtime (``attack_memory_{it5,it40,
#: eigen_single_thread,no_thunk_runtime}.md``); where it comes from is not
#: established. So calls are sized for 2.1× the plan. On an H100 a whole call grew
#: by exactly its plan (64 and 256 victims, autotuning on and off), but an attack
#: split into calls of 43 victims grew by at least 1.46× one such call's plan
#: (``benchmarks/results/gpu_session_h100_memory/``), so the margin stays on
#: every backend.
PLAN_MARGIN = 2.1


def _planned(fn, *args) -> int | None:
    """:func:`fedsim.memory.planned_bytes`, kept per (attack, argument shapes):
    lowering again on every call would put tracing time into timed attacks."""
    shapes = tuple((tuple(a.shape), str(a.dtype)) for a in jax.tree_util.tree_leaves(args))
    key = (fn, shapes)
    if key not in _PLANS:
        if len(_PLANS) >= 64:  # bounded, like _compiled's cache of attacks
            _PLANS.clear()
        _PLANS[key] = memory.planned_bytes(fn, *args)
    return _PLANS[key]


class AttackMemoryError(memory.InsufficientMemoryError, MemoryError):
    """Not even one victim's attack fits in the free memory.

    Also a :class:`fedsim.memory.InsufficientMemoryError`, which ``fedsim``
    reports as one line, like the engine's own memory check.
    """


def _first(tree, k: int):
    return jax.tree_util.tree_map(lambda a: a[:k], tree)


def _check_positive(k) -> None:
    if not _is_positive_int(k):
        raise AttackConfigError(f"attack.config.victims_per_call: must be a positive integer, "
                                f"got {k!r}")


def check_victims_per_call(k, fn, params, targets, labels, keys, shared_params: bool,
                           devices: int = 1) -> int:
    """A caller's ``victims_per_call``, validated and checked against the free memory.

    With the victims sharded over ``devices`` devices, ``k`` and the arrays are
    one device's share (the error message names the whole call).

    Returns:
      ``min(k, V)``.

    Raises:
      AttackConfigError: ``k`` is not a positive integer.
      AttackMemoryError: a call of ``k`` victims plans more than fits (with the
        measured :data:`PLAN_MARGIN`); not checked with ``$FEDSIM_MEMORY_CHECK=0``.
    """
    _check_positive(k)
    k = min(int(k), int(labels.shape[0]))
    if memory.check_enabled():
        free = memory.available_bytes()
        planned = _planned(fn, params if shared_params else _first(params, k),
                           _first(targets, k), labels[:k], keys[:k])
        need = None if planned is None else planned * PLAN_MARGIN
        if not memory.fits(need, free):
            each = f" ({k} on each of {devices} devices)" if devices > 1 else ""
            raise AttackMemoryError(
                f"attack.config.victims_per_call: a call of {k * devices} victims{each} plans "
                f"{memory.gib(planned)}{' per device' if devices > 1 else ''} "
                f"(× {PLAN_MARGIN} measured overhead), more than {memory.HEADROOM:.0%} of the "
                f"{memory.gib(free)} free: give fewer victims per call")
    return k


def choose_victims_per_call(fn, params, targets, labels, keys, shared_params: bool) -> int:
    """How many victims one call of the vmapped attack ``fn`` may take.

    All of them where XLA's plan for the whole call
    (:func:`fedsim.memory.planned_bytes`, compiled ahead of time, which the call
    then reuses), times the measured :data:`PLAN_MARGIN`, fits in
    :data:`fedsim.memory.HEADROOM` of the free memory. Otherwise the plans for
    one and for all victims give the cost per victim (the plan grew linearly:
    0.021 / 0.165 / 0.660 GiB for 1 / 8 / 32 victims in ``attack_memory.md``),
    and the victims are attacked in calls of as many as fit: each victim's
    attack is independent of the others' (its own key, target and labels), so
    the results are those of one call up to float rounding.
    ``$FEDSIM_MEMORY_CHECK=0`` skips the planning.

    Raises:
      AttackMemoryError: one victim's attack alone does not fit.
    """
    V = int(labels.shape[0])
    if not memory.check_enabled():
        return V
    free = memory.available_bytes()
    need = _planned(fn, params, targets, labels, keys)
    fits = lambda planned: memory.fits(None if planned is None else planned * PLAN_MARGIN, free)
    if fits(need):
        return V

    def plan(k: int) -> int | None:  # the first k victims' call; the run reuses its compile
        return _planned(fn, params if shared_params else _first(params, k), _first(targets, k),
                        labels[:k], keys[:k])

    one = plan(1)
    if one is None:
        return V
    per_victim = max((need - one) / (V - 1), 1.0) if V > 1 else float(need)
    budget = memory.HEADROOM * free / PLAN_MARGIN  # in planned bytes
    k = min(int((budget - (one - per_victim)) // per_victim), V - 1)
    if k < 1 or not fits(one):
        raise AttackMemoryError(
            f"the attack on one victim plans {memory.gib(one)} (× {PLAN_MARGIN} measured "
            f"overhead), more than {memory.HEADROOM:.0%} of the {memory.gib(free)} free: "
            "lower attack.config.restarts or the victims' batch size, or attack a smaller model")
    # The line through 1 and V victims is XLA's plan only approximately: check k itself.
    while k > 1:
        planned = plan(k)
        if fits(planned):
            break
        k = max(1, min(k - 1, int(k * budget / planned)))
    return k


# --- the Observation-level entry points ----------------------------------------

def check_inversion_config(config: Mapping[str, Any], defaults: Mapping[str, Any],
                           grants: Mapping[str, bool] | None = None,
                           algorithm: str | None = None) -> None:
    """What a gradient-matching attack's ``check_config`` checks before any victim
    is observed: the settings (:func:`inversion_config`), and, given the threat
    model's ``grants``, that the victim's batch size will be known
    (:func:`victim_batch_size` reads it from the config or a granted field).

    Args:
      algorithm: the run's ``training.algorithm``, where known. A FedAvg
        upload's batch size is the granted ``batch_size`` only if the server
        also knows the client took a single local step (``local_steps``
        granted; whether it was one is seen per victim).

    Raises:
      AttackConfigError: naming the setting or the grant.
    """
    merged = inversion_config(config, defaults)[1]
    if grants is not None and merged.get("label_mode") == "given" and not grants.get("labels"):
        raise AttackConfigError(_LABELS_NOT_GRANTED)
    if grants is None or merged.get("batch_size") is not None or grants.get("num_examples"):
        return
    if algorithm == "fedavg" and grants.get("batch_size") and not grants.get("local_steps"):
        raise AttackConfigError(
            "the victim's batch size is unknown: under training.algorithm=fedavg the granted "
            "'batch_size' is the attacked batch only after one local step, which the server "
            "cannot see without 'local_steps'; grant 'num_examples' (the whole local data), "
            "or 'local_steps' as well, in the threat model (attack.grants), or set "
            "attack.config.batch_size")
    if not grants.get("batch_size"):
        raise AttackConfigError(_UNKNOWN_BATCH_SIZE)


def config_checker(defaults: Mapping[str, Any]) -> Callable[..., None]:
    """A gradient-matching attack's ``check_config`` over its ``defaults``
    (:func:`check_inversion_config`)."""

    def check_config(config: Mapping[str, Any], grants: Mapping[str, bool] | None = None,
                     algorithm: str | None = None) -> None:
        """Raise :class:`AttackConfigError` for a bad ``config``, or one the threat
        model's ``grants`` (where given) leave short for uploads of ``algorithm``
        (``training.algorithm``, where given), before any victim is observed
        (``fedsim attack`` calls it first)."""
        check_inversion_config(config, defaults, grants, algorithm)

    return check_config


_UNKNOWN_BATCH_SIZE = ("the victim's batch size is unknown: grant 'batch_size' (or 'num_examples') "
                       "in the threat model (attack.grants), or set attack.config.batch_size")
_LABELS_NOT_GRANTED = ("attack.config.label_mode=given attacks with the victims' true labels, "
                       "which the threat model does not grant: grant 'labels' (attack.grants), "
                       "or set label_mode to 'infer' (labels inferred from the upload) or "
                       "'joint' (optimised with the inputs)")


def victim_batch_size(obs: Observation, config: Mapping[str, Any]) -> int:
    """B: granted by the threat model, or assumed by the attacker's config.

    Raises:
      AttackConfigError: when B is unknown, or not an integer >= 1 (naming
        where it came from).
    """
    if config.get("batch_size") is not None:
        return _batch_count(config["batch_size"], "attack.config.batch_size")
    if obs.algorithm == "fedsgd" and obs.num_examples is not None:
        return _batch_count(obs.num_examples, "the observation's num_examples")
    if obs.batch_size is not None and (obs.algorithm == "fedsgd" or obs.local_steps == 1):
        return _batch_count(obs.batch_size, "the observation's batch_size")
    if obs.num_examples is not None:
        return _batch_count(obs.num_examples, "the observation's num_examples")
    raise AttackConfigError(_UNKNOWN_BATCH_SIZE)


def _batch_count(value, where: str) -> int:
    # 0 failed in a modulo, −1 in np.repeat, and 2.5 was read as 2.
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < 1:
        raise AttackConfigError(f"{where} must be an integer >= 1 (the victim's batch size), "
                                f"got {value!r}")
    return int(value)


def check_observation_fits_model(obs: Observation, batch: int) -> None:
    """Refuse an observation whose ``input_shape`` or ``num_classes`` the model does not take.

    Traced shapes only (``jax.eval_shape``): a batch of ``batch`` inputs of
    ``input_shape`` must go through ``apply_fn`` and give ``num_classes``
    logits. Before, a shape with the batch axis in it was attacked as such,
    and a wrong one failed deep inside flax or as a NaN loss blamed on the lr.

    Raises:
      AttackConfigError: naming the shape or class count and what the model takes.
    """
    shape = tuple(obs.input_shape)
    if len(shape) != 3 or not all(isinstance(n, (int, np.integer)) and n >= 1 for n in shape):
        # The attacks reconstruct images (their TV prior, the metrics): [H, W, C].
        raise AttackConfigError(f"the observation's input_shape must be one image's (H, W, C), "
                                f"e.g. (28, 28, 1), without the batch axis; got "
                                f"{obs.input_shape!r}")
    try:
        out = jax.eval_shape(obs.apply_fn, obs.params,
                             jax.ShapeDtypeStruct((batch, *shape), jnp.float32))
    except Exception as e:  # noqa: BLE001 -- flax/jax name many shape errors differently
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise AttackConfigError(
            f"the model cannot take a batch of inputs of the observation's input_shape "
            f"{shape} (one example, no batch axis: e.g. (28, 28, 1)): {type(e).__name__}: "
            f"{first}") from None
    classes = getattr(out, "shape", (None,))[-1]
    if classes != obs.num_classes:
        raise AttackConfigError(f"the observation's num_classes is {obs.num_classes!r}, but the "
                                f"model gives {classes} logits per example")


def victim_keys(key, stream: int, n: int):
    """The ``n`` victims' keys for one ``stream`` (1: label inference, 2: the attack).

    ``key`` is either one key for the call, victim i's stream then being
    derived from its position i, or a sequence of ``n`` keys, one per victim
    (a list, or a key array of shape (n,)), victim i's stream then being what
    ``[victim i]`` alone with ``key[i]`` gets. The second keeps a victim's
    numbers the same whichever other victims are attacked with it (up to
    vmap's float rounding): ``fedsim attack`` keys each observed client by its
    id, so attacking clients [0, 1] or [1] gives client 1 the same start.

    Raises:
      AttackConfigError: a sequence of keys whose length is not ``n``.
    """
    dtype = getattr(key, "dtype", None)
    if isinstance(key, (list, tuple)) or (
            dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
            and key.ndim == 1):
        if len(key) != n:
            raise AttackConfigError(f"{len(key)} keys given for {n} victims: pass one key, or "
                                    "one per victim")
        return jnp.stack([jax.random.split(jax.random.fold_in(k, stream), 1)[0] for k in key])
    return jax.random.split(jax.random.fold_in(key, stream), n)


def prepare_victims(observations: Sequence[Observation], config: Mapping[str, Any],
                    cfg: InversionConfig, key, target_fn: Callable[[Observation], Params]):
    """Stack V observations into arrays and resolve labels (given / inferred / joint).

    Labels: zeros for ``joint`` (the attack optimises them); else the granted
    ones where the threat model grants them, whatever the mode (``infer`` only
    infers what is not granted); else inferred (:func:`attacks.labels.infer_labels`)
    for ``infer``. ``given`` without granted labels is refused.

    Raises:
      AttackConfigError: ``label_mode`` is ``given`` and a victim's labels are not
        granted; victims differ in batch size or input shape.
    """
    if not observations:
        raise AttackConfigError("no observations to attack")
    first = observations[0]
    bs = victim_batch_size(first, config)
    check_observation_fits_model(first, bs)
    label_keys = victim_keys(key, 1, len(observations))
    labels, inferred = [], False
    for obs, k in zip(observations, label_keys):
        if victim_batch_size(obs, config) != bs or obs.input_shape != first.input_shape:
            raise AttackConfigError("all victims attacked together need the same batch size "
                                    "and input shape")
        if cfg.label_mode == "joint":
            labels.append(jnp.zeros((bs,), jnp.int32))
        elif obs.labels is not None:
            lab = jnp.asarray(obs.labels, jnp.int32)
            if lab.shape != (bs,):
                raise AttackConfigError(f"granted labels have shape {lab.shape}, expected ({bs},)")
            if bool(jnp.any((lab < 0) | (lab >= obs.num_classes))):
                # Out of range, one_hot gives a zero row: a NaN loss blamed on the lr.
                raise AttackConfigError(f"granted labels must be classes in [0, "
                                        f"{obs.num_classes}); got {np.asarray(lab).tolist()}")
            labels.append(lab)
        elif config.get("label_mode") == "given":  # not silently inferred instead
            raise AttackConfigError(_LABELS_NOT_GRANTED)
        else:
            labels.append(infer_labels(obs, bs, k, name=config.get("last_layer")))
            inferred = True
    stack = lambda trees: jax.tree_util.tree_map(lambda *a: jnp.stack(a), *trees)
    shared = all(_same_tree(o.params, first.params) for o in observations[1:])
    params = first.params if shared else stack([o.params for o in observations])
    targets = stack([target_fn(o) for o in observations])
    attack_keys = victim_keys(key, 2, len(observations))
    return bs, params, targets, jnp.stack(labels), attack_keys, inferred, shared


def _same_tree(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(x is y or (x.shape == y.shape and bool(jnp.array_equal(x, y)))
                                      for x, y in zip(la, lb))


def inversion_config(config: Mapping[str, Any], defaults: Mapping[str, Any],
                     cfg_overrides: Mapping[str, Any] | None = None
                     ) -> tuple[InversionConfig, dict[str, Any]]:
    """``(cfg, merged)``: the :class:`InversionConfig` an attack runs with, and the
    merged config (``cfg``'s fields plus ``batch_size`` / ``last_layer`` /
    ``victims_per_call`` / ``shard_victims``, which :func:`invert_victims`
    documents).

    ``label_mode = "infer"`` becomes "given" in ``cfg``: the labels are inferred
    once, before the optimisation (:func:`prepare_victims`), and then given.
    """
    merged = parse_config(defaults, config,
                          extra_keys=tuple(OPTIONAL_KEYS))
    k = merged.get("victims_per_call")
    if k is not None:
        _check_positive(k)
    fields = {f.name for f in dataclasses.fields(InversionConfig)}
    settings = {k: v for k, v in merged.items() if k in fields}
    settings.update(cfg_overrides or {})
    if settings.get("label_mode") == "infer":
        settings["label_mode"] = "given"
    return InversionConfig(**settings), merged


def run_inversion(observations: Sequence[Observation], config: Mapping[str, Any], key,
                  defaults: Mapping[str, Any], target_fn=observed_gradient,
                  cfg_overrides: Mapping[str, Any] | None = None) -> list[Reconstruction]:
    """Parse the config, attack every observation (vmapped), return reconstructions."""
    cfg, merged = inversion_config(config, defaults, cfg_overrides)
    first = observations[0]
    bs, params, targets, labels, keys, inferred, shared = prepare_victims(
        observations, merged, cfg, key, target_fn)
    t0 = time.perf_counter()
    out = invert_victims(first.apply_fn, cfg, params, targets, labels, keys, batch_size=bs,
                         input_shape=tuple(first.input_shape), num_classes=first.num_classes,
                         shared_params=shared, victims_per_call=merged.get("victims_per_call"),
                         shard_victims=merged.get("shard_victims", False))
    seconds = time.perf_counter() - t0
    return [Reconstruction(jnp.asarray(out["x"][i]), jnp.asarray(out["labels"][i]),
                           jnp.asarray(out["loss"][i]),
                           {"restart_losses": out["restart_losses"][i], "labels_inferred": inferred,
                            "seconds_all_victims": seconds,
                            "victims_per_call": out["victims_per_call"],
                            "victim_devices": out["devices"]})
            for i in range(len(observations))]
