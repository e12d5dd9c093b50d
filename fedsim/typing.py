"""Core types shared by the engine, the defenses and the attacks.

Shapes use C = clients in a cohort, N = clients in the federation,
n_max = padded examples per client, and ``...`` for the example shape
(H, W, channels for images).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

PyTree = Any
Params = PyTree
Updates = PyTree
PRNGKey = jax.Array  # a typed key from jax.random.key
ApplyFn = Callable[..., jax.Array]  # (params, x) -> logits


class CohortData(NamedTuple):
    """Padded client data. Works for one client (no leading C) or a cohort.

    Attributes:
      x: float32 [C, n_max, ...] inputs, zero where ``mask`` is 0.
      y: int32 [C, n_max] labels, 0 where ``mask`` is 0.
      mask: float32 [C, n_max], 1 for real examples, 0 for padding.
      n: int32 [C], number of real examples (``mask.sum(-1)``).
    """

    x: jax.Array
    y: jax.Array
    mask: jax.Array
    n: jax.Array


class ServerState(NamedTuple):
    """Everything the server carries from one round to the next.

    Attributes:
      params: global model parameters.
      opt_state: server optimizer state (optax).
      round: int32 scalar, rounds completed so far.
      client_states: per-client defense states stacked over all N clients
        (leaves [N, ...]); ``()`` when every defense is stateless.
      mask: pruned FL whose global mask changes during training
        (``pruning.reconfigurations`` > 1): the current mask, a pytree like
        ``params`` of float32 {0, 1}, carried so that a resumed run goes on
        with it; ``()`` otherwise (a fixed mask follows from the config).
    """

    params: Params
    opt_state: PyTree
    round: jax.Array
    client_states: PyTree
    mask: PyTree = ()


class ClientOutput(NamedTuple):
    """What one client's local training returns.

    Attributes:
      update: the upload the server receives, Δ = w_local − w_global after
        the upload-stage defenses (same structure as params).
      client_state: the client's new defense state.
      loss: float32 scalar, mean training loss over the client's local steps.
      num_examples: float32 scalar, the aggregation weight (real examples).
    """

    update: Updates
    client_state: PyTree
    loss: jax.Array
    num_examples: jax.Array


class Observation(NamedTuple):
    """Exactly what an honest-but-curious server sees of one client's upload.

    Attacks receive this object and nothing else from the simulation; optional
    fields are ``None`` unless the threat model (the attack config) grants them.

    Attributes:
      update: the uploaded update Δ (w_local − w_global, after defenses).
      params: the global parameters the client started from this round.
      apply_fn: ``apply_fn(params, x) -> logits`` of the model.
      algorithm: "fedsgd" (Δ = −lr·∇L on the full local batch) or "fedavg".
      lr: client learning rate (known to the server: it sets it).
      local_steps: number of local optimizer steps taken, or None.
      batch_size: local batch size, or None if not granted.
      num_examples: number of client examples, or None if not granted.
      labels: the client's true labels, or None if not granted.
      input_shape: shape of one input example (e.g. (16, 16, 1)).
      num_classes: number of output classes.
      client_id: which client produced the upload.
      round: the round the upload belongs to.
    """

    update: Updates
    params: Params
    apply_fn: ApplyFn
    algorithm: str
    lr: float
    local_steps: int | None
    batch_size: int | None
    num_examples: int | None
    labels: jax.Array | None
    input_shape: tuple[int, ...]
    num_classes: int
    client_id: int = -1
    round: int = -1
