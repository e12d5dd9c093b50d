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

import jax
import numpy as np

from fedsim.config import ConfigError


class DistributedError(ConfigError):
    """Bad multi-process arguments, or a setting that cannot run across processes."""


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
    """Join this process to a multi-process JAX run (``jax.distributed.initialize``).

    Call before anything touches a JAX device. With none of the arguments, JAX
    detects the cluster from its environment (SLURM, Open MPI, Kubernetes, ...).

    Args:
      coordinator: ``HOST:PORT`` of process 0, which serves the coordination.
      num_processes: how many processes run the simulation.
      process_id: this process's index, in ``[0, num_processes)``.

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
    try:
        jax.distributed.initialize(coordinator, num_processes, process_id)
    except Exception as e:  # JAX's own message says what failed (address, timeout, ...)
        raise DistributedError(f"jax.distributed.initialize failed: {type(e).__name__}: "
                               f"{str(e)[:300]}") from None


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


def initialize_from_args(args: argparse.Namespace) -> None:
    """:func:`initialize` where :func:`add_arguments`' flags ask for it (else nothing)."""
    explicit = (args.coordinator, args.num_processes, args.process_id)
    if args.distributed or any(a is not None for a in explicit):
        initialize(*explicit)
