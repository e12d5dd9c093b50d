"""Record-level accountant: VMF composition per step and a chosen δ over a checkpoint's.

Both tests drive :class:`defenses.dp.accountant_hook.PrivacyAccountant` through a
stand-in simulation (client sizes, training settings and a cohort function are
all the accountant reads), so no model is trained and the expected numbers are
written out from the module docstring's accounting rule:

    q_c = min(1, B / n_c),  T_c = local_epochs · ⌈n_c / B⌉ · (rounds the client took part in),
    ε = max_c ε(q_c, T_c)  (worst client, reported with its id).
"""

import math
from types import SimpleNamespace

import pytest

from defenses.accounting import gaussian_epsilon, vmf_epsilon
from defenses.dp._params import DPParameters
from defenses.dp.accountant_hook import PrivacyAccountant


def _sim(counts, cohorts, *, epochs=2, batch=16):
    """The attributes of a Simulation that PrivacyAccountant reads, and nothing else."""
    return SimpleNamespace(
        client_counts=list(counts), num_clients=len(counts),
        cfg=SimpleNamespace(training=SimpleNamespace(algorithm="fedavg", local_epochs=epochs)),
        settings=SimpleNamespace(effective_batch=batch),
        cohort=lambda r: cohorts[r])


def test_vmf_epsilon_composes_every_local_step_of_every_round():
    """VMF noise is accounted per DP-SGD step, as the Gaussian is.

    Kills the mutation of ``accountant_hook._epsilon_fn`` that passes ``steps=1``
    to ``vmf_epsilon`` (one composition per client instead of T_c): ε of client
    0 would drop from ≈13.4 to ≈3.7. Reference: the module docstring's T_c =
    local_epochs · ⌈n_c/B⌉ · participations and q_c = B/n_c (Abadi et al. 2016
    per-step composition), evaluated here by hand and passed to the VMF
    accountant of 001 §III-A (tested against 001 Table I elsewhere).
    """
    counts, batch, epochs = [40, 100], 16, 2
    # Rounds 0 and 2 take both clients, round 1 only client 1: 2 and 3 participations.
    cohorts = {0: [0, 1], 1: [1], 2: [0, 1]}
    kappa, dim, delta = 5.0, 50, 1e-3
    acc = PrivacyAccountant(_sim(counts, cohorts, epochs=epochs, batch=batch),
                            DPParameters("vmf", kappa=kappa), dim, delta, True)
    row = acc(2, {})
    participations = [2, 3]
    expected = []
    for n_c, k in zip(counts, participations):
        steps = epochs * math.ceil(n_c / batch) * k  # 2·3·2 = 12 and 2·7·3 = 42
        expected.append(vmf_epsilon(kappa, dim, min(1.0, batch / n_c), delta,
                                    steps=steps).epsilon)
    worst = max(range(2), key=lambda c: expected[c])
    assert row["dp_mechanism"] == "vmf" and row["delta"] == delta
    assert row["epsilon"] == pytest.approx(expected[worst], rel=1e-9)
    assert row["epsilon_client"] == worst


@pytest.mark.parametrize("given", [True, False])
def test_a_chosen_delta_is_kept_over_the_checkpoints_and_a_default_one_is_not(given):
    """A δ the caller chose survives ``load_state_dict``; a default δ takes the checkpoint's.

    Kills the mutation of ``_participations.ParticipationAccountant.load_state_dict``
    that drops ``not self.delta_given`` (a resumed run would then report ε at the
    checkpoint's δ although this process asked for another). Reference: the
    documented contract ("a chosen δ is kept over a checkpoint's",
    ``ParticipationAccountant`` / ``attach_accountant``), and ε recomputed at the
    δ that should hold with the docstring's q_c, T_c.
    """
    counts, cohorts, sigma = [64], {0: [0], 1: [0], 2: [0]}, 1.3
    params = DPParameters("gauss", noise_multiplier=sigma)
    saved = PrivacyAccountant(_sim(counts, cohorts), params, 10, 1e-2, False)
    saved(1, {})
    state = saved.state_dict()
    assert state["delta"] == 1e-2

    mine = 1e-4 if given else 1.0 / 64
    acc = PrivacyAccountant(_sim(counts, cohorts), params, 10, mine, given)
    acc.load_state_dict(state)
    row = acc(2, {})
    want = mine if given else 1e-2
    assert acc.delta == want and row["delta"] == want
    steps = 2 * math.ceil(64 / 16) * 3
    ref = gaussian_epsilon(sigma, min(1.0, 16 / 64), want, steps=steps).epsilon
    assert row["epsilon"] == pytest.approx(ref, rel=1e-12)


def test_two_local_dp_noises_in_one_upload_chain_give_no_single_guarantee():
    """A chain holding two local-level mechanisms reports no ε (which one bounds the
    upload depends on their order, which the accountant does not model).

    Kills the mutation of ``_params.dp_parameters`` ``len(found) != 1`` →
    ``len(found) < 1``: the first of the two guarantees (σ = 1 here) would be
    returned, and ``attach_local_accountant`` would report its ε for a chain
    it does not describe. Reference: the documented contract of
    ``dp_parameters`` / ``unreported_reason`` ("None also where the defense (a
    chain) lists several at that level").
    """
    from defenses.dp import dp_parameters, update_gaussian, update_laplace
    from defenses.dp._params import dp_guarantees, unreported_reason
    from fedsim.hooks import chain

    both = chain(update_gaussian(1.0, clip_norm=1.0), update_laplace(2.0, clip_norm=1.0))
    found = dp_guarantees(both, "local")
    assert [g.mechanism for g, _ in found] == ["gauss", "laplace"]
    assert dp_parameters(both, level="local") is None
    assert "several local-level" in unreported_reason(both, "local")
    one = chain(update_gaussian(1.0, clip_norm=1.0))
    assert dp_parameters(one, level="local") == found[0][0]
