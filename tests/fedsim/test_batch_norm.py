"""Batch norm (fedsim.models.BatchNorm, the registry's convnet_bn) in the engine.

Its running statistics are parameters no gradient reaches: local training
writes them, the server averages them with the updates and applies their mean
without its optimizer, and evaluation reads them.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from defenses.soteria import jacobian_row_norms, representation, soteria, soteria_gradient
from fedsim.client import LocalTraining, make_client_update
from fedsim.config import ConfigError
from fedsim.hooks import DefenseContext
from fedsim.models import (MODEL_REGISTRY, BatchNorm, ConvNet, batch_norm_updates,
                           build_model, has_batch_norm, init_params, make_apply_fn,
                           make_eval_fn, make_train_fn, running_stats_mask)
from fedsim.simulation import Simulation
from fedsim.typing import CohortData

from .helpers import ENGINE_UNROLL, small_config, small_dataset

SHAPE = (16, 16, 1)
#: convnet_bn at width 4 (8 to 16 channels): the engine's paths at a tenth of the compile time.
TINY = "convnet_bn_width4"


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(MODEL_REGISTRY, TINY,
                        lambda num_classes=10: ConvNet(num_classes, width=4, batch_norm=True))
    return TINY


def _bn_only(x, mask=None, train=True, momentum=0.1):
    layer = BatchNorm(momentum=momentum)
    params = layer.init(jax.random.key(0), x)["params"]
    params = {**params, "running_mean": jnp.arange(3.0), "running_var": jnp.full(3, 2.0)}
    out, written = layer.apply({"params": params}, x, train, mask,
                               mutable=["running_stats_update"])
    return params, out, written["running_stats_update"] if written else {}


def test_training_normalises_by_the_real_examples_and_writes_torchs_running_update():
    x = jax.random.normal(jax.random.key(1), (6, 4, 4, 3)) * 3.0 + 1.0
    mask = jnp.array([1.0, 1, 1, 1, 0, 0])
    params, out, written = _bn_only(x, mask)
    real = np.asarray(x[:4]).reshape(-1, 3)
    mean, var = real.mean(0), real.var(0)  # biased for normalising, as torch
    np.testing.assert_allclose(out[:4], (np.asarray(x[:4]) - mean) / np.sqrt(var + 1e-5),
                               rtol=1e-4, atol=1e-5)
    unbiased = real.var(0, ddof=1)
    np.testing.assert_allclose(written["running_mean"][0], 0.9 * np.arange(3.0) + 0.1 * mean,
                               rtol=1e-5)
    np.testing.assert_allclose(written["running_var"][0], 0.9 * 2.0 + 0.1 * unbiased, rtol=1e-5)
    # Padding rows move nothing: the same as the four real rows alone.
    _, out4, written4 = _bn_only(x[:4])
    np.testing.assert_allclose(out[:4], out4, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(written, written4, rtol=1e-6)


def test_evaluation_reads_the_running_statistics_and_a_negative_variance_as_zero():
    x = jax.random.normal(jax.random.key(1), (5, 2, 2, 3))
    params, out, written = _bn_only(x, train=False)
    assert written == {}
    np.testing.assert_allclose(out, (x - jnp.arange(3.0)) / jnp.sqrt(2.0 + 1e-5), rtol=1e-5)
    layer = BatchNorm()
    noisy = {**params, "running_var": jnp.array([-0.5, 1.0, 1.0])}  # upload noise did it
    out = layer.apply({"params": noisy}, x, False)
    assert bool(jnp.all(jnp.isfinite(out)))
    np.testing.assert_allclose(out[..., 0], (x[..., 0] - 0.0) / jnp.sqrt(1e-5), rtol=1e-4)


def test_no_gradient_reaches_the_running_statistics_in_either_mode():
    model = ConvNet(width=4, batch_norm=True)
    params = init_params(model, SHAPE, jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (4, *SHAPE))
    stats = running_stats_mask(params)
    assert has_batch_norm(params) and not has_batch_norm(jax.eval_shape(
        lambda: init_params(ConvNet(width=4), SHAPE, jax.random.key(0))))
    assert has_batch_norm(jax.eval_shape(lambda: init_params(build_model("convnet_bn"), SHAPE,
                                                             jax.random.key(0))))
    for fn in (make_apply_fn(model), make_eval_fn(model)):
        g = jax.jit(jax.grad(lambda p: jnp.sum(fn(p, x) ** 2)))(params)
        for is_stat, leaf in zip(jax.tree_util.tree_leaves(stats), jax.tree_util.tree_leaves(g)):
            assert bool(jnp.all(leaf == 0)) == is_stat
    # Training mode is the model the clients train and the attacks see; evaluation differs.
    assert not np.allclose(jax.jit(make_apply_fn(model))(params, x),
                           jax.jit(make_eval_fn(model))(params, x))


def test_batch_norm_updates_replace_exactly_the_written_statistics():
    model = ConvNet(width=4, batch_norm=True)
    params = init_params(model, SHAPE, jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (4, *SHAPE))
    _, written = make_train_fn(model)(params, x, jnp.ones(4))
    new = batch_norm_updates(params, written)
    for is_stat, a, b in zip(jax.tree_util.tree_leaves(running_stats_mask(params)),
                             jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(new)):
        assert bool(jnp.all(a == b)) != is_stat
    with pytest.raises(ValueError, match="BatchNorm_9/running_mean is not a parameter"):
        batch_norm_updates(params, {"BatchNorm_9": {"running_mean": (jnp.zeros(3),)}})


def _data(x, y, n_max):
    n, pad = len(y), n_max - len(y)
    return CohortData(jnp.concatenate([x, jnp.zeros((pad, *x.shape[1:]))]),
                      jnp.concatenate([y, jnp.zeros(pad, jnp.int32)]),
                      jnp.concatenate([jnp.ones(n), jnp.zeros(pad)]), jnp.int32(n))


def _padded_and_unpadded_updates(defenses=None, client_state=None):
    """One client's 13 examples as a client of n_max 13 and of n_max 20 (batch 5)."""
    model = ConvNet(width=4, batch_norm=True)
    params = init_params(model, SHAPE, jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (13, *SHAPE))
    y = jnp.arange(13, dtype=jnp.int32) % 10
    outs = []
    for n_max in (13, 20):
        update = make_client_update(make_apply_fn(model), optax.sgd(0.05),
                                    LocalTraining("fedavg", 1, 5, n_max), defenses or {},
                                    batch_norm_train_fn=make_train_fn(model))
        outs.append(jax.jit(update)(params, _data(x, y, n_max), client_state or {},
                                    jax.random.key(2)))
    return outs


def test_a_padded_client_gives_the_same_update_statistics_included():
    outs = _padded_and_unpadded_updates()
    chex.assert_trees_all_close(outs[0].update, outs[1].update, rtol=1e-5, atol=1e-6)
    moved = outs[0].update["BatchNorm_0"]["running_mean"]
    assert float(jnp.abs(moved).max()) > 0  # Δ carries the statistics


def test_strategies_agree_with_batch_norm(tiny):
    # One local step per client (B above every client's n): over several steps, the
    # ConvNet's ReLUs and max pools turn the strategies' float rounding into discrete
    # switches, with or without batch norm, which no tolerance separates from a bug
    # (benchmarks/results/diagnose_convnet_rounding.md: start weights times 1 + 1e-7).
    ds = small_dataset()
    results = {}
    for strategy in ("loop", "vmap", "chunked"):
        # The unrolled step (the engine's default). Under small_config's scan the
        # vmapped clients' single step moves 1.5e-4 from the clients alone, about
        # as far as each float32 program is from float64 there (the model amplifies
        # rounding; benchmarks/results/diagnose_vmap_rounding.md). The float64
        # test below holds both paths to rounding.
        sim = Simulation(small_config(**{"model.name": tiny, "training.lr": 0.05,
                                         "training.batch_size": 200,
                                         "training.client_parallelism": strategy,
                                         "training.chunk_size": 2, **ENGINE_UNROLL}),
                         dataset=ds)
        state = sim.init_state()
        for r in range(2):
            state, res = sim.run_round(state, r)
        results[strategy] = (state.params, res.train_loss)
    for s in ("vmap", "chunked"):
        chex.assert_trees_all_close(results[s][0], results["loop"][0], atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(results[s][1], results["loop"][1], rtol=1e-4)


@pytest.mark.parametrize("unroll", [0, pytest.param(32, marks=pytest.mark.slow)])
def test_vmapped_clients_equal_each_client_alone_in_float64(tiny, unroll):
    # In float32 a vmap over clients of this model moves a one-step update 1.5e-4
    # from the same client alone on the scan path, about as far as each float32
    # program lands from float64 (benchmarks/results/diagnose_vmap_rounding.md): a
    # float32 tolerance loose enough for that cannot tell a batching bug from
    # rounding. In float64 the programs must agree to rounding; here at B = 16
    # (ten steps; the small clients' last batches are padding only, so the scan's
    # skip branch runs, as a select under vmap).
    sim = Simulation(small_config(**{"model.name": tiny, "training.lr": 0.05,
                                     "training.unroll_steps": unroll}), dataset=small_dataset())
    params = sim.init_state().params
    clients = [int(c) for c in sim.cohort(0)]
    _, ckey = sim.round_keys(0)
    keys = [jax.random.fold_in(ckey, c) for c in clients]
    datas = [sim.client_data(c) for c in clients]
    assert min(int(d.n) for d in datas) < 9 * 16 < sim.n_max  # a padding-only batch exists
    to64 = lambda t: jax.tree_util.tree_map(  # noqa: E731
        lambda a: a.astype(jnp.float64) if a.dtype == jnp.float32 else a, t)
    with jax.enable_x64(True):
        params, datas = to64(params), [to64(d) for d in datas]
        alone = [jax.jit(sim.client_update)(params, d, {}, k) for d, k in zip(datas, keys)]
        stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *datas)
        many = jax.jit(jax.vmap(sim.client_update, in_axes=(None, 0, None, 0)))(
            params, stacked, {}, jnp.stack(keys))
        for i, one in enumerate(alone):
            assert all(a.dtype == jnp.float64 for a in jax.tree_util.tree_leaves(one.update))
            chex.assert_trees_all_close(
                jax.tree_util.tree_map(lambda a: a[i], many.update), one.update,
                atol=1e-12, rtol=0)
            np.testing.assert_allclose(many.loss[i], one.loss, rtol=1e-6)


def test_the_global_statistics_are_the_clients_weighted_mean_whatever_the_server_optimizer(tiny):
    # Adam on the server steps the weights; the statistics take the mean as it is.
    ds = small_dataset()
    sim = Simulation(small_config(**{"model.name": tiny, "training.lr": 0.05,
                                     "training.server_optimizer": "adam",
                                     "training.server_lr": 0.01}), dataset=ds)
    state = sim.init_state()
    new, _ = sim.run_round(state, 0)
    _, ckey = sim.round_keys(0)
    outs = [jax.jit(sim.client_update)(state.params, sim.client_data(c), {},
                                       jax.random.fold_in(ckey, c)) for c in sim.cohort(0)]
    w = np.array([float(o.num_examples) for o in outs])
    mean = lambda f: sum(wi * f(o.update) for wi, o in zip(w, outs)) / w.sum()
    for layer in ("BatchNorm_0", "BatchNorm_7"):
        for stat in ("running_mean", "running_var"):
            np.testing.assert_allclose(new.params[layer][stat],
                                       state.params[layer][stat] + mean(lambda u: u[layer][stat]),
                                       rtol=1e-5, atol=1e-6)
    # The weights did go through Adam: not the plain mean.
    assert not np.allclose(new.params["Conv_0"]["kernel"],
                           state.params["Conv_0"]["kernel"]
                           + mean(lambda u: u["Conv_0"]["kernel"]), atol=1e-6)


def test_the_server_evaluates_with_the_running_statistics(tiny):
    ds = small_dataset()
    sim = Simulation(small_config(**{"model.name": tiny, "training.lr": 0.05}),
                     dataset=ds)
    state, _ = sim.run_round(sim.init_state(), 0)
    acc, loss = sim.evaluate(state.params)
    logits = make_eval_fn(sim.model)(state.params, jnp.asarray(ds.x_test))
    assert acc == pytest.approx(float(jnp.mean(jnp.argmax(logits, -1) == ds.y_test)))
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(ds.y_test))
    assert loss == pytest.approx(float(jnp.mean(ce)), rel=1e-5)


@pytest.mark.parametrize("override,match", [
    ({"pruning.scheme": "random", "pruning.p": 0.5},
     r"config key 'pruning.scheme' \(random\): model 'convnet_bn' has batch norm"),
    ({"defenses": [{"name": "dp_gaussian", "noise_multiplier": 1.0}]},
     r"config key 'defenses': defense 'dp_gaussian.*' acts at stage 'example', which a model "
     r"with batch norm does not support"),
    # Soteria's sketch runs random probes through the batch's statistics: refused
    # (its batched Jacobian, the default, is defined there: tests below).
    ({"defenses": [{"name": "soteria", "p_fc": 0.5, "jacobian": "sketch"}]},
     r"config key 'defenses': defense 'soteria.*' acts at stage 'layer'.*soteria with "
     r"jacobian 'batched'"),
    ({"defenses": [{"name": "priprune"}]},
     r"model 'convnet_bn' has batch norm, which the local training of a defense that brings "
     r"its own \(PriPrune\)"),
])
def test_what_batch_norm_cannot_take_is_refused_by_name(override, match):
    with pytest.raises(ConfigError, match=match):
        Simulation(small_config(**{"model.name": "convnet_bn", **override}),
                   dataset=small_dataset())


def test_client_level_dp_clips_and_noises_the_statistics_with_the_weights(tiny):
    # What the client sends is clipped as a whole: the statistics are in Δ.
    ds = small_dataset()
    sim = Simulation(small_config(**{
        "model.name": tiny, "training.lr": 0.05, "training.weighting": "uniform",
        "observer.clients": "[0]",
        "observer.rounds": "[0]", "defenses": [{"name": "client_level_dp", "clip_norm": 0.01,
                                                "noise_multiplier": 1e-6,
                                                "clients_per_round": 3}]}), dataset=ds)
    _, res = sim.run_round(sim.init_state(), 0)
    (upload,) = res.observed
    norm = float(optax.global_norm(upload.observation.update))
    assert norm == pytest.approx(0.01, rel=1e-3)
    assert float(jnp.abs(upload.observation.update["BatchNorm_0"]["running_var"]).max()) > 0


def _batch_norm_batch(padding=2):
    """A 4-wide convnet_bn, a batch of 4 real rows and ``padding`` padding rows,
    and its training mode under the real rows' statistics (what the engine gives
    a layer defense as ``context.apply_fn``)."""
    model = ConvNet(width=4, batch_norm=True)
    params = init_params(model, SHAPE, jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (4 + padding, *SHAPE))
    y = jnp.array([0, 3, 3, 7] + [0] * padding, jnp.int32)
    mask = jnp.array([1.0] * 4 + [0.0] * padding)
    train = make_train_fn(model)

    def loss(p):
        ce = optax.softmax_cross_entropy_with_integer_labels(train(p, x, mask)[0], y)
        return jnp.sum(ce * mask) / jnp.sum(mask)

    ctx = DefenseContext(params=params, x=x, y=y, mask=mask,
                         apply_fn=lambda p, v: train(p, v, mask)[0])
    # Jitted: op by op, the ConvNet's gradient takes several times as long to run.
    return params, ctx, jax.jit(jax.grad(loss))(params)


def _soteria_batch(grads, ctx, p_fc):
    """soteria_gradient at batch scope, jitted (the context's arrays are constants)."""
    return jax.jit(lambda g: soteria_gradient(g, ctx, p_fc, scope="batch"))(grads)


def test_soteria_under_batch_statistics_zeroes_feature_rows_of_the_batch_gradient():
    params, ctx, clean = _batch_norm_batch()
    # p_fc = 0: r and ∂l/∂b come from the real rows' statistics, so ∂l/∂b · rᵀ
    # is the batch's own kernel gradient (padding in the statistics would move it).
    same, _ = _soteria_batch(clean, ctx, 0.0)
    chex.assert_trees_all_close(same, clean, rtol=1e-5, atol=1e-7)
    # One mask for the batch: the kernel gradient is the clean one with the
    # pruned features' rows zeroed, round(p_fc · L) of them; nothing else moves.
    g, info = _soteria_batch(clean, ctx, 0.25)
    keep = np.asarray(info["keep"]).reshape(-1)
    assert keep.shape == (16,) and int((keep == 0).sum()) == 4
    np.testing.assert_allclose(g["Dense_0"]["kernel"], keep[:, None] * clean["Dense_0"]["kernel"],
                               rtol=1e-5, atol=1e-7)
    assert float(jnp.abs(clean["Dense_0"]["kernel"][keep == 0]).max()) > 0
    for path in ("Dense_0/bias", "Conv_3/kernel", "BatchNorm_2/scale"):
        a, b = path.split("/")
        np.testing.assert_array_equal(g[a][b], clean[a][b])
    # Padding rows change none of it: the scores' row norms, the mask and the
    # gradient are those of the real rows alone.
    params4, ctx4, clean4 = _batch_norm_batch(padding=0)
    g4, info4 = _soteria_batch(clean4, ctx4, 0.25)
    np.testing.assert_allclose(info["grad_norm"][:4], info4["grad_norm"], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(info["grad_norm"][4:], 0.0)
    np.testing.assert_array_equal(info["keep"], info4["keep"])
    np.testing.assert_allclose(g["Dense_0"]["kernel"], g4["Dense_0"]["kernel"], rtol=1e-5,
                               atol=1e-7)


def test_soteria_row_norms_under_batch_statistics_are_those_of_the_batch_summed_feature():
    # What the authors' code computes (one backward pass of feature i summed over
    # the batch), checked against the full Jacobian of that sum.
    params, ctx, _ = _batch_norm_batch()
    norms = jax.jit(lambda p, v: jacobian_row_norms(ctx.apply_fn, p, v, "Dense_0", 8, "batched",
                                                    example_mask=ctx.mask))(params, ctx.x)
    summed = lambda v: jnp.sum(representation(ctx.apply_fn, params, v, "Dense_0")  # noqa: E731
                               * ctx.mask[:, None], axis=0)
    jac = jax.jit(jax.jacrev(summed))(ctx.x).reshape(16, 6, -1)  # [L, B, N]
    expected = jnp.sqrt(jnp.sum(jac ** 2, -1)).T
    np.testing.assert_allclose(norms[:4], expected[:4], rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(norms[4:], 0.0)  # padding: not the batch's
    # Examples interact: one example's own Jacobian is not it.
    own = jax.jit(jax.jacrev(lambda v: representation(ctx.apply_fn, params, v, "Dense_0")[0]))(
        ctx.x)
    assert not np.allclose(norms[0], jnp.sqrt(jnp.sum(own.reshape(16, 6, -1)[:, 0] ** 2, -1)),
                           rtol=1e-3)


def test_soteria_on_a_batch_norm_model_gives_a_padded_client_the_same_update(tiny):
    outs = _padded_and_unpadded_updates({"layer": soteria(0.25, scope="batch")}, {"layer": ()})
    chex.assert_trees_all_close(outs[0].update, outs[1].update, rtol=1e-5, atol=1e-6)
    # From a config: the engine takes it on convnet_bn.
    sim = Simulation(small_config(**{"model.name": tiny, "defenses": [
        {"name": "soteria", "p_fc": 0.25, "score": "code", "scope": "batch"}]}),
        dataset=small_dataset())
    assert sim.batch_norm and sim.defenses["layer"].batch_statistics


def test_at_its_initial_statistics_evaluation_mode_is_the_model_without_batch_norm():
    # What the Soteria reproduction's --gs-batch-norm relies on: the authors attack
    # the initial model in evaluation mode, where each batch norm (mean 0, variance 1,
    # scale 1, bias 0) divides by √(1 + 1e-5) only; the convolutions and the dense
    # layer are initialised alike with or without it.
    with_bn = init_params(ConvNet(width=4, batch_norm=True), SHAPE, jax.random.key(3))
    plain = init_params(ConvNet(width=4), SHAPE, jax.random.key(3))
    assert set(plain) < set(with_bn)
    chex.assert_trees_all_equal(plain, {k: with_bn[k] for k in plain})
    x = jax.random.uniform(jax.random.key(1), (3, *SHAPE))
    np.testing.assert_allclose(make_eval_fn(ConvNet(width=4, batch_norm=True))(with_bn, x),
                               make_apply_fn(ConvNet(width=4))(plain, x), rtol=1e-4, atol=1e-6)
