"""The attack interface: ``run(observation, config, key) -> Reconstruction``.

An attack is a pure function of exactly what its threat model gives the
server (a :class:`fedsim.typing.Observation`, stripped with
:func:`fedsim.observer.restrict`), a config mapping of hyper-parameters, and a
key. Attacks live in :data:`ATTACK_REGISTRY`, looked up by name.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import jax

from attacks.labels import checked_lr
from fedsim.suggest import did_you_mean
from fedsim.typing import Observation, PRNGKey


class Reconstruction(NamedTuple):
    """An attack's output for one victim.

    Attributes:
      x: float32 [B, ...] reconstructed inputs (best restart).
      labels: int32 [B] reconstructed/inferred labels.
      loss: float32 scalar, the attack objective of the returned restart.
      extras: attack-specific outputs (e.g. all restarts' losses).
    """

    x: jax.Array
    labels: jax.Array
    loss: jax.Array
    extras: Any = None


AttackFn = Callable[[Observation, Mapping[str, Any], PRNGKey], Reconstruction]
ATTACK_REGISTRY: dict[str, AttackFn] = {}


def register_attack(name: str):
    """Decorator registering an attack ``run`` function under ``name``."""

    def deco(fn: AttackFn) -> AttackFn:
        if name in ATTACK_REGISTRY and ATTACK_REGISTRY[name] is not fn:
            raise ValueError(f"attack {name!r} registered twice")
        ATTACK_REGISTRY[name] = fn
        return fn

    return deco


def listing() -> list[tuple[str, str]]:
    """``fedsim list``'s attacks section (the ``fedsim.listings`` entry point): each
    registered attack's name with its ``attack.config`` keys and their defaults
    (``run.config_keys``, where the attack gives them), and the first line of its
    docstring."""
    def entry(name, fn):
        keys = getattr(fn, "config_keys", None)
        shown = name if keys is None else (
            f"{name}({', '.join(f'{k}={v!r}' for k, v in keys.items())})")
        return shown, (fn.__doc__ or "").strip().split("\n")[0]

    return [entry(name, fn) for name, fn in sorted(ATTACK_REGISTRY.items())]


def run_attack(name: str, observation: Observation, config: Mapping[str, Any] | None,
               key: PRNGKey) -> Reconstruction:
    """Run the registered attack ``name``.

    Raises:
      ValueError: for an unknown attack name (listing the known ones).
    """
    if not isinstance(name, str) or name not in ATTACK_REGISTRY:
        raise ValueError(f"unknown attack {name!r}; known attacks: "
                         f"{', '.join(sorted(ATTACK_REGISTRY))}{did_you_mean(name, ATTACK_REGISTRY)}")
    return ATTACK_REGISTRY[name](observation, dict(config or {}), key)


def observation_from_gradient(gradient, params, apply_fn, *, input_shape, num_classes: int,
                              lr: float = 1.0, labels=None, batch_size: int | None = None
                              ) -> Observation:
    """A FedSGD :class:`Observation` for a gradient the user computed themselves.

    The update is Δ = −lr·gradient (the FedSGD upload). ``labels`` and
    ``batch_size`` are granted only if given.

    Raises:
      ValueError: when ``lr`` is not a finite number > 0.
    """
    checked_lr(lr)
    update = jax.tree_util.tree_map(lambda g: -lr * g, gradient)
    return Observation(update=update, params=params, apply_fn=apply_fn, algorithm="fedsgd",
                       lr=lr, local_steps=1, batch_size=batch_size, num_examples=batch_size,
                       labels=labels, input_shape=tuple(input_shape), num_classes=num_classes)
