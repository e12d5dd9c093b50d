"""FedAvg-aware inversion: match a multi-step local update, not one gradient.

Implements Geiping et al. (NeurIPS 2020) §4 "multiple local steps" (also the
setting of Dimitrov et al. 2022, "Data Leakage in Federated Averaging"): the
observation is Δ = w_S − w_0 after S local SGD steps on mini-batches of B out of
the client's n examples at learning rate lr. The attack optimises n dummy
examples so that *unrolling the same local training on them* (a ``lax.scan``
of S SGD steps, differentiated end to end) gives an update whose cosine
similarity with Δ is maximal, + TV prior, signed Adam, box constraint,
restarts.

Threat model: n, B, S come from the granted ``num_examples`` /
``batch_size`` / ``local_steps`` or the attacker's config (``num_examples``,
``local_batch``, ``local_steps``); lr is always known (the server sets it).
Labels: granted, or inferred by count-based inference from −Δ/(lr·S).

Deviations: the client optimizer is assumed to be plain SGD (Δ of momentum or
Adam clients is matched approximately); the dummy examples are visited in a
fixed order (the true shuffle is unknown and, for exchangeable dummies, a
fixed order loses nothing for one epoch; for E > 1 epochs the re-shuffle is
not modelled, as in Geiping et al.). Guarantee: none (heuristic attack).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from attacks.api import Reconstruction, register_attack
from attacks.gradient_inversion import (AttackConfigError, config_keys, inversion_config,
                                        refuse_unknown_keys, run_inversion)
from fedsim.typing import Observation

DEFAULTS = {"loss": "cosine", "tv": 1e-6, "optimizer": "adam", "lr": 0.1, "iterations": 1000,
            "restarts": 1, "signed": True, "decay": True, "box": True, "init": "uniform",
            "label_mode": "infer", "num_examples": None, "local_batch": None, "local_steps": None}


def _resolve(obs: Observation, config: Mapping[str, Any], key: str, field: str) -> int:
    val = config.get(key)
    if val is None:
        val = getattr(obs, field)
    if val is None:
        raise AttackConfigError(_needs(field, key))
    return int(val)


#: The victim's local training: config key -> the Observation field granting it.
_TRAINING_KEYS = {"num_examples": "num_examples", "local_batch": "batch_size",
                  "local_steps": "local_steps"}


def _needs(field: str, key: str) -> str:
    return (f"fedavg_inversion needs the victim's {field}: grant '{field}' in the threat "
            f"model (attack.grants) or set attack.config.{key}")


def check_config(config: Mapping[str, Any], grants: Mapping[str, bool] | None = None) -> None:
    """Raise :class:`~attacks.gradient_inversion.AttackConfigError` for a bad
    ``config``, or one the threat model's ``grants`` (where given) leave short,
    before any victim is observed (``fedsim attack`` calls it first)."""
    refuse_unknown_keys(config, run.config_keys)  # all of them, the training keys too
    for k in _TRAINING_KEYS:
        v = config.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise AttackConfigError(f"attack.config.{k}: must be a positive integer (or absent, "
                                    f"to take the granted value), got {v!r}")
    inversion_config({k: v for k, v in config.items() if k not in _TRAINING_KEYS},
                     {k: v for k, v in DEFAULTS.items() if k not in _TRAINING_KEYS})
    for k, field in _TRAINING_KEYS.items():
        if config.get(k) is None and grants is not None and not grants.get(field):
            raise AttackConfigError(_needs(field, k))


def run_many(observations: Sequence[Observation], config: Mapping[str, Any], key
             ) -> list[Reconstruction]:
    """Attack several FedAvg uploads at once (one vmapped, jitted loop).

    ``key``: one for the call, or one per victim (then victim i gets what it
    gets alone with ``key[i]``; :func:`attacks.gradient_inversion.victim_keys`).
    """
    check_config(config)
    if not observations:
        raise AttackConfigError("no observations to attack")
    first = observations[0]
    n = _resolve(first, config, "num_examples", "num_examples")
    b = _resolve(first, config, "local_batch", "batch_size")
    s = _resolve(first, config, "local_steps", "local_steps")
    for o in observations[1:]:
        if (_resolve(o, config, "num_examples", "num_examples"), _resolve(o, config, "local_batch", "batch_size"),
                _resolve(o, config, "local_steps", "local_steps"), o.lr) != (n, b, s, first.lr):
            raise AttackConfigError("victims attacked together need the same n, B, S and lr")
    # The resolved S goes into the observations: label inference reads the mean
    # step's gradient −Δ/(lr·S) off them, and its count rule is not scale-free.
    observations = [o._replace(local_steps=s) for o in observations]
    conf = {k: v for k, v in config.items() if k not in _TRAINING_KEYS}
    conf["batch_size"] = n
    defaults = {k: v for k, v in DEFAULTS.items() if k not in _TRAINING_KEYS}
    return run_inversion(observations, conf, key, defaults, target_fn=lambda o: o.update,
                         cfg_overrides={"simulate": "fedavg", "local_steps": s, "local_batch": b,
                                        "local_lr": float(first.lr)})


@register_attack("fedavg_inversion")
def run(observation: Observation, config: Mapping[str, Any], key) -> Reconstruction:
    """FedAvg-aware inversion against one victim's multi-step update."""
    return run_many([observation], config, key)[0]


run.run_many = run_many
run.check_config = check_config
run.config_keys = config_keys(DEFAULTS)
