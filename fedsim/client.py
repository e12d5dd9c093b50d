"""Local training of ONE client on its unbatched, padded data.

The engine decides how a cohort runs this function (vmap, lax.map or a
Python loop; see :mod:`fedsim.simulation`); nothing here knows about other
clients. Padding is handled by masks: a padded client takes exactly the same
optimizer steps as the unpadded one, because

* each epoch's example order is a sort of per-example random scores drawn with
  ``fold_in(key, example_index)``, which do not depend on the padded length,
  with padding sorted last;
* the loss is a masked mean over the real examples of the batch;
* a batch holding only padding is skipped (``lax.cond`` inside a scan, a
  select when unrolled), so it changes neither the parameters nor the
  optimizer state.

FedSGD is one full-batch step (Δ = −lr·∇L over all the client's examples);
FedAvg is E epochs of mini-batches of size B with any optax optimizer.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fedsim.config import UNROLL_STEPS
from fedsim.hooks import Defense, DefenseContext, check_stage_compatibility, identity
from fedsim.models import batch_norm_updates
from fedsim.typing import ClientOutput, CohortData, Params, PRNGKey, PyTree


@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """Static settings of local training.

    Attributes:
      algorithm: "fedavg" or "fedsgd".
      local_epochs: E (FedAvg).
      batch_size: B (FedAvg); FedSGD uses all examples.
      n_max: padded examples per client (static shape).
      unroll_steps: up to this many local steps are unrolled into straight-line
        code; more run in a ``lax.scan``. On XLA:CPU two LeNet-5 steps inside
        a ``lax.scan`` measured 2.6× slower than the same steps unrolled
        (``benchmarks/results/control_flow_cpu.md``); unrolling costs compile
        time. The config key ``training.unroll_steps`` sets it
        (``benchmarks/results/unroll_steps_cpu.md``: the round's compile time
        against its run time). XLA may round the two differently (LeNet-5's
        parameters differ in the last bits there). A defense with
        ``Defense.scan_local_steps`` (``dp_vmf``) keeps the scan whatever this is.
    """

    algorithm: str
    local_epochs: int
    batch_size: int
    n_max: int
    unroll_steps: int = UNROLL_STEPS

    @property
    def effective_batch(self) -> int:
        return self.n_max if self.algorithm == "fedsgd" else min(self.batch_size, self.n_max)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.n_max / self.effective_batch)

    @property
    def num_steps(self) -> int:
        epochs = 1 if self.algorithm == "fedsgd" else self.local_epochs
        return epochs * self.steps_per_epoch


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example softmax cross-entropy with integer labels."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def masked_mean_loss(apply_fn, params, x, y, mask):
    """Mean cross-entropy over the real (mask = 1) examples of a batch."""
    losses = cross_entropy(apply_fn(params, x), y)
    return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def epoch_order(key: PRNGKey, mask: jax.Array) -> jax.Array:
    """A random order of the real examples, padding last, independent of n_max."""
    n_max = mask.shape[0]
    # float32 scores whatever the default dtype: under jax_enable_x64 the default
    # float64 draw takes other bits from the key, so another order.
    scores = jax.vmap(lambda i: jax.random.uniform(
        jax.random.fold_in(key, i), dtype=jnp.float32))(jnp.arange(n_max))
    scores = jnp.where(mask > 0, scores, 2.0 + jnp.arange(n_max))
    return jnp.argsort(scores)


def init_client_state(defenses: dict[str, Defense], params: Params) -> PyTree:
    """The per-client defense state: a dict stage -> state."""
    return {stage: d.init(params) for stage, d in defenses.items()}


def make_client_update(
    apply_fn: Callable,
    tx: optax.GradientTransformation,
    settings: LocalTraining,
    defenses: dict[str, Defense] | None = None,
    batch_norm_train_fn: Callable | None = None,
) -> Callable[[Params, CohortData, PyTree, PRNGKey], ClientOutput]:
    """Build ``client_update(global_params, data, client_state, key)``.

    Args:
      apply_fn: ``apply_fn(params, x) -> logits``.
      tx: the client optimizer (plain SGD(lr) for FedSGD).
      settings: static local-training settings.
      defenses: at most one Defense per stage ("data", "example", "layer",
        "upload"); missing stages are no-ops. Chain several with
        :func:`fedsim.hooks.chain`.
      batch_norm_train_fn: for a model with :class:`fedsim.models.BatchNorm`,
        its ``make_train_fn``: each step's loss then normalises by the
        statistics of the batch's real examples (padding left out), and the
        running statistics it writes replace those in the parameters after
        the step, so Δ carries them. Per-example ("example") defenses are
        refused with it, since under batch statistics one example's gradient
        depends on the others in its batch, and so are "layer" defenses
        unless defined there (``Defense.batch_statistics``); those get, as
        ``context.apply_fn``, the training mode normalised by the step's real
        examples.

    Returns:
      A pure function of one client's unbatched data (``data.x`` is
      [n_max, ...]) returning a :class:`ClientOutput` whose ``update`` is
      Δ = w_local − w_global after the upload defense.
    """
    defenses = dict(defenses or {})
    for stage, d in defenses.items():
        if d.stage != stage:
            raise ValueError(f"defense {d.name!r} acts at stage {d.stage!r}, not {stage!r}")
    check_stage_compatibility(defenses)
    if batch_norm_train_fn is not None:
        for stage in ("example", "layer"):
            d = defenses.get(stage)
            if d is not None and not (stage == "layer" and d.batch_statistics):
                raise ValueError(
                    f"defense {d.name!r} acts at stage {stage!r}, which a model with batch "
                    "norm does not support: under batch statistics one example's gradient "
                    "depends on the others in its batch (use a model without batch norm, an "
                    "upload-stage defense, or a layer defense defined under batch statistics: "
                    "soteria with jacobian 'batched')")
    data_def = defenses.get("data", identity("data"))
    layer_def = defenses.get("layer", identity("layer"))
    upload_def = defenses.get("upload", identity("upload"))
    example_def = defenses.get("example")
    B = settings.effective_batch
    spe = settings.steps_per_epoch
    # A defense whose step unrolls badly (Defense.scan_local_steps) keeps the scan.
    unroll_steps = (0 if any(d.scan_local_steps for d in defenses.values())
                    else settings.unroll_steps)

    def loss_one(params, x, y):
        return cross_entropy(apply_fn(params, x[None]), y[None])[0]

    def batch_norm_loss(params, x, y, mask):
        logits, written = batch_norm_train_fn(params, x, mask)
        losses = cross_entropy(logits, y)
        return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0), written

    def gradient(params, x, y, mask, state, key, ctx):
        """(loss, gradient, example-stage state, running statistics written or None)."""
        if batch_norm_train_fn is not None:
            (loss, written), g = jax.value_and_grad(batch_norm_loss, has_aux=True)(
                params, x, y, mask)
            return loss, g, state, written
        if example_def is None:
            loss, g = jax.value_and_grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, mask)
            return loss, g, state, None
        losses, per_ex = jax.vmap(jax.value_and_grad(loss_one), in_axes=(None, 0, 0))(params, x, y)
        # Padding rows must not reach the reduction.
        per_ex = jax.tree_util.tree_map(
            lambda g: g * mask.reshape((-1,) + (1,) * (g.ndim - 1)), per_ex)
        g, state = example_def.apply(per_ex, state, key=key, context=ctx)
        loss = jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)
        return loss, g, state, None

    def client_update(global_params, data: CohortData, client_state, key) -> ClientOutput:
        client_state = dict(client_state) if client_state else {}
        k_begin, k_order, k_steps, k_upload = jax.random.split(key, 4)
        params = global_params
        if "upload" in defenses and upload_def.begin_round is not None:
            params, client_state["upload"] = upload_def.begin_round(
                global_params, client_state["upload"], key=k_begin,
                context=DefenseContext(global_params=global_params, num_examples=data.n))
        epochs = settings.num_steps // spe
        orders = jax.vmap(lambda e: epoch_order(jax.random.fold_in(k_order, e), data.mask))(
            jnp.arange(epochs))
        pad = spe * B - settings.n_max
        orders = jnp.concatenate([orders, jnp.full((epochs, pad), -1, orders.dtype)], axis=1)
        batches = orders.reshape(epochs * spe, B)

        def do_step(params, opt_state, states, s, idx):
            valid = idx >= 0
            safe = jnp.where(valid, idx, 0)
            mask = jnp.where(valid, data.mask[safe], 0.0)
            x, y = data.x[safe], data.y[safe]
            k_data, k_ex, k_layer = jax.random.split(jax.random.fold_in(k_steps, s), 3)
            st = dict(states)
            if batch_norm_train_fn is None:
                step_apply_fn = apply_fn
            else:  # training mode under the statistics of this batch's real examples
                def step_apply_fn(p, v):
                    return batch_norm_train_fn(p, v, mask)[0]
            ctx = DefenseContext(params=params, x=x, y=y, mask=mask, apply_fn=step_apply_fn,
                                 global_params=global_params, step=s, num_examples=data.n)
            xd = x
            if "data" in defenses:
                xd, st["data"] = data_def.apply(x, st["data"], key=k_data, context=ctx)
                ctx = ctx._replace(x=xd)
            loss, g, st_ex, written = gradient(params, xd, y, mask, st.get("example"), k_ex, ctx)
            if example_def is not None:
                st["example"] = st_ex
            if "layer" in defenses:
                g, st["layer"] = layer_def.apply(g, st["layer"], key=k_layer, context=ctx)
            updates, new_opt = tx.update(g, opt_state, params)
            has_data = jnp.any(valid & (mask > 0))
            new_params = optax.apply_updates(params, updates)
            if written is not None:  # no gradient reaches them: training writes them
                new_params = batch_norm_updates(new_params, written)
            return (new_params, new_opt, st), loss, has_data

        def scan_step(carry, inputs):
            params, opt_state, states = carry
            s, idx = inputs
            has_data = jnp.any((idx >= 0) & (data.mask[jnp.maximum(idx, 0)] > 0))

            def run(_):
                new, loss, _ = do_step(params, opt_state, states, s, idx)
                # The reported loss is float32 whatever the parameters' dtype, so
                # both branches agree (float64 parameters under jax_enable_x64).
                return new, (loss.astype(jnp.float32), jnp.float32(1.0))

            def skip(_):
                # Not 0.0: a Python float is float64 under jax_enable_x64, and the
                # mean loss below would be divided in float64 there (a float32
                # run's train_loss then moved with x64 in its 8th digit).
                return (params, opt_state, states), (jnp.zeros((), jnp.float32),
                                                     jnp.float32(0.0))

            return jax.lax.cond(has_data, run, skip, None)

        opt_state = tx.init(params)
        if batches.shape[0] <= unroll_steps:
            carry = (params, opt_state, client_state)
            losses, taken = [], []
            for s in range(batches.shape[0]):
                new, loss, has_data = do_step(*carry, jnp.int32(s), batches[s])
                # Padding-only batch: keep the old carry (a select keeps the code straight-line).
                carry = jax.tree_util.tree_map(lambda n, o: jnp.where(has_data, n, o), new, carry)
                losses.append(jnp.where(has_data, loss, 0.0))
                taken.append(has_data.astype(jnp.float32))
            params, _, client_state = carry
            losses, taken = jnp.stack(losses), jnp.stack(taken)
        else:
            steps = jnp.arange(batches.shape[0])
            (params, _, client_state), (losses, taken) = jax.lax.scan(
                scan_step, (params, opt_state, client_state), (steps, batches))
        loss = jnp.sum(losses) / jnp.maximum(jnp.sum(taken), 1.0)
        delta = jax.tree_util.tree_map(lambda a, b: a - b, params, global_params)
        if "upload" in defenses:
            delta, client_state["upload"] = upload_def.apply(
                delta, client_state["upload"], key=k_upload,
                context=DefenseContext(params=params, global_params=global_params,
                                       apply_fn=apply_fn, num_examples=data.n))
        return ClientOutput(delta, client_state, loss, data.n.astype(jnp.float32))

    return client_update
