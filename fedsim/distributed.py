"""Several processes (hosts) running one simulation, through ``jax.distributed``.

Every process runs the same command on the same config. After
:func:`initialize`, ``jax.devices()`` lists the devices of all processes, and
the ``sharded`` strategy's mesh (:func:`fedsim.sharding.client_mesh`) spans
them: each device trains its share of the cohort and one ``psum`` combines the
weighted sums. So every process holds the same global model after every round.

What differs between processes is what they write: only the primary process
(:func:`is_primary`, process 0) writes the run directory's files (config,
metrics, summary, plots, log), while all of them take part in checkpoint saves,
which orbax coordinates across processes. Without this, every process appended
the same rows to ``metrics.jsonl``.

Only ``sharded`` spreads a cohort over processes: any other strategy would train
the whole cohort again in every process, so :func:`check_strategy` refuses
them, and ``auto`` picks ``sharded`` without timing (each process timing on its
own could pick a different strategy, and the processes would then wait on
collectives that never come).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading

import jax
import numpy as np

from fedsim.config import ConfigError


class DistributedError(ConfigError):
    """Bad multi-process arguments, or a setting that cannot run across processes."""


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, heartbeat_timeout: int | None = None,
               join_timeout: int | None = None) -> None:
    """Join this process to a multi-process JAX run (``jax.distributed.initialize``).

    Call before anything touches a JAX device. With none of the arguments, JAX
    detects the cluster from its environment (SLURM, Open MPI, Kubernetes, ...).

    Args:
      coordinator: ``HOST:PORT`` of process 0, which serves the coordination.
      num_processes: how many processes run the simulation.
      process_id: this process's index, in ``[0, num_processes)``.
      heartbeat_timeout: seconds after which JAX's coordination service takes
        a silent process for dead and stops every other one (JAX's default,
        100 s, where None). A process that stops while the others wait for it
        in a collective is noticed only then.
      join_timeout: seconds to wait for every process to join (JAX's
        ``initialization_timeout``; its default, 300 s, where None). A process
        that was not started, or stopped before joining (a config error on its
        host), leaves the others waiting this long. JAX then aborts them with a
        C++ check failure and a stack trace; this process instead says what it
        waited for and exits with code 2 (:func:`_leave_unless_joined`).

    Raises:
      DistributedError: only some of the three given, or a bad value; or JAX
        could not connect.
    """
    given = [a is not None for a in (coordinator, num_processes, process_id)]
    if any(given) and not all(given):
        raise DistributedError("--coordinator, --num-processes and --process-id go together: "
                               "give all three, or none to let JAX detect the cluster")
    if all(given):
        host, _, port = coordinator.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise DistributedError(f"--coordinator: expected HOST:PORT, got {coordinator!r}")
        if num_processes < 1:
            raise DistributedError(f"--num-processes: must be at least 1, got {num_processes}")
        if not 0 <= process_id < num_processes:
            raise DistributedError(f"--process-id: must lie in [0, {num_processes}), "
                                   f"got {process_id}")
    for flag, value in (("--heartbeat-timeout", heartbeat_timeout),
                        ("--join-timeout", join_timeout)):
        if value is not None and value < 1:
            raise DistributedError(f"{flag}: must be at least 1 s, got {value}")
    extra = {} if heartbeat_timeout is None else {"heartbeat_timeout_seconds": heartbeat_timeout}
    wait = JAX_JOIN_TIMEOUT_S if join_timeout is None else join_timeout
    where = f"at {coordinator}" if coordinator else "through the cluster's environment"
    me = "" if process_id is None else f"process {process_id} of {num_processes}: "
    done = threading.Event()
    watch = threading.Timer(wait + JOIN_GRACE_S, _leave_unless_joined, (done, (
        f"fedsim: error: {me}not every process joined the run {where} within {wait} s "
        "(--join-timeout): one was not started, stopped before joining (its own output "
        "says why, e.g. a config error), or cannot reach the coordinator; stopping this "
        "process too")))
    watch.daemon = True
    watch.start()
    try:
        jax.distributed.initialize(coordinator, num_processes, process_id,
                                   initialization_timeout=wait, **extra)
    except Exception as e:  # JAX's own message says what failed (address, timeout, ...)
        raise DistributedError(f"jax.distributed.initialize failed: {type(e).__name__}: "
                               f"{str(e)[:300]}") from None
    finally:
        done.set()
        watch.cancel()


#: JAX's own default for ``jax.distributed.initialize(initialization_timeout=...)``.
JAX_JOIN_TIMEOUT_S = 300
#: How long after the join deadline :func:`_leave_unless_joined` fires. JAX can no
#: longer join then; it aborts the process itself some seconds later (about 5 s
#: after the deadline here, jax 0.10 on CPU), with a stack trace that names no
#: cause, so the message has to come first.
JOIN_GRACE_S = 1.0


def _leave_unless_joined(done: threading.Event, message: str) -> None:
    """Print ``message`` and end the process, unless ``jax.distributed.initialize``
    has returned (``done``; :func:`joined` cannot tell: JAX sets its client
    before the client has connected)."""
    if done.is_set():
        return
    print(message, file=sys.stderr, flush=True)
    leave(2)


def joined() -> bool:
    """Whether this process joined a multi-process run (:func:`initialize`).

    Unlike :func:`process_count`, it starts no JAX backend.
    """
    from jax._src import distributed as jax_distributed  # no public query

    return jax_distributed.global_state.client is not None


def process_count() -> int:
    """How many processes run the simulation (1 without :func:`initialize`)."""
    return jax.process_count()


def is_primary() -> bool:
    """Whether this process writes the run directory (process 0)."""
    return jax.process_index() == 0


def agree(flag: bool) -> bool:
    """Process 0's ``flag``, in every process (``flag`` itself in a single process).

    For decisions every process must make alike although each reads them from
    its own view, such as whether a sweep cell is already done: a process that
    saw another file system state would otherwise skip a run the others train.
    """
    if process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.asarray(bool(flag))))


class PeerFailure(DistributedError):
    """The processes of one run no longer move in step: some failed where others did not.

    A process that failed alone has left the step's collectives, and the others
    may still wait in one for it; JAX's shutdown barrier would then wait (up to
    five minutes) for processes that cannot reach it. So the command line ends
    a joined process at once after an error (:func:`leave`).
    """


# How long a process that failed a step waits for the others' outcomes. A
# failure every process shares (a NaN in the replicated model, a bad value)
# reaches all of them within moments of each other, because they meet in a
# collective every round; a process still silent after this is waiting in a
# collective for the one that failed.
PEER_WAIT_AFTER_FAILURE_S = 60.0
# How long a process that finished a step waits for the others' outcomes
# (process 0 may still be writing the step's files).
PEER_WAIT_S = 600.0
_steps = 0  # every process checks the same steps in the same order


def _client():
    # The coordination service's key-value store, not a collective: a process
    # that failed a step must not join a collective that a process still inside
    # the step would take for one of the step's own.
    from jax._src import distributed as jax_distributed  # no public key-value API

    client = jax_distributed.global_state.client
    if client is None:
        raise DistributedError("several processes but no jax.distributed client: "
                               "join the run with fedsim.distributed.initialize first")
    return client


def check_in_step(step: str, error: str | None, key: str | None = None) -> None:
    """Stop every process whose peers ended ``step`` otherwise than it did.

    Every process publishes its outcome of ``step`` (``error`` is None for
    success, else a one-line message) and reads every other process's. When
    all succeeded, or all failed with the same message (a failure they share,
    after which the next step's collectives still line up), it returns. In a
    single process it returns at once.

    Args:
      step: what the processes did, for the messages.
      error: None where this process succeeded, else a one-line message.
      key: the step's key in the store; by default the steps are numbered, the
        same in every process as long as all of them check the same steps.

    Raises:
      PeerFailure: another outcome (naming each process's), or a process that
        did not report within :data:`PEER_WAIT_AFTER_FAILURE_S` (this one
        failed) or :data:`PEER_WAIT_S` (this one succeeded).
    """
    global _steps
    from jax._src import distributed as jax_distributed  # starts no backend, unlike jax.*

    n = jax_distributed.global_state.num_processes if joined() else 1
    if n == 1:
        return
    if key is None:
        _steps += 1
    client = _client()
    me = jax_distributed.global_state.process_id
    prefix = f"fedsim/{key or f'step{_steps}'}/"
    mine = "ok" if error is None else "failed: " + error
    try:
        client.key_value_set(prefix + str(me), mine)
    except Exception as e:  # the service runs in process 0, which may have left
        raise PeerFailure(f"{step}: this process ended it with {mine!r} but could not reach "
                          f"the coordination service ({type(e).__name__}: {str(e)[:200]}); "
                          "process 0 has most likely stopped") from None
    wait_ms = int(1000 * (PEER_WAIT_S if error is None else PEER_WAIT_AFTER_FAILURE_S))
    outcomes, silent = {}, []
    for i in range(n):
        if i == me:
            outcomes[i] = mine
            continue
        try:
            outcomes[i] = client.blocking_key_value_get(prefix + str(i), wait_ms)
        except Exception:  # JAX raises its own error type on a timeout
            silent.append(i)
    said = "; ".join(f"process {i}: {o}" for i, o in outcomes.items() if o != "ok")
    if silent:
        raise PeerFailure(
            f"{step}: process(es) {silent} did not report within {wait_ms / 1000:.0f} s, "
            f"most likely waiting in a collective for a process that failed ({said}); "
            "stopping this process to free them")
    if len(set(outcomes.values())) > 1:
        # A process that failed alone left this step's collectives: the
        # processes cannot go on together, and one of them may have left already.
        raise PeerFailure(f"{step} ended differently in the processes ({said}); "
                          "they can no longer go on together")


def leave(code: int) -> None:
    """End this process now, skipping JAX's shutdown barrier (after an error, several processes).

    The barrier waits for every process (up to five minutes), and the
    processes a failed one strands cannot reach it; a process's exit also
    closes its connections, which ends the collectives the others wait in.
    """
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def check_strategy(strategy: str) -> str | None:
    """The strategy to use across processes, or None in a single process.

    Returns:
      ``"sharded"`` for ``sharded`` or ``auto`` when several processes run.

    Raises:
      DistributedError: another fixed strategy with several processes.
    """
    n = process_count()
    if n == 1:
        return None
    if strategy in ("sharded", "auto"):
        return "sharded"
    raise DistributedError(
        f"training.client_parallelism={strategy} trains the whole cohort in each of the {n} "
        "processes: use sharded (or auto, which picks it), whose mesh spans every process's "
        "devices")


def config_digest(cfg) -> str:
    """A hash of everything in ``cfg`` but ``output.*`` (where and how to write)."""
    d = cfg.to_dict()
    d.pop("output", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


def check_same_config(cfg) -> None:
    """Stop every process if their configs differ (outside ``output.*``).

    Processes launched with different configs (another seed, another
    ``--set``) would each train their own cohort and still sum their updates,
    or wait on each other's collectives forever. Every process gathers every
    process's :func:`config_digest`, so all of them raise together.

    Raises:
      DistributedError: naming the processes whose config differs from process 0's.
    """
    if process_count() == 1:
        return
    from jax.experimental import multihost_utils

    mine = np.frombuffer(bytes.fromhex(config_digest(cfg)), np.uint8)
    every = np.asarray(multihost_utils.process_allgather(mine))  # [processes, 32]
    differ = [i for i in range(len(every)) if not np.array_equal(every[i], every[0])]
    if differ:
        raise DistributedError(
            f"process(es) {differ} run a config that differs from process 0's (outside "
            "output.*): start every process with the same config file and --set overrides")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command-line flags that join a multi-process run (``fedsim run``, ``fedsim attack``,
    ``fedsim sweep``)."""
    g = parser.add_argument_group(
        "several processes (hosts)",
        "run the same command in every process; the sharded strategy's mesh then spans all "
        "their devices, and only process 0 writes the run directory (docs/scale.md)")
    g.add_argument("--distributed", action="store_true",
                   help="join a multi-process run; alone, JAX detects the cluster "
                        "(SLURM, Open MPI, ...)")
    g.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address")
    g.add_argument("--num-processes", type=int, metavar="N", help="how many processes")
    g.add_argument("--process-id", type=int, metavar="I", help="this process, in [0, N)")
    g.add_argument("--heartbeat-timeout", type=int, metavar="S",
                   help="seconds of silence after which a process counts as dead and the "
                        "others stop (JAX's default: 100)")
    g.add_argument("--join-timeout", type=int, metavar="S",
                   help="seconds to wait for every process to join before stopping with an "
                        f"error (JAX's default: {JAX_JOIN_TIMEOUT_S})")


def initialize_from_args(args: argparse.Namespace) -> None:
    """:func:`initialize` where :func:`add_arguments`' flags ask for it (else nothing)."""
    explicit = (args.coordinator, args.num_processes, args.process_id)
    if args.distributed or any(a is not None for a in explicit):
        initialize(*explicit, heartbeat_timeout=args.heartbeat_timeout,
                   join_timeout=args.join_timeout)
        return
    for flag, value in (("--heartbeat-timeout", args.heartbeat_timeout),
                        ("--join-timeout", args.join_timeout)):
        if value is not None:
            raise DistributedError(f"{flag}: only for a multi-process run "
                                   "(--distributed or --coordinator)")
