"""Multi-device cohorts: a ``jax.sharding.Mesh`` with a ``clients`` axis.

The ``sharded`` strategy splits a round's cohort over the mesh's devices with
``jax.shard_map``: each device scans over its own clients (one client's update
in memory at a time, like the ``map`` strategy), accumulating the weighted sum
Σ w_c Δ_c; the per-device sums are combined by one ``psum`` over ``clients``.
The global parameters and the dataset are replicated; per-client outputs
(loss, weight, finiteness, new defense states) come back sharded on
``clients``. The per-client function itself knows nothing about devices.

Pitfall handled here (see the machine facts): with shard_map's
varying-manual-axes check on, differentiating through the replicated
(device-invariant) parameters implicitly sums the local gradients across
devices unless they are ``pcast`` to varying, and the client code's
``lax.cond`` branches would then need matching varying types. The client code
is device-agnostic, so we run the body with ``check_vma=False``: every value
is per-device, gradients stay local, and the only cross-device communication
is the explicit ``psum`` of the weighted sums (checked against the
single-device ``map`` strategy in tests/fedsim/test_sharding.py).

Multi-host: call :func:`fedsim.distributed.initialize` (``fedsim run
--coordinator ...``) in every process before building the
:class:`~fedsim.simulation.Simulation`; ``jax.devices()`` then lists the devices
of all hosts and :func:`client_mesh` spans them (see :mod:`fedsim.distributed`
and docs/scale.md, "Several processes").
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fedsim.server import add_weight, zero_total

CLIENTS = "clients"


def client_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh over ``devices`` (default: all devices) named ``clients``."""
    devices = list(devices) if devices is not None else jax.devices()
    if not devices:
        raise ValueError("client_mesh: no devices")
    return Mesh(np.array(devices), (CLIENTS,))


def replicate(mesh: Mesh, arrays):
    """Place ``arrays`` (a pytree) fully replicated on every device of ``mesh``."""
    return jax.device_put(arrays, NamedSharding(mesh, P()))


def sharded_cohort_step(run_client: Callable, finish: Callable, mesh: Mesh,
                        aggregation: str = "mean") -> Callable:
    """The ``sharded`` strategy's cohort step (to be jitted by the caller).

    Args:
      run_client: ``(params, gmask, x_all, y_all, idx_all, cid, cstate, ckey) ->
        (ClientOutput, finite)`` for one client (weights already zeroed for
        non-finite clients); ``gmask`` is the global pruning mask (``()`` without).
      finish: ``(state, wsum, wtot, ids, new_client_states) -> ServerState``.
      mesh: a mesh with a ``clients`` axis.
      aggregation: ``"mean"`` or ``"sender_mean"`` (:func:`fedsim.server.zero_total`).

    Returns:
      ``step(state, gmask, x_all, y_all, idx_all, ids, ckey) -> (new_state, losses,
      weights, finite)`` with the same contract as the single-device steps.
    """
    n_dev = mesh.shape[CLIENTS]

    def local(params, gmask, x_all, y_all, idx_all, ids, valid, cstates, ckey):
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        wtot0 = zero_total(params, aggregation)

        def body(carry, item):
            wsum, wtot = carry
            cid, ok, cs = item
            out, fin = run_client(params, gmask, x_all, y_all, idx_all, cid, cs, ckey)
            w = out.num_examples * ok
            wsum = jax.tree_util.tree_map(lambda s, u: s + w * u, wsum, out.update)
            wtot = add_weight(wtot, w, out.update, aggregation)
            return (wsum, wtot), (out._replace(update=None, num_examples=w), fin)

        (wsum, wtot), (outs, fin) = jax.lax.scan(body, (zeros, wtot0), (ids, valid, cstates))
        return jax.lax.psum(wsum, CLIENTS), jax.lax.psum(wtot, CLIENTS), outs, fin

    def step(state, gmask, x_all, y_all, idx_all, ids, ckey):
        C = ids.shape[0]
        pad = (-C) % n_dev
        ids_p = jnp.concatenate([ids, jnp.repeat(ids[:1], pad)])
        valid = (jnp.arange(C + pad) < C).astype(jnp.float32)
        cstates = jax.tree_util.tree_map(lambda s: s[ids_p], state.client_states)
        wsum, wtot, outs, fin = jax.shard_map(
            local, mesh=mesh,
            in_specs=(P(), P(), P(), P(), P(), P(CLIENTS), P(CLIENTS), P(CLIENTS), P()),
            out_specs=(P(), P(), P(CLIENTS), P(CLIENTS)),
            check_vma=False,
        )(state.params, gmask, x_all, y_all, idx_all, ids_p, valid, cstates, ckey)
        outs = jax.tree_util.tree_map(lambda a: a[:C], outs)
        new_state = finish(state, wsum, wtot, ids, outs.client_state)
        # Everything returned is replicated. Where the cohort divides evenly over
        # the devices, the per-client outputs would otherwise keep the clients
        # sharding, and across processes no process could read them (the host
        # reads losses and finiteness every round).
        everywhere = NamedSharding(mesh, P())
        return jax.lax.with_sharding_constraint(
            (new_state, outs.loss, outs.num_examples, fin[:C]), everywhere)

    return step
