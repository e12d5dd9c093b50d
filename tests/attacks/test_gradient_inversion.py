"""The gradient-matching core: vmap == loop, config errors, observation hygiene."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from attacks import ATTACK_REGISTRY, run_attack
from attacks import gradient_inversion as GI
from attacks import inverting_gradients as IG
from attacks.api import observation_from_gradient
from attacks.labels import observed_gradient
from fedsim.client import masked_mean_loss
from fedsim.models import build_model, init_params, make_apply_fn
from fedsim.observer import restrict

SHAPE = (16, 16, 1)


@pytest.fixture(scope="module")
def mlp():
    m = build_model("mlp")
    return make_apply_fn(m), init_params(m, SHAPE, jax.random.key(0))


def _obs(f, p, seed, b=1, **kw):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.random((b, *SHAPE)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, b), jnp.int32)
    g = jax.grad(masked_mean_loss, argnums=1)(f, p, x, y, jnp.ones(b))
    return observation_from_gradient(g, p, f, input_shape=SHAPE, num_classes=10, lr=0.1, **kw), x, y


def test_registry_has_dlg_and_ig():
    assert {"dlg", "inverting_gradients"} <= set(ATTACK_REGISTRY)


@pytest.mark.parametrize("signed,atol", [(False, 1e-5), pytest.param(True, 1e-3, marks=pytest.mark.slow)])
def test_vmap_over_victims_equals_one_by_one(mlp, signed, atol):
    # Signed Adam turns float reassociation noise in a near-zero gradient
    # entry into a full ±lr step, so the signed variant gets a wider tolerance.
    f, p = mlp
    cfg = GI.InversionConfig(iterations=25, restarts=2, signed=signed)
    obs = [_obs(f, p, s)[0] for s in range(3)]
    stack = lambda ts: jax.tree_util.tree_map(lambda *a: jnp.stack(a), *ts)
    params = stack([o.params for o in obs])
    targets = stack([observed_gradient(o) for o in obs])
    labels = jnp.zeros((3, 1), jnp.int32)
    keys = jax.random.split(jax.random.key(5), 3)
    kw = dict(batch_size=1, input_shape=SHAPE, num_classes=10)
    together = GI.invert_victims(f, cfg, params, targets, labels, keys, **kw)
    shared = GI.invert_victims(f, cfg, p, targets, labels, keys, shared_params=True, **kw)
    np.testing.assert_allclose(shared["x"], together["x"], atol=atol)
    for i in range(3):
        sl = lambda t: jax.tree_util.tree_map(lambda a: a[i:i + 1], t)
        alone = GI.invert_victims(f, cfg, sl(params), sl(targets), labels[i:i + 1], keys[i:i + 1], **kw)
        np.testing.assert_allclose(alone["x"][0], together["x"][i], atol=atol)
        # The cosine loss is 1 − cos in float32: whatever its size, its absolute
        # resolution is ulp(1.0) = 1.19e-7 (measured: one victim alone and in a
        # vmapped batch differed by exactly that on an AMD EPYC CPU), so the
        # loss is compared to a few ulp(1.0), not to a fraction of itself.
        np.testing.assert_allclose(alone["restart_losses"][0], together["restart_losses"][i],
                                   rtol=1e-4, atol=max(atol * 1e-3, 4 * np.finfo(np.float32).eps))


def test_victims_are_traced_as_vmapped_instances():
    """The vmapped attack loop traces fedsim's Conv inside models.vmapped_instances():
    no HLO convolution at a dummy batch above IM2COL_MAX_BATCH on CPU, as many as the
    model has convolutions (and their gradients) with the hint switched off."""
    from fedsim import models
    if jax.default_backend() != "cpu":
        pytest.skip("the im2col path is CPU-only")
    b = models.IM2COL_MAX_BATCH + 4
    m = build_model("lenet")
    params = init_params(m, (32, 32, 3), jax.random.key(0))
    cfg = GI.InversionConfig(iterations=2)
    stack = lambda t: jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), t)
    args = (stack(params), stack(params), jnp.zeros((2, b), jnp.int32),
            jax.random.split(jax.random.key(1), 2))
    counts = []
    for limit in (models.VMAPPED_IM2COL_MAX_BATCH, 0):
        with models.vmapped_im2col_max_batch(limit):
            f = make_apply_fn(m)  # fresh: the loop is cached by apply_fn, traced once
            fn = GI._compiled(f, cfg, b, (32, 32, 3), 10)
            counts.append(fn.lower(*args).as_text().count("stablehlo.convolution"))
    assert counts[0] == 0 and counts[1] > 0


def test_best_restart_is_lowest_loss(mlp):
    f, p = mlp
    obs, _, _ = _obs(f, p, 0, batch_size=1)
    rec = run_attack("inverting_gradients", obs, {"iterations": 20, "restarts": 3}, jax.random.key(0))
    assert float(rec.loss) == pytest.approx(float(np.min(rec.extras["restart_losses"])))


def test_same_key_same_result_different_key_different(mlp):
    f, p = mlp
    obs, _, _ = _obs(f, p, 1, batch_size=1)
    cfg = {"iterations": 10}
    a = run_attack("inverting_gradients", obs, cfg, jax.random.key(0))
    b = run_attack("inverting_gradients", obs, cfg, jax.random.key(0))
    c = run_attack("inverting_gradients", obs, cfg, jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(a.x), np.asarray(b.x))
    assert not np.allclose(np.asarray(a.x), np.asarray(c.x))


def test_ig_improves_loss_quickly(mlp):
    f, p = mlp
    obs, x, _ = _obs(f, p, 2, batch_size=1)
    short = run_attack("inverting_gradients", obs, {"iterations": 2}, jax.random.key(0))
    longer = run_attack("inverting_gradients", obs, {"iterations": 150}, jax.random.key(0))
    assert float(longer.loss) < 0.5 * float(short.loss)
    err = lambda r: float(jnp.mean((r.x - x) ** 2))
    assert err(longer) < err(short)


def test_unknown_config_key_and_bad_value(mlp):
    f, p = mlp
    obs, _, _ = _obs(f, p, 0, batch_size=1)
    with pytest.raises(GI.AttackConfigError, match="iteratons"):
        run_attack("dlg", obs, {"iteratons": 3}, jax.random.key(0))
    with pytest.raises(GI.AttackConfigError, match="attack.config.loss"):
        run_attack("dlg", obs, {"loss": "l3"}, jax.random.key(0))
    with pytest.raises(GI.AttackConfigError, match="attack.config.iterations"):
        run_attack("dlg", obs, {"iterations": 0}, jax.random.key(0))


def test_hygiene_labels_only_when_granted(mlp):
    f, p = mlp
    full, _, y = _obs(f, p, 3, b=1, batch_size=1)
    wrong = (y + 1) % 10
    full = full._replace(labels=wrong, algorithm="fedsgd")
    # Granted: the attack uses the (deliberately wrong) granted labels.
    granted = restrict(full, {"labels": True, "batch_size": True, "num_examples": True})
    rec = run_attack("inverting_gradients", granted, {"iterations": 2}, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(rec.labels), np.asarray(wrong))
    assert rec.extras["labels_inferred"] is False
    # Not granted: the labels field is gone, so the attack must infer (and iDLG finds the truth).
    hidden = restrict(full, {"batch_size": True})
    assert hidden.labels is None and hidden.num_examples is None
    rec = run_attack("inverting_gradients", hidden, {"iterations": 2}, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(rec.labels), np.asarray(y))
    assert rec.extras["labels_inferred"] is True


@pytest.mark.parametrize("attack", ["dlg", "inverting_gradients", "sgi"])
def test_given_labels_that_the_threat_model_does_not_grant_are_refused(mlp, attack):
    f, p = mlp
    full, _, y = _obs(f, p, 3, b=1, batch_size=1)
    full = full._replace(labels=y, algorithm="fedsgd")
    hidden = restrict(full, {"batch_size": True})
    config = {"iterations": 2, "label_mode": "given"}
    # Before any victim is observed (fedsim attack checks first) ...
    with pytest.raises(GI.AttackConfigError, match="does not grant: grant 'labels'"):
        ATTACK_REGISTRY[attack].check_config(config, {"batch_size": True}, "fedsgd")
    # ... and at the attack, where it used to infer them silently.
    with pytest.raises(GI.AttackConfigError, match="label_mode=given"):
        run_attack(attack, hidden, config, jax.random.key(0))
    ATTACK_REGISTRY[attack].check_config(config, {"batch_size": True, "labels": True}, "fedsgd")
    granted = restrict(full, {"batch_size": True, "labels": True})
    rec = run_attack(attack, granted, config, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(rec.labels), np.asarray(y))


def test_hygiene_unknown_batch_size_is_a_clear_error(mlp):
    f, p = mlp
    full, _, _ = _obs(f, p, 4, batch_size=1)
    bare = restrict(full._replace(algorithm="fedavg", local_steps=3), {})
    with pytest.raises(GI.AttackConfigError, match="batch size is unknown"):
        run_attack("inverting_gradients", bare, {"iterations": 2}, jax.random.key(0))
    # The attacker may assume a batch size instead.
    rec = run_attack("inverting_gradients", bare, {"iterations": 2, "batch_size": 1}, jax.random.key(0))
    assert rec.x.shape == (1, *SHAPE)


@pytest.mark.parametrize("change,match", [
    # Before: 0 failed in a modulo, −1 in np.repeat, and 2.5 was attacked as 2.
    # (A FedSGD observation's B is its num_examples, which observation_from_gradient
    # sets to the batch size.)
    ({"batch_size": 0, "num_examples": 0},
     r"the observation's num_examples must be an integer >= 1 .*got 0"),
    ({"batch_size": -1, "num_examples": -1}, r"the observation's num_examples must be an integer"),
    ({"batch_size": 2.5, "num_examples": 2.5}, r"num_examples must be an integer >= 1 .*got 2.5"),
    ({"algorithm": "fedavg", "batch_size": 0, "num_examples": None},
     r"the observation's batch_size must be an integer >= 1 .*got 0"),
    # Before: the batch axis in input_shape was attacked as part of the image.
    ({"input_shape": (1, 16, 16, 1)}, r"input_shape must be one image's \(H, W, C\), e.g. "
                                      r"\(28, 28, 1\), without the batch axis; got \(1, 16"),
    ({"input_shape": (28, 28, 1)}, r"input_shape \(28, 28, 1\) \(one example, no batch axis"),
    ({"input_shape": ()}, r"input_shape must be one image's \(H, W, C\)"),
    # Before: a mul of (1, 15) by (1, 10) deep in the label inference.
    ({"num_classes": 15}, r"the observation's num_classes is 15, but the model gives 10 logits"),
    # Before: a NaN loss, blamed on the learning rate.
    ({"labels": jnp.asarray([12], jnp.int32)}, r"granted labels must be classes in \[0, 10\); "
                                               r"got \[12\]"),
])
def test_an_observation_the_model_cannot_take_is_refused_by_name(mlp, change, match):
    f, p = mlp
    obs, _, _ = _obs(f, p, 4, batch_size=1)
    with pytest.raises(GI.AttackConfigError, match=match):
        run_attack("inverting_gradients", obs._replace(**change), {"iterations": 2},
                   jax.random.key(0))


def test_total_variation_of_a_one_pixel_high_image_is_finite():
    x = jnp.arange(12.0).reshape(1, 1, 4, 3)
    assert float(GI.total_variation(x)) == pytest.approx(3.0)  # |Δ| of 3 along W, none along H
    assert float(GI.total_variation(x.reshape(1, 4, 1, 3))) == pytest.approx(3.0)
    y = jnp.asarray(np.random.default_rng(0).random((2, 5, 6, 1)), jnp.float32)
    want = (np.mean(np.abs(np.diff(np.asarray(y), axis=1)))
            + np.mean(np.abs(np.diff(np.asarray(y), axis=2))))
    assert float(GI.total_variation(y)) == pytest.approx(want, rel=1e-6)


@pytest.mark.slow
def test_dlg_joint_labels_runs(mlp):
    f, p = mlp
    obs, _, _ = _obs(f, p, 5, batch_size=1)
    rec = run_attack("dlg", obs, {"iterations": 5, "label_mode": "joint"}, jax.random.key(0))
    assert rec.labels.shape == (1,) and np.isfinite(float(rec.loss))


def test_sgi_masked_loss_ignores_pruned_coordinates(mlp):
    f, p = mlp
    obs, x, _ = _obs(f, p, 6, batch_size=1)
    # Prune half of the first layer: SGI must still drive its masked loss to ~0
    # at the true input, where the plain cosine loss is not 0.
    mask = jax.random.bernoulli(jax.random.key(3), 0.5, obs.update["Dense_0"]["kernel"].shape)
    upd = {**obs.update, "Dense_0": {"kernel": obs.update["Dense_0"]["kernel"] * mask}}
    pruned = obs._replace(update=upd)
    target = observed_gradient(pruned)
    y = jnp.asarray(np.asarray(run_attack("sgi", pruned, {"iterations": 1}, jax.random.key(0)).labels))
    onehot = jax.nn.one_hot(y, 10)
    for masked, expect_zero in ((True, True), (False, False)):
        cfg = GI.InversionConfig(masked=masked)
        sim = GI.make_simulate(f, cfg)(p, x, onehot)
        if masked:
            sim = jax.tree_util.tree_map(jnp.multiply, sim, GI.support_mask(target))
        loss = float(GI.matching_loss(sim, target, "cosine"))
        assert (loss < 1e-5) == expect_zero, (masked, loss)


def _five_victims(mlp):
    f, p = mlp
    obs = [_obs(f, p, s)[0] for s in range(5)]
    stack = lambda ts: jax.tree_util.tree_map(lambda *a: jnp.stack(a), *ts)
    args = (stack([o.params for o in obs]), stack([observed_gradient(o) for o in obs]),
            jnp.zeros((5, 1), jnp.int32), jax.random.split(jax.random.key(5), 5))
    return f, args, dict(batch_size=1, input_shape=SHAPE, num_classes=10)


def test_victims_that_do_not_fit_at_once_are_attacked_in_calls_that_do(mlp, monkeypatch):
    f, (params, targets, labels, keys), kw = _five_victims(mlp)
    # Unsigned steps, as in test_vmap_over_victims_equals_one_by_one: signed Adam
    # turns float reassociation noise into full ±lr steps.
    cfg = GI.InversionConfig(iterations=25, restarts=2, signed=False)
    together = GI.invert_victims(f, cfg, params, targets, labels, keys, **kw)
    assert together["victims_per_call"] == 5
    fn = GI._compiled(f, cfg, 1, SHAPE, 10, False)
    first = lambda t: jax.tree_util.tree_map(lambda a: a[:1], t)
    one = GI._planned(fn, first(params), first(targets), labels[:1], keys[:1])
    five = GI._planned(fn, params, targets, labels, keys)
    per = (five - one) / 4
    # Free memory whose 80 % holds the fixed part and 2.5 victims, with the measured
    # margin on XLA's plan: calls of 2, 2, 1 (+1 pad).
    free = int(((one - per) + 2.5 * per) * GI.PLAN_MARGIN / GI.memory.HEADROOM)
    monkeypatch.setattr(GI.memory, "available_bytes", lambda: free)
    # The split follows the free memory, so it is announced with the pin that fixes it.
    with pytest.warns(RuntimeWarning, match="attack.config.victims_per_call: 2"):
        apart = GI.invert_victims(f, cfg, params, targets, labels, keys, **kw)
    assert apart["victims_per_call"] == 2
    np.testing.assert_allclose(apart["x"], together["x"], atol=1e-5)
    np.testing.assert_array_equal(apart["labels"], together["labels"])
    np.testing.assert_allclose(apart["restart_losses"], together["restart_losses"],
                               rtol=1e-4, atol=4 * np.finfo(np.float32).eps)
    monkeypatch.setattr(GI.memory, "available_bytes", lambda: int(1.5 * one))  # < 2.1 × one
    with pytest.raises(GI.AttackMemoryError, match="the attack on one victim plans"):
        GI.invert_victims(f, cfg, params, targets, labels, keys, **kw)
    monkeypatch.setenv("FEDSIM_MEMORY_CHECK", "0")  # off: one call, as asked
    assert GI.invert_victims(f, cfg, params, targets, labels, keys, **kw)["victims_per_call"] == 5


def test_the_attacks_plan_is_the_executable_it_runs(mlp, caplog):
    import logging
    f, (params, targets, labels, keys), kw = _five_victims(mlp)
    cfg = GI.InversionConfig(iterations=7, restarts=1)  # a program no other test compiled
    fn = GI._compiled(f, cfg, 1, SHAPE, 10, False)
    GI._planned(fn, params, targets, labels, keys)
    caplog.set_level(logging.WARNING)
    with jax.log_compiles(True):
        GI.invert_victims(f, cfg, params, targets, labels, keys, **kw)
    compiled = [r.getMessage() for r in caplog.records if "XLA compilation" in r.getMessage()]
    assert not [m for m in compiled if "traced" in m], compiled


def test_a_pinned_split_gives_the_same_numbers_whatever_the_free_memory(mlp, monkeypatch):
    import warnings
    f, (params, targets, labels, keys), kw = _five_victims(mlp)
    # Signed Adam: where a split's rounding would show, a pinned split must not vary.
    cfg = GI.InversionConfig(iterations=25, restarts=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pinned split is asked for: no warning
        ample = GI.invert_victims(f, cfg, params, targets, labels, keys, victims_per_call=2, **kw)
        fn = GI._compiled(f, cfg, 1, SHAPE, 10, False)
        two = GI._planned(fn, *(jax.tree_util.tree_map(lambda a: a[:2], t)
                                for t in (params, targets, labels, keys)))
        # Just enough for calls of 2 (with the margin), less than all 5 need.
        monkeypatch.setattr(GI.memory, "available_bytes",
                            lambda: int(1.01 * two * GI.PLAN_MARGIN / GI.memory.HEADROOM))
        tight = GI.invert_victims(f, cfg, params, targets, labels, keys, victims_per_call=2, **kw)
    assert ample["victims_per_call"] == tight["victims_per_call"] == 2
    for name in ("x", "labels", "restart_losses"):
        np.testing.assert_array_equal(tight[name], ample[name])
    monkeypatch.setattr(GI.memory, "available_bytes", lambda: int(1.5 * two))
    with pytest.raises(GI.AttackMemoryError, match="attack.config.victims_per_call: a call of 2 victims"):
        GI.invert_victims(f, cfg, params, targets, labels, keys, victims_per_call=2, **kw)
    # More than V is V: one call.
    monkeypatch.setenv("FEDSIM_MEMORY_CHECK", "0")
    assert GI.invert_victims(f, cfg, params, targets, labels, keys, victims_per_call=9,
                             **kw)["victims_per_call"] == 5


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4", True])
def test_victims_per_call_must_be_a_positive_integer(mlp, bad):
    f, p = mlp
    obs = _obs(f, p, 0)[0]
    with pytest.raises(GI.AttackConfigError, match="attack.config.victims_per_call"):
        run_attack("inverting_gradients", obs, {"iterations": 1, "victims_per_call": bad},
                   jax.random.key(0))
    f5, (params, targets, labels, keys), kw = _five_victims(mlp)
    with pytest.raises(GI.AttackConfigError, match="attack.config.victims_per_call"):
        GI.invert_victims(f5, GI.InversionConfig(iterations=1), params, targets, labels, keys,
                          victims_per_call=bad, **kw)


def test_the_attack_config_pins_victims_per_call(mlp):
    f, p = mlp
    obs = [_obs(f, p, s, batch_size=1)[0] for s in range(3)]
    recs = IG.run_many(obs, {"iterations": 2, "victims_per_call": 2}, jax.random.key(0))
    assert [r.extras["victims_per_call"] for r in recs] == [2, 2, 2]


def test_lbfgs_in_the_box_steps_from_the_clipped_point(mlp):
    """Projected L-BFGS: after clipping to [0, 1], the next step must use the value
    and gradient at the clipped point (optax's cached ones belong to the unclipped
    point, up to 74 % off). Reference: the plain projected loop, written out."""
    f, p = mlp
    obs, _, y = _obs(f, p, 3)
    target = observed_gradient(obs)
    cfg = GI.InversionConfig(optimizer="lbfgs", iterations=6, restarts=1, box=True, tv=0.0,
                             label_mode="given", signed=False, decay=False)
    x_all, _, _ = GI.make_inverter(f, cfg, 1, SHAPE, 10)(p, target, y, jax.random.key(4))

    fn = functools.partial(GI.make_objective(GI.make_simulate(f, cfg), cfg, 10),
                           params=p, target=target, labels=y)
    z = GI.initial_dummy(jax.random.split(jax.random.key(4), 1)[0], cfg, 1, SHAPE, 10)
    opt = optax.lbfgs()
    state = opt.init(z)
    for _ in range(cfg.iterations):
        value, g = jax.value_and_grad(fn)(z)
        upd, state = opt.update(g, state, z, value=value, grad=g, value_fn=fn)
        z = optax.apply_updates(z, upd)
        z = {**z, "x": jnp.clip(z["x"], 0.0, 1.0)}
    np.testing.assert_allclose(x_all[0], z["x"], atol=1e-5)


@pytest.mark.parametrize("init", ["uniform", "normal"])
def test_the_initial_dummy_is_float32_and_the_same_under_x64(init):
    # A draw without a dtype follows the default float: under jax_enable_x64 the
    # attack would start from other (float64) dummies, with the same seed.
    cfg = GI.InversionConfig(init=init)
    plain = GI.initial_dummy(jax.random.key(3), cfg, 2, (4, 4, 1), 10)
    with jax.enable_x64(True):
        wide = GI.initial_dummy(jax.random.key(3), cfg, 2, (4, 4, 1), 10)
    for name in ("x", "y"):
        assert plain[name].dtype == wide[name].dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(wide[name]), np.asarray(plain[name]))


def test_the_objective_and_label_impacts_stay_float32_under_x64():
    # jax.nn.one_hot without a dtype is float64 under jax_enable_x64: label
    # inference's signals came out float64 (this fails on the commit before). The
    # attack's objective, whose one-hot targets name their dtype too, is held to
    # the same.
    from attacks.labels import _impacts

    model = build_model("mlp", 10)
    apply_fn = make_apply_fn(model)
    params = init_params(model, (4, 4, 1), jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (2, 4, 4, 1), jnp.float32)
    labels = jnp.array([1, 3])
    cfg = GI.InversionConfig(label_mode="given")
    objective = GI.make_objective(GI.make_simulate(apply_fn, cfg), cfg, 10)
    target = jax.grad(lambda p: masked_mean_loss(apply_fn, p, x, labels, jnp.ones((2,))))(params)
    z = {"x": x * 0.5, "y": jnp.zeros((2, 10), jnp.float32)}
    plain = objective(z, params, target, labels)
    impacts = _impacts(apply_fn, params, (4, 4, 1), 10, jax.random.key(2), 4, None)
    with jax.enable_x64(True):
        wide = objective(z, params, target, labels)
        wide_impacts = _impacts(apply_fn, params, (4, 4, 1), 10, jax.random.key(2), 4, None)
    assert plain.dtype == wide.dtype == jnp.float32
    assert float(wide) == float(plain)
    for a, b in zip(impacts, wide_impacts):
        assert a.dtype == b.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


@pytest.mark.parametrize("attack,config", [("dlg", {"iterations": 10}),
                                           ("inverting_gradients", {"iterations": 20})])
def test_the_attack_gives_the_same_reconstruction_under_x64(mlp, attack, config):
    # optax's L-BFGS (DLG) and Adam (Inverting Gradients) computed their line
    # search and bias correction in float64 under jax_enable_x64: the same
    # attack and key gave another reconstruction (fedsim.x64).
    f, p = mlp
    obs, _, _ = _obs(f, p, 0, batch_size=1)
    plain = run_attack(attack, obs, config, jax.random.key(1))
    with jax.enable_x64(True):
        wide = run_attack(attack, obs, config, jax.random.key(1))
    assert wide.x.dtype == plain.x.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(wide.x), np.asarray(plain.x))
    assert float(wide.loss) == float(plain.loss)


@pytest.mark.parametrize("attack", ["dlg", "inverting_gradients"])
def test_a_float64_victim_is_attacked_in_float64(attack):
    # training.dtype: float64 uploads float64 gradients. The attack ran a
    # float32 dummy against them: DLG's L-BFGS raised (its line search's
    # branches differed in type; fails on the commit before), and Inverting
    # Gradients mixed the two. Now the dummy is cast: float64 throughout.
    shape = (8, 8, 1)
    m = build_model("mlp")
    f = make_apply_fn(m)
    with jax.enable_x64(True):
        p = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), init_params(m, shape, jax.random.key(0)))
        x = jnp.asarray(np.random.default_rng(0).random((1, *shape)), jnp.float64)
        y = jnp.asarray([3], jnp.int32)
        g = jax.grad(masked_mean_loss, argnums=1)(f, p, x, y, jnp.ones(1))
        obs = observation_from_gradient(g, p, f, input_shape=shape, num_classes=10, lr=0.1,
                                        labels=y, batch_size=1)
        rec = run_attack(attack, obs, {"iterations": 30}, jax.random.key(1))
        # The attack's start: run_inversion's victim key, then the one restart's.
        victim_key = jax.random.split(jax.random.fold_in(jax.random.key(1), 2), 1)[0]
        start = GI.initial_dummy(jax.random.split(victim_key, 1)[0], GI.InversionConfig(), 1,
                                 shape, 10)
    assert rec.x.dtype == rec.loss.dtype == jnp.float64
    assert np.isfinite(float(rec.loss))
    # It moved from its start towards the victim.
    x, got, start = np.asarray(x), np.asarray(rec.x), np.asarray(start["x"])
    assert np.mean((got - x) ** 2) < 0.5 * np.mean((start - x) ** 2)


def test_victim_keys_take_one_key_or_one_per_victim():
    k = jax.random.key(3)
    data = jax.random.key_data
    # One key: victim i's stream is the i-th of the call's split (as before).
    np.testing.assert_array_equal(data(GI.victim_keys(k, 2, 3)),
                                  data(jax.random.split(jax.random.fold_in(k, 2), 3)))
    # One per victim (list or key array): victim i gets what it gets alone with key[i].
    keys = [jax.random.fold_in(k, 5), jax.random.fold_in(k, 1)]
    for given in (keys, jnp.stack(keys)):
        got = GI.victim_keys(given, 2, 2)
        for i in range(2):
            np.testing.assert_array_equal(data(got[i]), data(GI.victim_keys(keys[i], 2, 1)[0]))
    with pytest.raises(GI.AttackConfigError, match="2 keys given for 3 victims"):
        GI.victim_keys(keys, 1, 3)
