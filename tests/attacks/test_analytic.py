"""The closed-form attack on a biased fully connected input layer (attacks/analytic.py).

The batch checks compare the attack with an independent count: from the
victims' true first-layer activations, the examples that reach at least two
units no other example reaches (exclusively activated neurons, Pan et al.
2022) are exactly those whose input two units' ratios give. With peeling,
the count is the closure: an example is found once it has two units that no
example not yet found reaches.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from attacks import ATTACK_REGISTRY, run_attack
from attacks.analytic import (check_config, group_ratios, input_layer, merge_labels,
                              ratio_rounding, recover_inputs)
from attacks.api import observation_from_gradient
from attacks.gradient_inversion import AttackConfigError
from attacks.metrics import psnr
from fedsim.client import masked_mean_loss
from fedsim.models import build_model, init_params, make_apply_fn
from fedsim.typing import Observation

SHAPE = (8, 8, 1)


@pytest.fixture(scope="module")
def net():
    model = build_model("mlp_2nn")
    params = init_params(model, SHAPE, jax.random.key(0))
    return make_apply_fn(model), params


def _batch(seed, b):
    rng = np.random.default_rng(seed)
    return (rng.uniform(size=(b, *SHAPE)).astype(np.float32),
            rng.integers(0, 10, b).astype(np.int32))


def _gradient(apply_fn, params, x, y):
    return jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, jnp.asarray(x), jnp.asarray(y),
                                                 jnp.ones(len(y)))


def _fedsgd(apply_fn, params, x, y, **grants):
    g = _gradient(apply_fn, params, x, y)
    return observation_from_gradient(g, params, apply_fn, input_shape=SHAPE, num_classes=10,
                                     lr=0.1, batch_size=len(y), **grants)


def _examples_with_two_exclusive_units(params, x):
    """Independent of the attack: from the true pre-activations of the first layer."""
    layer = params["Dense_0"]
    z = np.asarray(x).reshape(len(x), -1) @ np.asarray(layer["kernel"]) + np.asarray(layer["bias"])
    active = z > 0
    exclusive = active & (active.sum(0) == 1)[None, :]
    return set(np.flatnonzero(exclusive.sum(1) >= 2))


def _examples_found_by_peeling(params, x):
    """Independent of the attack: the closure of the two-exclusive-unit count
    when the examples found so far are taken out of every unit."""
    layer = params["Dense_0"]
    z = np.asarray(x).reshape(len(x), -1) @ np.asarray(layer["kernel"]) + np.asarray(layer["bias"])
    active = z > 0
    found: set[int] = set()
    while True:
        rest = np.array([n not in found for n in range(len(x))])
        exclusive = active & rest[:, None] & ((active & rest[:, None]).sum(0) == 1)[None, :]
        new = set(np.flatnonzero(exclusive.sum(1) >= 2)) - found
        if not new:
            return found
        found |= new


def _match_exact_slots(x, rec):
    """The true example each slot marked exact is (nearest, to 1e-4), slot by slot."""
    flat = x.reshape(len(x), -1)
    rx = np.asarray(rec.x).reshape(len(x), -1)
    matched = {}
    for slot in np.flatnonzero(np.asarray(rec.extras["exact"])):
        d = np.abs(flat - rx[slot]).max(1)
        assert d.min() < 1e-4, f"slot {slot} is marked exact but matches no example ({d.min()})"
        matched[int(slot)] = int(np.argmin(d))
    assert len(set(matched.values())) == len(matched)
    return matched


def test_registered_and_one_example_is_read_off_exactly(net):
    apply_fn, params = net
    x, y = _batch(0, 1)
    rec = run_attack("analytic", _fedsgd(apply_fn, params, x, y), {}, jax.random.key(1))
    assert "analytic" in ATTACK_REGISTRY
    np.testing.assert_allclose(np.asarray(rec.x), x, rtol=0, atol=1e-5)
    assert rec.x.shape == x.shape and rec.x.dtype == jnp.float32
    assert int(rec.labels[0]) == int(y[0])  # iDLG
    assert bool(rec.extras["exact"][0]) and rec.extras["input_layer"] == "Dense_0"
    assert float(rec.loss) < 1e-6


@pytest.mark.parametrize("seed,b", [(1, 2), (2, 4), (3, 8), (4, 16)])
def test_a_batch_recovers_exactly_the_examples_with_two_exclusive_units(net, seed, b):
    """One pass (no peeling)."""
    apply_fn, params = net
    x, y = _batch(seed, b)
    rec = run_attack("analytic", _fedsgd(apply_fn, params, x, y), {"peel": False},
                     jax.random.key(1))
    exact = np.asarray(rec.extras["exact"])
    # which true example each exact slot is: the nearest
    flat, rx = x.reshape(b, -1), np.asarray(rec.x).reshape(b, -1)
    found = []
    for slot in np.flatnonzero(exact):
        d = np.abs(flat - rx[slot]).max(1)
        assert d.min() < 1e-4, f"slot {slot} is marked exact but matches no example ({d.min()})"
        found.append(int(np.argmin(d)))
    expected = _examples_with_two_exclusive_units(params, x)
    assert len(found) == len(set(found))
    assert set(found) == expected
    # the filled slots are not marked exact and not sized as groups
    assert np.all(np.asarray(rec.extras["group_sizes"])[~exact] == 0)


@pytest.mark.parametrize("seed,b", [(3, 8), (5, 8), (6, 12), (4, 16)])
def test_peeling_recovers_exactly_the_closure_with_their_labels_and_the_fedsgd_scale(
        net, seed, b):
    apply_fn, params = net
    x, y = _batch(seed, b)
    rec = run_attack("analytic", _fedsgd(apply_fn, params, x, y), {}, jax.random.key(1))
    matched = _match_exact_slots(x, rec)
    assert set(matched.values()) == _examples_found_by_peeling(params, x)
    peeled = np.asarray(rec.extras["peeled"])
    assert set(np.flatnonzero(peeled)) == set(matched)  # every group passed the fit
    for slot, n in matched.items():
        assert int(rec.extras["peel_labels"][slot]) == int(y[n]) == int(rec.labels[slot])
        # Δ = −lr·mean gradient: each example's share of the bias update is −lr/B·∂ℓ/∂b
        assert float(rec.extras["peel_scales"][slot]) == pytest.approx(-0.1 / b, rel=1e-4)
    passes = np.asarray(rec.extras["found_in_pass"])
    assert np.all(passes[~np.asarray(rec.extras["exact"])] == -1)


def test_peeling_finds_examples_one_pass_does_not(net):
    """The closure above is not the one-pass count: at B = 8 and 12 it finds
    every example where one pass finds 4, in 2 and 4 passes."""
    apply_fn, params = net
    for seed, b, passes in ((3, 8, 2), (6, 12, 4)):
        x, y = _batch(seed, b)
        assert len(_examples_with_two_exclusive_units(params, x)) == 4
        assert len(_examples_found_by_peeling(params, x)) == b
        rec = run_attack("analytic", _fedsgd(apply_fn, params, x, y), {}, jax.random.key(1))
        assert bool(np.all(rec.extras["exact"]))
        assert int(np.max(rec.extras["found_in_pass"])) + 1 == passes
        assert float(rec.loss) < 1e-5


def test_the_fitted_scale_is_each_examples_clipping_factor(net):
    """Per-example clipping (DP-SGD without noise) rescales each example's
    gradient; the fitted scale is −lr/B · min(1, C/‖g_n‖), computed here from
    the per-example gradients."""
    apply_fn, params = net
    x, y = _batch(3, 8)
    per_example = jax.vmap(lambda xi, yi: _gradient(apply_fn, params, xi[None], yi[None]))(
        jnp.asarray(x), jnp.asarray(y))
    norms = np.sqrt(sum(np.sum(np.asarray(leaf).reshape(8, -1)**2, axis=1)
                        for leaf in jax.tree_util.tree_leaves(per_example)))
    clip = float(np.median(norms))
    factors = np.minimum(1.0, clip / norms)
    mean = jax.tree_util.tree_map(
        lambda leaf: jnp.tensordot(jnp.asarray(factors, leaf.dtype), leaf, axes=1) / 8,
        per_example)
    obs = observation_from_gradient(mean, params, apply_fn, input_shape=SHAPE, num_classes=10,
                                    lr=0.1, batch_size=8)
    rec = run_attack("analytic", obs, {}, jax.random.key(1))
    matched = _match_exact_slots(x, rec)
    assert len(matched) == 8 and np.any(factors < 1)
    for slot, n in matched.items():
        assert float(rec.extras["peel_scales"][slot]) == pytest.approx(-0.1 / 8 * factors[n],
                                                                       rel=1e-4)


@pytest.mark.parametrize("steps,peeled", [(2, False), (None, False), (1, True)])
def test_only_a_one_step_fedavg_update_is_peeled(net, steps, peeled):
    """Several local steps move the model (and without the ``local_steps``
    grant the server cannot tell): no example's share can be computed. One
    step, here as the engine forms it (Δ = w_local − w_global in float32), is
    a gradient step at the global model."""
    apply_fn, params = net
    x, y = _batch(3, 8)
    opt = optax.sgd(0.05)
    p, state = params, opt.init(params)
    for _ in range(steps or 2):
        u, state = opt.update(_gradient(apply_fn, p, x, y), state, p)
        p = optax.apply_updates(p, u)
    delta = jax.tree_util.tree_map(lambda a, b: a - b, p, params)
    obs = Observation(update=delta, params=params, apply_fn=apply_fn, algorithm="fedavg",
                      lr=0.05, local_steps=steps, batch_size=8, num_examples=8, labels=None,
                      input_shape=SHAPE, num_classes=10)
    rec = run_attack("analytic", obs, {"peel": True}, jax.random.key(1))
    if peeled:
        assert set(_match_exact_slots(x, rec).values()) == _examples_found_by_peeling(params, x)
        assert np.all(rec.extras["peeled"][rec.extras["exact"]])
    else:
        assert not np.any(rec.extras["peeled"]) and np.all(rec.extras["found_in_pass"] <= 0)
        assert np.all(np.isnan(rec.extras["peel_residuals"]))


def test_the_batches_above_really_mix_some_examples(net):
    """The count above is not trivial: at B = 16 some examples have no two
    exclusive units, and the attack marks fewer than B slots exact."""
    apply_fn, params = net
    x, y = _batch(4, 16)
    assert len(_examples_found_by_peeling(params, x)) < 16
    rec = run_attack("analytic", _fedsgd(apply_fn, params, x, y), {}, jax.random.key(1))
    assert 0 < int(np.sum(rec.extras["exact"])) < 16
    assert float(rec.loss) > 1e-3  # the returned batch does not explain the kernel update


def test_a_fedavg_update_of_momentum_sgd_steps_still_gives_one_example_exactly(net):
    apply_fn, params = net
    x, y = _batch(5, 1)
    opt = optax.sgd(0.05, momentum=0.9)
    p, state = params, opt.init(params)
    for _ in range(5):
        u, state = opt.update(_gradient(apply_fn, p, x, y), state, p)
        p = optax.apply_updates(p, u)
    delta = jax.tree_util.tree_map(lambda a, b: a - b, p, params)
    obs = Observation(update=delta, params=params, apply_fn=apply_fn, algorithm="fedavg",
                      lr=0.05, local_steps=5, batch_size=1, num_examples=1, labels=None,
                      input_shape=SHAPE, num_classes=10)
    rec = run_attack("analytic", obs, {}, jax.random.key(1))
    np.testing.assert_allclose(np.asarray(rec.x), x, rtol=0, atol=1e-4)
    assert bool(rec.extras["exact"][0])


def test_noise_leaves_no_slot_marked_exact_and_more_noise_recovers_less(net):
    apply_fn, params = net
    x, y = _batch(6, 1)
    g = _gradient(apply_fn, params, x, y)
    scores = []
    for sigma in (1e-4, 1e-3, 1e-2):
        keys = iter(jax.random.split(jax.random.key(7), 8))
        noisy = jax.tree_util.tree_map(
            lambda a: a + sigma * jax.random.normal(next(keys), a.shape), g)
        obs = observation_from_gradient(noisy, params, apply_fn, input_shape=SHAPE,
                                        num_classes=10, lr=0.1, batch_size=1)
        rec = run_attack("analytic", obs, {"label_mode": "infer"}, jax.random.key(1))
        assert not np.any(rec.extras["exact"])
        scores.append(float(psnr(np.clip(np.asarray(rec.x), 0, 1), x)[0]))
    assert scores[0] > scores[1] > scores[2], scores


def test_fedsim_attack_runs_it_on_observed_uploads(tmp_path):
    """End to end, the example config on synthetic data: a FedSGD round of the
    2NN, observed, stripped to the threat model's grants (the number of
    examples only), attacked and scored by ``fedsim attack``."""
    from attacks.cli import main
    from tests.attacks.test_cli import BASE

    overrides = [s for s in BASE if not s.startswith(("model.name", "attack.",
                                                      "data.examples_per_client"))]
    overrides += ["data.examples_per_client=2", f"output.dir={tmp_path}"]
    assert main(["configs/attack_analytic.yaml", "--quiet"]
                + sum((["--set", s] for s in overrides), [])) == 0
    summary = json.loads((tmp_path / "attack_summary.json").read_text())
    assert [v["client"] for v in summary["victims"]] == [0, 1]
    for v in summary["victims"]:
        assert v["psnr"] >= 80.0 and v["label_acc"] == 1.0, v  # two examples read off exactly
        assert v["loss"] < 1e-5 and v["marked_exact"] == 2


def test_given_labels_are_the_granted_ones(net):
    apply_fn, params = net
    x, y = _batch(8, 4)
    obs = _fedsgd(apply_fn, params, x, y, labels=jnp.asarray(y))
    rec = run_attack("analytic", obs, {"label_mode": "given"}, jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(rec.labels), y)
    obs = _fedsgd(apply_fn, params, x, y)
    with pytest.raises(AttackConfigError, match="grant 'labels'"):
        run_attack("analytic", obs, {"label_mode": "given"}, jax.random.key(1))


def test_grouping_is_single_linkage_and_largest_first():
    r = np.array([[1.0, 0.0], [1.0, 5e-4], [1.0, 1e-3], [0.0, 1.0], [0.0, 1.0 + 1e-4], [5, 5]])
    groups = group_ratios(r, 6e-4)  # 0–1 and 1–2 agree, 0–2 do not: one group by linkage
    assert [g.tolist() for g in groups] == [[0, 1, 2], [3, 4], [5]]
    # relative to the larger of the two norms
    assert [g.tolist() for g in group_ratios(np.array([[1.0, 0.0], [2.0, 0.0]]), 0.6)] == [[0, 1]]
    assert len(group_ratios(np.array([[1.0, 0.0], [2.0, 0.0]]), 0.45)) == 2
    # largest first, whatever the units' order
    r = np.array([[5.0, 5.0], [0.0, 1.0], [0.0, 1.0 + 1e-5], [1.0, 0.0], [1.0, 1e-5],
                  [1.0, 2e-5]])
    assert [g.tolist() for g in group_ratios(r, 1e-4)] == [[3, 4, 5], [1, 2], [0]]
    # all-zero ratios (a kernel update pruned away) agree with nothing, not with each other
    assert [g.tolist() for g in group_ratios(np.zeros((3, 2)), 1e-5)] == [[0], [1], [2]]


def test_recover_inputs_against_a_hand_made_update():
    """Two examples; units 0–1 reach only example a, units 2–3 only b, unit 4 both."""
    a, b = np.array([1.0, 2.0, 3.0]), np.array([-1.0, 0.5, 4.0])
    delta = np.array([[0.3, -0.2, 0.0, 0.0, 0.5],   # δ of example a at each unit
                      [0.0, 0.0, 0.7, 0.1, -0.2]])  # δ of example b
    kernel = np.outer(a, delta[0]) + np.outer(b, delta[1])
    out = recover_inputs(kernel, delta.sum(0), 2)
    np.testing.assert_allclose(out["x"], np.stack([a, b]), rtol=1e-12)
    assert out["exact"].tolist() == [True, True] and out["group_sizes"].tolist() == [2, 2]
    assert out["units"] == 5 and out["residual"] < 1e-12
    assert np.all(out["group_spreads"] < 1e-12)
    # asked for three: the third is the rank-one fit of the unit left over (the mixture)
    mixture = (0.5 * a - 0.2 * b) / 0.3
    three = recover_inputs(kernel, delta.sum(0), 3)
    np.testing.assert_allclose(three["x"][2], mixture, rtol=1e-12)
    assert three["exact"].tolist() == [True, True, False] and np.isnan(three["group_spreads"][2])
    # a group's spread: the farthest of its ratios from the group's estimate, relative
    nudged = kernel.copy()
    nudged[0, 1] += 1e-7 * 0.2  # unit 1's ratio moves by 1e-7 in its first coordinate
    out = recover_inputs(nudged, delta.sum(0), 2, match_tolerance=1e-6)
    x0 = out["x"][0]
    r0, r1 = kernel[:, 0] / 0.3, nudged[:, 1] / -0.2
    expected = max(np.linalg.norm(r0 - x0), np.linalg.norm(r1 - x0)) / np.linalg.norm(x0)
    assert out["group_spreads"][0] == pytest.approx(expected, rel=1e-6) and expected > 1e-9
    # a unit whose bias update is below min_bias_update × the largest is not read
    bias = delta.sum(0).copy()
    bias[4] = 1e-9
    assert recover_inputs(kernel, bias, 2)["units"] == 4


def _three_example_update():
    """Units 0–1 reach only a; 2–3 a and b; 4–5 a and c; 6 b and c."""
    xs = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0], [2.0, -3.0, 0.5]])
    delta = np.array([[0.3, -0.2, 0.4, 0.1, -0.3, 0.2, 0.0],
                      [0.0, 0.0, 0.7, -0.5, 0.0, 0.0, 0.6],
                      [0.0, 0.0, 0.0, 0.0, 0.5, 0.9, -0.4]])
    return xs, delta, xs.T @ delta, delta.sum(0)


def _candidates(xs, delta, rows):
    """A stand-in for the model's ∂ℓ/∂b per class: the nearest example's δ,
    times 2, as class 1 of 3 (``rows`` gives the other two)."""
    def grads(x):
        n = int(np.argmin(np.abs(xs - x).max(1)))
        return np.stack([rows[0], 2.0 * delta[n], rows[1]])
    return grads


def test_peeling_against_a_hand_made_update():
    xs, delta, kernel, bias = _three_example_update()
    rng = np.random.default_rng(0)
    one_pass = recover_inputs(kernel, bias, 3)
    assert one_pass["exact"].tolist() == [True, False, False]
    out = recover_inputs(kernel, bias, 3,
                         class_bias_grads=_candidates(xs, delta, rng.normal(size=(2, 7))))
    np.testing.assert_allclose(out["x"], xs, rtol=1e-12)
    assert out["exact"].tolist() == [True, True, True]
    assert out["found_in_pass"].tolist() == [0, 1, 1] and out["peeled"].all()
    assert out["peel_labels"].tolist() == [1, 1, 1]
    np.testing.assert_allclose(out["peel_scales"], 0.5, rtol=1e-12)
    assert out["group_sizes"].tolist() == [2, 2, 2] and out["residual"] < 1e-12
    # candidates that do not fit (none is the example's δ): the group is returned, neither
    # peeled nor marked exact
    wrong = recover_inputs(kernel, bias, 3, class_bias_grads=lambda x: rng.normal(size=(3, 7)))
    assert not wrong["exact"].any() and not wrong["peeled"].any()
    assert wrong["group_sizes"].tolist() == [2, 0, 0]
    assert wrong["peel_residuals"][0] > 1e-3 and np.isnan(wrong["peel_residuals"][1])
    np.testing.assert_allclose(wrong["x"], one_pass["x"], rtol=1e-12)
    # the fit must be within peel_tolerance: a δ off by 1 % in one unit is refused at 1e-3
    off = delta.copy()
    off[0, 1] *= 1.01
    refused = recover_inputs(kernel, bias, 3, peel_tolerance=1e-3,
                             class_bias_grads=_candidates(xs, off, rng.normal(size=(2, 7))))
    assert not refused["peeled"].any() and refused["peel_residuals"][0] > 1e-3
    taken = recover_inputs(kernel, bias, 3, peel_tolerance=1e-2,
                           class_bias_grads=_candidates(xs, off, rng.normal(size=(2, 7))))
    assert taken["peeled"][0]


def test_a_later_pass_fills_only_the_slots_left():
    """Pass 0 finds a, pass 1 finds b and c; asked for two inputs, it returns two."""
    xs, delta, kernel, bias = _three_example_update()
    out = recover_inputs(kernel, bias, 2,
                         class_bias_grads=_candidates(xs, delta, np.ones((2, 7))))
    assert out["x"].shape == (2, 3) and out["exact"].tolist() == [True, True]
    assert out["found_in_pass"].tolist() == [0, 1]


def test_a_unit_that_peeling_emptied_is_not_read():
    """Units 0–1 reach only a, 2–3 only b, 4 both (dyadic numbers: peeling both
    leaves unit 4 exactly 0). Asked for a third input, the attack does not divide
    unit 4's 0 by 0: the third slot is the fit of the whole update."""
    import warnings

    xs = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]])
    delta = np.array([[0.5, -0.25, 0.0, 0.0, 0.75],
                      [0.0, 0.0, 0.5, 0.125, -0.25]])
    kernel, bias = xs.T @ delta, delta.sum(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a 0/0 ratio would warn
        out = recover_inputs(kernel, bias, 3,
                             class_bias_grads=_candidates(xs, delta, np.ones((2, 5))))
    assert out["exact"].tolist() == [True, True, False]
    np.testing.assert_allclose(out["x"][2], kernel @ bias / (bias @ bias), rtol=1e-12)


def test_a_slot_without_a_group_is_the_fit_of_what_peeling_left():
    """Units 0–1 reach only a, 2–3 a and b, 4 a and c. Peeling a leaves b two
    units and c one: c is no group, but unit 4's remainder is c alone, so the
    filled slot is c (from the update before peeling it would be a mixture)."""
    xs = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0], [2.0, -3.0, 0.5]])
    delta = np.array([[0.3, -0.2, 0.4, 0.1, -0.3],
                      [0.0, 0.0, 0.7, -0.5, 0.0],
                      [0.0, 0.0, 0.0, 0.0, 0.5]])
    out = recover_inputs(xs.T @ delta, delta.sum(0), 3,
                         class_bias_grads=_candidates(xs, delta, np.ones((2, 5))))
    assert out["exact"].tolist() == [True, True, False]
    np.testing.assert_allclose(out["x"], xs, rtol=1e-9)


def test_fitted_classes_take_their_slots_and_the_count_fills_the_rest():
    # the count says {1, 3, 3, 7}; the fits say slot 0 is 3 and slot 2 is 5 (not counted)
    out = merge_labels(np.array([3, -1, 5, -1]), np.array([1, 3, 3, 7]))
    assert out.tolist() == [3, 1, 5, 3]
    # a fitted class is taken out of the count once: the first 1 is the fit's
    out = merge_labels(np.array([1, -1, -1, 5]), np.array([1, 3, 3, 7]))
    assert out.tolist() == [1, 3, 3, 5]
    assert merge_labels(np.full(3, -1), np.array([2, 0, 9])).tolist() == [2, 0, 9]
    assert merge_labels(np.array([4, 4]), np.array([1, 2])).tolist() == [4, 4]


def test_an_example_whose_fit_failed_is_not_returned_twice():
    """Units 0–1 reach only a, 2–3 only d, 4–5 both. a's fit fails, d is
    peeled: units 4–5 then join a's units 0–1 (kept for later passes), which
    give a again: one slot, its fit tried again, not a new input."""
    xs = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]])
    delta = np.array([[0.3, -0.2, 0.0, 0.0, 0.4, 0.1],
                      [0.0, 0.0, 0.7, 0.1, -0.5, 0.2]])
    rng = np.random.default_rng(1)

    def grads(x):
        if np.allclose(x, xs[1]):
            return np.stack([delta[1], rng.normal(size=6)])
        return rng.normal(size=(2, 6))

    out = recover_inputs(xs.T @ delta, delta.sum(0), 3, class_bias_grads=grads)
    np.testing.assert_allclose(out["x"][:2], xs, rtol=1e-12)
    assert out["exact"].tolist() == [False, True, False]  # a's group failed its fit
    assert out["peeled"].tolist() == [False, True, False]
    assert out["group_sizes"].tolist() == [4, 2, 0]  # a's group, read again in pass 1
    assert out["found_in_pass"].tolist() == [1, 0, -1]


def _peelable_only(xs, delta, seed):
    """∂ℓ/∂b per class for an input that is one of ``xs`` (its δ times 2, as class 1);
    for any other input rows that fit nothing."""
    rng = np.random.default_rng(seed)

    def grads(x):
        for n, xn in enumerate(xs):
            if np.allclose(x, xn, rtol=1e-9, atol=0):
                return np.stack([rng.normal(size=delta.shape[1]), 2.0 * delta[n],
                                 rng.normal(size=delta.shape[1])])
        return rng.normal(size=(3, delta.shape[1]))
    return grads


def test_a_group_whose_fit_failed_does_not_take_a_slot_a_later_example_needs():
    """Units 0–1 reach only a, 2–3 a and b, 4–5 a and c, 6–7 b and c in the same
    proportion (their ratios agree: a group that is no example, whose fit fails).
    Pass 0 finds a and the mixture; pass 1, with a peeled, finds b and c. The
    mixture holds no slot while passes go on, so B = 3 gives a, b and c (dyadic
    numbers: peeling b and c leaves units 6–7 exactly 0)."""
    xs = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0], [2.0, -3.0, 0.5]])
    delta = np.array([[0.5, -0.25, 0.25, 0.5, -0.25, 0.25, 0.0, 0.0],
                      [0.0, 0.0, 0.75, -0.25, 0.0, 0.0, 0.5, 0.25],
                      [0.0, 0.0, 0.0, 0.0, 0.5, 0.75, 0.25, 0.125]])
    kernel, bias = xs.T @ delta, delta.sum(0)
    one_pass = recover_inputs(kernel, bias, 3)
    assert one_pass["group_sizes"].tolist() == [2, 2, 0]  # a and the mixture
    np.testing.assert_allclose(one_pass["x"][0], xs[0], rtol=1e-12)
    mixture = one_pass["x"][1]
    assert np.abs(mixture[None] - xs).max(1).min() > 0.1
    out = recover_inputs(kernel, bias, 3, class_bias_grads=_peelable_only(xs, delta, 0))
    np.testing.assert_allclose(out["x"], xs, rtol=1e-12)
    assert out["peeled"].all() and out["found_in_pass"].tolist() == [0, 1, 1]
    # asked for four, the mixture takes the slot left, in the order found, unpeeled
    four = recover_inputs(kernel, bias, 4, class_bias_grads=_peelable_only(xs, delta, 0))
    assert four["peeled"].tolist() == [True, False, True, True]
    assert four["exact"].tolist() == [True, False, True, True]
    assert four["found_in_pass"].tolist() == [0, 0, 1, 1]
    np.testing.assert_allclose(four["x"][1], mixture, rtol=1e-12)
    assert four["peel_residuals"][1] > 1e-3


def test_a_pass_reads_no_more_groups_than_examples_are_left_to_find():
    """Units 0–2 reach only a, 3–4 only b; a's fit fails, b's would pass. Asked for
    one input the pass reads only the largest group, a's (as one pass would): each
    group read is a chance for a false fit. Asked for two, it reads both."""
    xs = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]])
    delta = np.array([[0.5, -0.25, 0.75, 0.0, 0.0],
                      [0.0, 0.0, 0.0, 0.25, 0.5]])
    kernel, bias = xs.T @ delta, delta.sum(0)
    only_b = _peelable_only(xs[1:], delta[1:], 0)
    one = recover_inputs(kernel, bias, 1, class_bias_grads=only_b)
    np.testing.assert_allclose(one["x"], xs[:1], rtol=1e-12)
    assert one["group_sizes"].tolist() == [3] and not one["peeled"].any()
    two = recover_inputs(kernel, bias, 2, class_bias_grads=only_b)
    np.testing.assert_allclose(two["x"], xs, rtol=1e-12)
    assert two["peeled"].tolist() == [False, True]


def test_ratio_rounding_bounds_what_the_float32_sum_leaves_after_peeling():
    """Two examples summed in float32 at 500 units: a with δ of order 1, c with δ
    1e-4 of it. Taking a's exact contribution off leaves c's ratio off by the
    rounding of a's: far above float32's epsilon, and (two terms: one rounding
    of each product and of the sum, 2u·Σ|terms| ≤ eps·Σ|terms|) within the
    first-order estimate, computed here from the float32 arithmetic itself."""
    rng = np.random.default_rng(0)
    d, units = 20, 500
    xa, xc = rng.uniform(0.1, 1.0, d), rng.uniform(0.1, 1.0, d)
    da = rng.uniform(0.5, 1.0, units).astype(np.float32)
    dc = (da * rng.uniform(0.5, 1.0, units) * 1e-4).astype(np.float32)
    f32 = np.float32
    kernel = (xa.astype(f32)[:, None] * da[None]) + (xc.astype(f32)[:, None] * dc[None])
    bias = da + dc
    assert kernel.dtype == np.float32 and bias.dtype == np.float32
    x32a = xa.astype(f32).astype(np.float64)
    rest_w = kernel.astype(np.float64) - np.outer(x32a, da.astype(np.float64))
    rest_b = bias.astype(np.float64) - da.astype(np.float64)
    terms_w = np.abs(kernel.astype(np.float64)) + np.abs(np.outer(x32a, da))
    terms_b = np.abs(bias.astype(np.float64)) + np.abs(da.astype(np.float64))
    predicted = ratio_rounding(float(np.finfo(np.float32).eps), rest_w, rest_b, terms_w, terms_b)
    ratios = rest_w / rest_b
    x32c = xc.astype(f32).astype(np.float64)
    actual = np.linalg.norm(ratios - x32c[:, None], axis=0) / np.linalg.norm(x32c)
    assert np.all(actual <= predicted)
    assert np.median(actual) > 1e3 * np.finfo(np.float32).eps  # peeling amplified it
    assert np.median(predicted) < 30 * np.median(actual)  # an estimate, not a loose cap


def test_a_tolerance_widened_by_the_rounding_finds_what_the_float32_remainder_hides():
    """a reaches units 0–3, c (δ 3e-4 of a's) only units 2–3, the update summed in
    float32. Once a is peeled, c's two ratios carry a's rounding and disagree by
    more than ``match_tolerance``; widened by their rounding errors they agree,
    and c is found and peeled."""
    rng = np.random.default_rng(3)
    xs = rng.uniform(0.1, 1.0, size=(2, 6))
    delta = np.array([[0.61, -0.37, 0.83, 0.47], [0.0, 0.0, 0.59 * 3e-4, -0.71 * 3e-4]])
    kernel = xs.T.astype(np.float32) @ delta.astype(np.float32)
    bias = delta.astype(np.float32).sum(0)

    def grads(x):
        n = int(np.argmin(np.abs(xs - x).max(1)))
        return np.stack([np.ones(4), delta[n], -np.ones(4)])

    plain = recover_inputs(kernel, bias, 2, class_bias_grads=grads, rounding_aware=False)
    assert plain["peeled"].tolist() == [True, False] and plain["group_sizes"][1] == 0
    aware = recover_inputs(kernel, bias, 2, class_bias_grads=grads)
    assert aware["peeled"].tolist() == [True, True]
    np.testing.assert_allclose(aware["x"], xs, atol=1e-4)
    # in float64 there is nothing to widen: both find c
    exact = recover_inputs(xs.T @ delta, delta.sum(0), 2, class_bias_grads=grads,
                           rounding_aware=False)
    assert exact["peeled"].all()


def test_a_group_is_estimated_from_its_units_whose_rounding_is_small():
    """a reaches units 0–4, with a δ of about 7e3 at unit 4; c reaches units 2–4,
    summed in float32. Once a is peeled, units 2–3 give c to float32 precision and
    unit 4 gives it off by a's rounding (about 1e-4): it joins c's group only through
    its widened tolerance, and c's estimate is read from units 2–3 alone."""
    rng = np.random.default_rng(0)
    xs = rng.uniform(0.1, 1.0, size=(2, 6))
    delta = np.array([[0.61, -0.37, 0.23, 0.41, 7313.7],
                      [0.0, 0.0, 0.97, 0.73, 0.89]])
    kernel = xs.T.astype(np.float32) @ delta.astype(np.float32)
    bias = delta.astype(np.float32).sum(0)

    def grads(x):
        n = int(np.argmin(np.abs(xs - x).max(1)))
        return np.stack([np.ones(5), delta[n], -np.ones(5)])

    out = recover_inputs(kernel, bias, 2, class_bias_grads=grads)
    assert out["group_sizes"].tolist() == [2, 3] and out["peeled"].all()
    assert out["found_in_pass"].tolist() == [0, 1]
    np.testing.assert_allclose(out["x"][1], xs[1], atol=1e-6)  # all 3 units: off by ~1e-4


@pytest.mark.parametrize("name,match", [
    ("mlp", "has none"),        # paper 001's MLP has no biases
    ("lenet5", "has none"),     # a convolution first
])
def test_a_model_without_a_biased_input_layer_is_named(name, match):
    model = build_model(name)
    shape = (16, 16, 1) if name == "mlp" else (28, 28, 1)
    params = init_params(model, shape, jax.random.key(0))
    with pytest.raises(AttackConfigError, match=match):
        input_layer(params, int(np.prod(shape)))


def test_the_input_layer_is_found_named_and_refused_by_name():
    k = np.zeros((4, 3))
    tree = {"a": {"kernel": k, "bias": np.zeros(3)}, "b": {"kernel": k, "bias": np.zeros(3)},
            "c": {"kernel": np.zeros((3, 2)), "bias": np.zeros(2)}}
    with pytest.raises(AttackConfigError, match=r"has several \(\['a', 'b'\]\)"):
        input_layer(tree, 4)
    assert input_layer(tree, 4, "b") == "b"
    with pytest.raises(AttackConfigError, match="'zz' is not a module"):
        input_layer(tree, 4, "zz")
    with pytest.raises(AttackConfigError, match="'c' is not a fully connected layer"):
        input_layer(tree, 4, "c")


@pytest.mark.parametrize("config,match", [
    ({"match_tolerance": -1.0}, r"attack\.config\.match_tolerance"),
    ({"match_tolerance": float("nan")}, r"attack\.config\.match_tolerance"),
    ({"min_bias_update": 1.0}, r"attack\.config\.min_bias_update"),
    ({"min_bias_update": True}, r"attack\.config\.min_bias_update"),
    ({"batch_size": 0}, r"attack\.config\.batch_size"),
    ({"label_mode": "joint"}, r"attack\.config\.label_mode: 'joint' is not allowed"),
    ({"input_layer": 3}, r"attack\.config\.input_layer"),
    ({"peel": "yes"}, r"attack\.config\.peel: must be true or false"),
    ({"rounding_aware": 1}, r"attack\.config\.rounding_aware: must be true or false"),
    ({"peel_tolerance": 1.0}, r"attack\.config\.peel_tolerance"),
    ({"peel_tolerance": -1e-3}, r"attack\.config\.peel_tolerance"),
    ({"tolerance": 1e-3}, r"unknown key\(s\) \['tolerance'\]"),
])
def test_bad_settings_are_named(config, match):
    with pytest.raises(AttackConfigError, match=match):
        check_config(config)


def test_the_threat_model_must_give_the_batch_size_and_the_labels_it_uses():
    with pytest.raises(AttackConfigError, match="batch size is unknown"):
        check_config({}, {"labels": True})
    with pytest.raises(AttackConfigError, match="grant 'labels'"):
        check_config({"label_mode": "given"}, {"batch_size": True})
    check_config({"batch_size": 2}, {})
    check_config({}, {"num_examples": True})


def test_a_non_finite_or_all_zero_update_is_named():
    with pytest.raises(ValueError, match="NaN/inf"):
        recover_inputs(np.full((3, 2), np.nan), np.ones(2), 1)
    with pytest.raises(ValueError, match="zero at every unit"):
        recover_inputs(np.ones((3, 2)), np.zeros(2), 1)
