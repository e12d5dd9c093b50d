"""The server optimizers, end to end, against their update rules written out by hand.

Independent computation: with FedSGD and every client in every round, the
example-weighted aggregate is Δ̄ = −lr·∇L̄(x), L̄ the mean cross-entropy over
ALL training examples (Σ_c n_c·(−lr ∇L_c) / Σ_c n_c), so the reference gets
each round's Δ̄ from one jax.grad of a hand-written cross-entropy over the
whole training set at the reference's OWN params, and then applies the server
rule in numpy (float64) from the papers:

* FedAvgM (Hsu et al. 2019): heavy-ball v ← β v + Δ̄, x ← x + η v, β = 0.9;
* FedAdam / FedYogi / FedAdagrad (Reddi et al. 2021, Alg. 2): m ← β1 m + (1−β1)Δ̄,
  v per method, x ← x + η m / (√v + τ), with the library's documented details
  that Alg. 2 leaves out: Adam and Yogi divide m and v by their bias
  corrections (1 − β^t) (Kingma & Ba), Yogi starts m and v at τ² = 1e-6 and
  uses β2 = 0.999, Adagrad starts v at 0.1 and adds τ inside the root.

* fedadam / fedyogi / fedadagrad: Alg. 2 as printed, without those details:
  no bias correction, m₋₁ = 0, v₋₁ = τ², τ outside the root, and the momentum
  m for all three (Adagrad included).

Two rounds, so the momentum / second-moment state carried from round 1 shapes
round 2's step. The defaults pinned: momentum 0.9; Adam β1 0.9, β2 0.99, τ 1e-3;
Yogi τ 1e-3; Adagrad τ 1e-3; Alg. 2's the authors' experiments' β1 0.9 (0 for
Adagrad), β2 0.999, τ 1e-3 (fedsim/server.py).
Other values of the training.server_* keys are checked against the same rules.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

from fedsim.data import synthetic_dataset
from fedsim.simulation import Simulation
from tests.fedsim.helpers import small_config

CLIENT_LR = 0.05
SERVER_LR = {"sgd": 1.0, "momentum": 0.5, "adam": 0.1, "yogi": 0.03, "adagrad": 0.03,
             "fedadam": 0.03, "fedyogi": 0.03, "fedadagrad": 0.03}
#: Each rule's hyperparameters when the config leaves them out.
DEFAULTS = {"momentum": {"momentum": 0.9}, "adam": {"b1": 0.9, "b2": 0.99, "tau": 1e-3},
            "yogi": {"b1": 0.9, "b2": 0.999, "tau": 1e-3}, "adagrad": {"tau": 1e-3},
            "fedadam": {"b1": 0.9, "b2": 0.999, "tau": 1e-3},
            "fedyogi": {"b1": 0.9, "b2": 0.999, "tau": 1e-3},
            "fedadagrad": {"b1": 0.0, "tau": 1e-3}}


def _sim(server_optimizer, **overrides):
    ds = synthetic_dataset(seed=3, image_size=8, num_train=60, num_test=20)
    cfg = small_config(**{"data.image_size": 8, "data.num_clients": 3, "data.partition": "iid",
                          "training.clients_per_round": 3, "training.algorithm": "fedsgd",
                          "training.lr": CLIENT_LR, "training.rounds": 2,
                          "training.server_optimizer": server_optimizer,
                          "training.server_lr": SERVER_LR[server_optimizer], **overrides})
    return Simulation(cfg, dataset=ds), ds


def _mean_delta_fn(sim, ds):
    """Δ̄(x) = −lr ∇ (mean CE over every training example), flat float64."""
    idx = np.sort(np.concatenate(sim.partitions))
    assert np.array_equal(idx, np.arange(len(ds.y_train)))  # every example, once
    x, y = jnp.asarray(ds.x_train), jnp.asarray(ds.y_train)
    _, unravel = ravel_pytree(sim.init_state().params)

    def mean_ce(flat):
        logits = sim.apply_fn(unravel(flat), x)
        logp = logits - jax.scipy.special.logsumexp(logits, axis=-1, keepdims=True)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    grad = jax.jit(jax.grad(mean_ce))
    return lambda flat: -CLIENT_LR * np.asarray(grad(jnp.asarray(flat, jnp.float32)), np.float64)


def _reference(name, x0, mean_delta, rounds=2, eta=None, **hyperparameters):
    """The server rule by hand, on pseudo-gradient g = −Δ̄ (as Reddi et al. write x ← x − η·)."""
    eta = SERVER_LR[name] if eta is None else eta
    hp = {**DEFAULTS.get(name, {}), **hyperparameters}
    x = np.array(x0, np.float64)
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    if name == "yogi":
        m[:] = v[:] = 1e-6
    if name == "adagrad":
        v[:] = 0.1
    if name.startswith("fed"):
        v[:] = hp["tau"] ** 2  # Alg 2: v₋₁ ≥ τ², the least it allows
    for t in range(1, rounds + 1):
        g = -mean_delta(x)
        if name == "sgd":
            x = x - eta * g
        elif name == "momentum":
            m = hp["momentum"] * m + g
            x = x - eta * m
        elif name in ("adam", "yogi"):
            b1, b2, tau = hp["b1"], hp["b2"], hp["tau"]
            m = b1 * m + (1 - b1) * g
            if name == "adam":
                v = b2 * v + (1 - b2) * g ** 2
            else:
                v = v - (1 - b2) * np.sign(v - g ** 2) * g ** 2
            x = x - eta * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + tau)
        elif name == "adagrad":
            v = v + g ** 2
            x = x - eta * g / np.sqrt(v + hp["tau"])
        else:  # Alg 2 as printed, on Δ = −g: x ← x + η m / (√v + τ)
            d = -g
            m = hp["b1"] * m + (1 - hp["b1"]) * d
            if name == "fedadam":
                v = hp["b2"] * v + (1 - hp["b2"]) * d ** 2
            elif name == "fedyogi":
                v = v - (1 - hp["b2"]) * d ** 2 * np.sign(v - d ** 2)
            else:
                v = v + d ** 2
            x = x + eta * m / (np.sqrt(v) + hp["tau"])
    return x


def _two_rounds_against_the_reference(name, lr=None, **hyperparameters):
    sim, ds = _sim(name, **{f"training.server_{k}": v for k, v in hyperparameters.items()},
                   **({"training.server_lr": lr} if lr else {}))
    state = sim.init_state()
    x0, _ = ravel_pytree(state.params)
    x0 = np.asarray(x0, np.float64)
    for r in range(2):
        state, res = sim.run_round(state, r)
        assert sorted(res.cohort.tolist()) == [0, 1, 2]
    got = np.asarray(ravel_pytree(state.params)[0], np.float64)
    mean_delta = _mean_delta_fn(sim, ds)
    expected = _reference(name, x0, mean_delta, eta=lr, **hyperparameters)
    # Compare the two rounds' total movement; float32 engine vs float64 reference.
    moved = np.max(np.abs(expected - x0))
    assert moved > 1e-3
    np.testing.assert_allclose(got - x0, expected - x0, rtol=0, atol=1e-4 * moved)
    return x0, mean_delta, expected


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "yogi", "adagrad", "fedadam",
                                  "fedyogi", "fedadagrad"])
def test_two_server_steps_match_the_update_rule_by_hand(name):
    _two_rounds_against_the_reference(name)


@pytest.mark.parametrize("name,hyperparameters", [
    ("momentum", {"momentum": 0.5}),
    ("adam", {"b1": 0.5, "b2": 0.9, "tau": 1e-2}),
    ("yogi", {"b1": 0.0, "b2": 0.9, "tau": 1e-2}),
    # Adagrad's accumulator starts at 0.1: τ shows only when large, and slows the step.
    ("adagrad", {"tau": 0.2, "lr": 0.1}),
    ("fedadam", {"b1": 0.5, "b2": 0.9, "tau": 1e-2}),
    ("fedyogi", {"b1": 0.0, "b2": 0.9, "tau": 1e-2}),
    ("fedadagrad", {"b1": 0.5, "tau": 1e-2}),
])
def test_the_server_hyperparameter_keys_reach_the_rule(name, hyperparameters):
    hyperparameters = dict(hyperparameters)
    lr = hyperparameters.pop("lr", None)
    x0, mean_delta, expected = _two_rounds_against_the_reference(name, lr=lr, **hyperparameters)
    # The values must move the rule's result far beyond the tolerance above
    # (1e-4 of the movement), or the engine could match it with them ignored.
    at_defaults = _reference(name, x0, mean_delta, eta=lr)
    assert np.max(np.abs(expected - at_defaults)) > 0.05 * np.max(np.abs(expected - x0))


@pytest.mark.parametrize("rule", ["adam", "yogi", "adagrad"])
def test_reddi_alg2_on_a_pytree_matches_the_printed_rule(rule):
    """Five steps of :func:`fedsim.server.reddi_alg2` on random pseudo-gradients,
    against Alg 2 in numpy float64; the yogi case sees v both above and below Δ²."""
    from fedsim.server import reddi_alg2

    rng = np.random.default_rng(0)
    lr, b1, b2, tau = 0.1, 0.8, 0.95, 0.05
    tx = reddi_alg2(rule, lr, b1=b1, b2=b2, tau=tau)
    params = {"a": jnp.zeros((3, 2), jnp.float32), "b": jnp.zeros((4,), jnp.float32)}
    state = tx.init(params)
    x = np.zeros(10)
    m, v = np.zeros(10), np.full(10, tau ** 2)
    signs = set()
    for step in range(5):
        g = rng.normal(size=10) * (0.02 if step % 2 else 1.0)  # small steps push Yogi's v down
        grads = {"a": jnp.asarray(g[:6].reshape(3, 2), jnp.float32),
                 "b": jnp.asarray(g[6:], jnp.float32)}
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        d = -g
        m = b1 * m + (1 - b1) * d
        signs |= set(np.sign(v - d ** 2))
        v = {"adam": b2 * v + (1 - b2) * d ** 2, "adagrad": v + d ** 2,
             "yogi": v - (1 - b2) * d ** 2 * np.sign(v - d ** 2)}[rule]
        x = x + lr * m / (np.sqrt(v) + tau)
    got = np.concatenate([np.asarray(params["a"]).ravel(), np.asarray(params["b"])])
    np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-6)
    assert {-1.0, 1.0} <= signs


def _client_grad(apply_fn, params, x, y):
    """∇ of a hand-written mean cross-entropy (log-softmax by logsumexp)."""
    def mean_ce(p):
        logits = apply_fn(p, x)
        logp = logits - jax.scipy.special.logsumexp(logits, axis=-1, keepdims=True)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))
    return jax.grad(mean_ce)(params)


def test_uniform_weighting_takes_the_plain_mean_of_the_client_updates():
    # Independent computation: 2 clients of 3 and 2 examples (iid split of 5),
    # FedSGD, server SGD lr 1, training.weighting uniform: the new model is
    # p0 + (Δ_1 + Δ_2)/2 with Δ_c = −lr ∇(mean CE over client c's examples),
    # not the example-weighted (3Δ_1 + 2Δ_2)/5.
    ds = synthetic_dataset(seed=5, image_size=8, num_train=5, num_test=10)
    cfg = small_config(**{"data.image_size": 8, "data.num_clients": 2, "data.partition": "iid",
                          "training.clients_per_round": 2, "training.algorithm": "fedsgd",
                          "training.lr": 0.5, "training.rounds": 1,
                          "training.weighting": "uniform"})
    sim = Simulation(cfg, dataset=ds)
    assert sorted(len(p) for p in sim.partitions) == [2, 3]
    state = sim.init_state()
    p0 = state.params
    new_state, _ = sim.run_round(state, 0)
    deltas = [jax.tree_util.tree_map(
        lambda g: -0.5 * np.asarray(g, np.float64),
        _client_grad(sim.apply_fn, p0, jnp.asarray(ds.x_train[p]), jnp.asarray(ds.y_train[p])))
        for p in sim.partitions]
    x0 = np.asarray(ravel_pytree(p0)[0], np.float64)
    d = [np.asarray(ravel_pytree(t)[0], np.float64) for t in deltas]
    n = [len(p) for p in sim.partitions]
    uniform = (d[0] + d[1]) / 2
    weighted = (n[0] * d[0] + n[1] * d[1]) / (n[0] + n[1])
    got = np.asarray(ravel_pytree(new_state.params)[0], np.float64) - x0
    # The two rules must differ well beyond float32 noise for the test to mean anything.
    assert np.max(np.abs(uniform - weighted)) > 100 * 1e-6 * np.max(np.abs(uniform))
    np.testing.assert_allclose(got, uniform, rtol=0, atol=1e-6 * np.max(np.abs(uniform)) + 1e-9)


def test_make_server_optimizer_refuses_a_hyperparameter_its_optimizer_does_not_take():
    from fedsim.server import make_server_optimizer

    with pytest.raises(ValueError, match=r"'fedadagrad' takes no 'b2' \(it takes b1, tau; "
                                         r"'b2' applies to adam, yogi, fedadam, fedyogi\)"):
        make_server_optimizer("fedadagrad", 0.1, b2=0.9)
    with pytest.raises(ValueError, match=r"unknown server optimizer 'fedadm'.*did you mean"):
        make_server_optimizer("fedadm", 0.1)
    make_server_optimizer("fedadagrad", 0.1, b2=None)  # None: the default, as the config's null
    for bad, match in (({"b1": 1.0}, r"b1 must be in \[0, 1\), got 1.0"),
                       ({"b2": -0.1}, r"b2 must be in \[0, 1\), got -0.1"),
                       ({"tau": float("nan")}, r"tau must be > 0, got nan")):
        with pytest.raises(ValueError, match=match):
            make_server_optimizer("fedyogi", 0.1, **bad)
        with pytest.raises(ValueError, match=match):
            make_server_optimizer("yogi", 0.1, **bad)
    with pytest.raises(ValueError, match=r"'momentum': momentum must be in \[0, 1\), got 1.5"):
        make_server_optimizer("momentum", 0.1, momentum=1.5)


def test_the_config_offers_exactly_the_server_optimizers_and_keys_the_server_builds():
    # fedsim.config keeps its own list (it imports no JAX); the two must agree.
    import dataclasses

    from fedsim.config import SERVER_HYPERPARAMETER_KEYS, TrainingConfig
    from fedsim.server import SERVER_HYPERPARAMETERS, SERVER_OPTIMIZERS

    fields = {f.name: f for f in dataclasses.fields(TrainingConfig)}
    assert fields["server_optimizer"].metadata["choices"] == SERVER_OPTIMIZERS
    assert set(SERVER_HYPERPARAMETERS) == set(SERVER_OPTIMIZERS)
    used = {k for hp in SERVER_HYPERPARAMETERS.values() for k in hp}
    assert used == set(SERVER_HYPERPARAMETER_KEYS)
    assert all(key in fields for key in SERVER_HYPERPARAMETER_KEYS.values())
