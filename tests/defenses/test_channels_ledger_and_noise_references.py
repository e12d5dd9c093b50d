"""Checks of the channels (000, Tan et al.): the parameter channel's
padding rows, Eq 18's capacity, the ledger's step counts and its min κ, Σ_D of a
standardised dataset.

Each expected value is recomputed by hand (numpy, float64) from the paper's
equation or the docstring, never read off the code under test.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from defenses.channels import (LeakageLedger, data_statistics, natural_channel,
                               parameter_channel)
from defenses.channels._ledger import simulation_ledger, steps_per_participation
from defenses.channels._natural import natural_capacity
from defenses.channels._statistics import dataset_statistics
from fedsim.hooks import DefenseContext


def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _bisect_log_sigma(lam, kappa):
    """ln σ with ½ Σ ln(1 + λ_i/σ) = κ (Thm 2 / Eq 18), float64 bisection on ln σ."""
    lam = lam[lam > 0]
    f = lambda ls: 0.5 * np.sum(np.logaddexp(0.0, np.log(lam) - ls))  # noqa: E731
    lo, hi = np.log(lam.max()) - 60.0, np.log(lam.max()) + 60.0
    for _ in range(300):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) > kappa else (lo, mid)
    return 0.5 * (lo + hi)


def test_parameter_channel_calibrates_on_the_real_examples_only():
    """Kills ``centred = flat - mean`` (padding rows in the covariance) and
    ``n = x.shape[0]`` (padding counted in B) in ``parameter_channel``.

    Reference (000 Thm 2 with Eq 22): per-example gradients of a linear softmax
    model written by hand (∂l/∂W = x (p − e_y)ᵀ, ∂l/∂b = p − e_y) for the B real
    rows only; the batch-mean gradient's covariance has the eigenvalues
    s²/(B − 1)/B of the centred gradients' singular values s; σ solves
    ½ Σ ln(1 + λ/σ) = κ (own float64 bisection). The noise is √σ times the
    key's standard normal draw, so (g̃ − g)/z = √σ coordinate-wise.
    """
    rng = np.random.default_rng(0)
    B_real, B, D, K = 5, 8, 6, 3
    W = rng.normal(size=(D, K))
    b = rng.normal(size=K)
    params = {"w": jnp.asarray(W, jnp.float32), "b": jnp.asarray(b, jnp.float32)}
    x = rng.normal(size=(B, D))
    x[B_real:] *= 25.0  # padding rows: large garbage, would dominate the covariance
    y = rng.integers(0, K, B)
    mask = np.array([1.0] * B_real + [0.0] * (B - B_real))
    apply_fn = lambda p, xx: xx.reshape(xx.shape[0], -1) @ p["w"] + p["b"]  # noqa: E731
    ctx = DefenseContext(params=params, x=jnp.asarray(x, jnp.float32), y=jnp.asarray(y),
                         mask=jnp.asarray(mask, jnp.float32), apply_fn=apply_fn)
    grads = {"w": jnp.asarray(rng.normal(size=(D, K)), jnp.float32),
             "b": jnp.asarray(rng.normal(size=K), jnp.float32)}
    key = jax.random.key(7)
    out, _ = parameter_channel(2.0).apply(grads, (), key=key, context=ctx)

    # Hand per-example gradients, flattened in ravel_pytree's order (sorted keys: b, w).
    xr, yr = x[:B_real], y[:B_real]
    err = _softmax(xr @ W + b) - np.eye(K)[yr]
    flat = np.concatenate([err, np.einsum("bd,bk->bdk", xr, err).reshape(B_real, -1)], axis=1)
    s = np.linalg.svd(flat - flat.mean(0), compute_uv=False)
    lam = s ** 2 / (B_real - 1) / B_real
    sigma = np.exp(_bisect_log_sigma(lam[lam > 1e-12 * lam.max()], 2.0))

    g_flat = np.asarray(ravel_pytree(grads)[0], np.float64)
    noisy = np.asarray(ravel_pytree(out)[0], np.float64)
    z = np.asarray(jax.random.normal(key, g_flat.shape, jnp.float32), np.float64)
    ratio = (noisy - g_flat) / z
    big = np.abs(z) > 0.1  # float32 round-off of g̃ − g stays small against √σ·z
    np.testing.assert_allclose(ratio[big], np.sqrt(sigma), rtol=2e-3)


@pytest.mark.parametrize("sigma", [0.05, 0.7, 3.0])
def test_natural_capacity_is_eq18(sigma):
    """Kills ``channel_capacity(eigenvalues, np.sqrt(sigma))`` in ``natural_capacity``.

    Reference: 000 Eq 18, f(σ) = ½ Σ_i ln((λ_i + σ)/σ), λ_i the eigenvalues of
    the sample covariance (numpy, divisor N − 1).
    """
    x = np.random.default_rng(1).normal(size=(40, 5)) * np.array([3.0, 1.0, 0.5, 0.2, 0.1])
    lam = np.linalg.eigvalsh(np.cov(x, rowvar=False))
    expected = 0.5 * np.sum(np.log((lam + sigma) / sigma))
    assert natural_capacity(data_statistics(x), sigma) == pytest.approx(expected, rel=1e-9)


def _stub_sim(counts, algorithm, local_epochs, batch):
    return types.SimpleNamespace(
        client_counts=np.asarray(counts),
        cfg=types.SimpleNamespace(training=types.SimpleNamespace(algorithm=algorithm,
                                                                  local_epochs=local_epochs)),
        settings=types.SimpleNamespace(effective_batch=batch))


def test_steps_per_participation_is_epochs_times_ceil_of_n_over_b():
    """Kills floor division (``counts // b``) and a dropped ``local_epochs`` factor.

    Reference (000 §4: each local step is one channel use): FedAvg takes
    E·⌈n_c/B⌉ steps per participation (a last partial batch is a step; a client
    without data takes none); FedSGD one step per client with data.
    """
    counts = [0, 1, 9, 10, 11, 25]
    got = steps_per_participation(_stub_sim(counts, "fedavg", 3, 10))
    expected = [3 * int(np.ceil(c / 10)) for c in counts]  # [0, 3, 3, 3, 6, 9]
    np.testing.assert_array_equal(got, expected)


def test_fedsgd_clients_without_data_take_no_step():
    """Kills ``np.ones_like(counts)`` in the FedSGD branch of ``steps_per_participation``.

    Reference: FedSGD takes one step per round on the whole local data, none
    for a client that holds no example (000 §4, one channel use per step).
    """
    got = steps_per_participation(_stub_sim([0, 3, 0, 50], "fedsgd", 5, 50))
    np.testing.assert_array_equal(got, [0, 1, 0, 1])


def test_ledger_of_chained_channels_uses_the_smallest_kappa():
    """Kills ``kappa = max(...)`` in ``simulation_ledger``.

    Reference (000 Eq 16, data-processing inequality): channels in sequence leak
    at most the smallest capacity, here min(5, 2) = 2 nats per step; after one
    round of 4 steps the worst-case total is 4·2 = 8.
    """
    x = np.random.default_rng(2).normal(size=(30, 4))
    stats = data_statistics(x)
    sim = _stub_sim([8, 8], "fedavg", 1, 2)
    sim.defenses = {"data": natural_channel(5.0, statistics=stats),
                    "layer": parameter_channel(2.0)}
    sim.num_clients = 2
    sim.cohort = lambda r: np.array([0, 1])
    ledger = simulation_ledger(sim)
    assert isinstance(ledger, LeakageLedger)
    row = ledger(0, {})
    assert row["leakage_kappa"] == 2.0
    assert row["leakage_steps"] == 4 and row["leakage_total"] == pytest.approx(8.0)


def test_dataset_statistics_standardise_per_channel(monkeypatch):
    """Kills ``x = x - ds.mean`` (the division by the std dropped) in ``dataset_statistics``.

    Reference: ``normalize=True`` describes the inputs ``(x − mean_c)/std_c``
    (per channel c, as ``data.normalize`` does); Σ_D is their sample covariance
    (numpy ``np.cov``, divisor N − 1).
    """
    import fedsim.data

    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (50, 2, 2, 2)).astype(np.float32)
    mean = np.array([0.3, 0.6], np.float32)
    std = np.array([0.5, 2.0], np.float32)
    ds = fedsim.data.Dataset("stub", x, np.zeros(50, np.int32), x[:2], np.zeros(2, np.int32),
                             2, mean, std)
    monkeypatch.setattr(fedsim.data, "load_dataset", lambda *a, **k: ds)
    dataset_statistics.cache_clear()
    try:
        st = dataset_statistics("stub_dataset", 2, normalize=True)
    finally:
        dataset_statistics.cache_clear()
    z = ((x.astype(np.float64) - mean) / std).reshape(50, -1)
    np.testing.assert_allclose(st.covariance, np.cov(z, rowvar=False), rtol=1e-5, atol=1e-7)
