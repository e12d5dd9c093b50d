"""Will a cohort step fit in memory? XLA's estimate against what is free.

``client_parallelism: auto`` times its candidates on at most
:data:`fedsim.calibrate.COHORT_CALIBRATION_CLIENTS` clients, but vmap's memory
grows with the cohort: on the 2-core CPU vmap's step plans 5.07 GiB for 1,000
LeNet-5 clients against 0.08 GiB for 16
(``benchmarks/results/cohort_step_memory.md``), and on an H200 it peaked at
13,252 MiB at 5,000 (docs/scale.md, "On a GPU"). A strategy that wins on 256
clients can then fail on the real cohort, and on a CPU an out-of-memory
process is killed by the kernel without an error. So before ``auto`` commits
to a strategy it has not run on the whole cohort, it compiles that strategy's
cohort step for the real cohort ahead of time (compiled, not run) and compares
XLA's buffer assignment (:func:`cohort_step_bytes`) with the memory free now
(:func:`available_bytes`). On this CPU a warm round's resident memory grew by
0.96–1.15× the plan for the single-device strategies
(``benchmarks/results/cohort_step_memory.md``); :data:`HEADROOM` leaves 1.25×.
``sharded`` on forced CPU devices grew by more than its (small) plan: a warm
round 3–18× at 250–4,000 LeNet-5 clients, ~2× with ``MALLOC_ARENA_MAX=1``
(glibc's per-thread arenas), and round 0 with the cohort even then; its check
is a lower bound there (docs/scale.md, "Memory").
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fedsim import distributed
from fedsim.config import ConfigError

#: Strategies with one jitted cohort step, whose memory :func:`cohort_step_bytes` plans.
COHORT_STEP_STRATEGIES = ("vmap", "map", "chunked", "sharded")
#: Set to ``0`` to skip :func:`check_cohort_step` before a fixed strategy's first round.
CHECK_ENV = "FEDSIM_MEMORY_CHECK"
#: A cap on what fedsim counts as free, e.g. ``8G`` on a machine shared with others
#: (bytes, or with a K/M/G/T suffix, powers of 1024): :func:`available_bytes` reports
#: at most this.
LIMIT_ENV = "FEDSIM_MEMORY_LIMIT"
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

#: Share of the free memory a cohort step may plan to use: XLA's estimate covers
#: its own buffers, not the allocator's fragmentation or the host's other users.
HEADROOM = 0.8


def cohort_step_bytes(sim, clients: int) -> int | None:
    """Bytes XLA plans for one cohort step of ``sim.strategy`` on ``clients`` clients,
    out of the memory :func:`available_bytes` reports.

    The step is lowered and compiled for the cohort of round 0 truncated to
    ``clients`` (nothing runs). Counted: the step's temporaries and outputs,
    less the outputs that reuse donated inputs. Not counted: its inputs, which
    (the data, the server state) are already resident.

    ``sharded`` compiles one program per device, and XLA plans one device's
    share. Where the mesh's devices share this process's memory (forced CPU
    devices: ``--xla_force_host_platform_device_count``) that share is counted
    once per local device of the mesh, since they all run at once; an
    accelerator's devices each have their own memory, and one device's share is
    what is compared with one device's free memory. The server state is given
    replicated over the mesh, as the round passes it, so the round reuses the
    executable compiled here.

    Args:
      sim: a :class:`fedsim.simulation.Simulation` whose strategy is ``vmap``,
        ``map``, ``chunked`` or ``sharded`` (the loop's per-client step does not
        grow with the cohort).
      clients: cohort size to plan for (at most ``clients_per_round``).

    Returns:
      The bytes, or None where the backend gives no memory analysis.

    Raises:
      ValueError: the strategy has no cohort step to analyse.
    """
    if sim.strategy not in COHORT_STEP_STRATEGIES:
        raise ValueError(f"no single cohort step to analyse for strategy {sim.strategy!r}")
    sim._compile(reuse=True)
    ids = jnp.asarray(np.asarray(sim.cohort(0))[:clients])
    _, ckey = sim.round_keys(0)
    state = jax.eval_shape(sim.init_state)  # shapes only: nothing allocated
    sharing = 1
    if sim.mesh is not None:
        from jax.sharding import NamedSharding, PartitionSpec

        everywhere = NamedSharding(sim.mesh, PartitionSpec())
        state = jax.tree_util.tree_map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=everywhere), state)
        sharing = devices_sharing_memory(sim.mesh)
    with sim.numerics():
        per_device = planned_bytes(sim._cohort_step, state, sim._mask_arg(), sim._x, sim._y,
                                   sim._idx, ids, ckey)
    return None if per_device is None else sharing * per_device


def devices_sharing_memory(mesh) -> int:
    """How many of ``mesh``'s devices draw on the same memory as this process's
    first: all its local devices on a CPU (forced host devices are one host's
    memory), one on an accelerator (each device has its own)."""
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    if local and local[0].platform == "cpu":
        return len(local)
    return 1


def planned_bytes(jitted, *args) -> int | None:
    """Bytes XLA plans for one call of ``jitted`` on ``args`` (arrays or shapes).

    Compiles the call ahead of time without running it; a later call with
    arguments of the same shapes reuses that executable. Counted: temporaries
    and outputs, less outputs that reuse donated inputs; not counted: the
    inputs, which the caller already holds. None where the backend gives no
    memory analysis.
    """
    stats = jitted.lower(*args).compile().memory_analysis()
    if stats is None:
        return None
    return int(stats.temp_size_in_bytes + stats.output_size_in_bytes
               - stats.alias_size_in_bytes)


def available_bytes(device=None) -> int | None:
    """Memory free for a new computation on ``device`` (default: this process's
    first device; with several processes, ``jax.devices()[0]`` may be another
    process's, whose memory JAX does not report here).

    Accelerators: the allocator's limit less what is in use
    (``Device.memory_stats``). CPU: the smaller of the kernel's ``MemAvailable``
    and the headroom under the process's cgroup limit (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), since a container's limit is not in
    ``/proc/meminfo``. Either capped by ``$FEDSIM_MEMORY_LIMIT``
    (:func:`memory_limit`). None where nothing is known.
    """
    device = device or jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        free = int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    else:
        free = host_available_bytes()
    cap = memory_limit()
    if cap is None:
        return free
    return cap if free is None else min(free, cap)


def memory_limit() -> int | None:
    """``$FEDSIM_MEMORY_LIMIT`` in bytes (None where unset).

    Raises:
      ValueError: the value is not a positive size such as ``8G`` or ``500M``.
    """
    text = os.environ.get(LIMIT_ENV, "").strip()
    if not text:
        return None
    number, unit = text.upper().rstrip("IB") or "", ""
    if number and number[-1] in _UNITS:
        number, unit = number[:-1], number[-1]
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ValueError(f"environment variable {LIMIT_ENV} must be a positive size such as "
                         f"8G or 500M, got {text!r}")
    return int(value)


def host_available_bytes(root: str = "/") -> int | None:
    """The host's free memory under ``root`` (a test can point it at fake files)."""
    base = Path(root)
    found = []
    try:
        for line in (base / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current"),
                         ("sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            cap = (base / limit).read_text().strip()
            if cap == "max":  # cgroup v2: no limit
                continue
            found.append(int(cap) - int((base / usage).read_text().strip()))
        except (OSError, ValueError):
            continue
    if not found:
        return None
    return max(min(found), 0)


def gib(n: int) -> str:
    """``n`` bytes as GiB with two decimals, for messages."""
    return f"{n / 2**30:.2f} GiB"


def fits(need: int | None, free: int | None, headroom: float = HEADROOM) -> bool:
    """Whether ``need`` bytes fit in ``headroom`` × ``free``; unknowns count as fitting."""
    return need is None or free is None or need <= headroom * free



class InsufficientMemoryError(ConfigError):
    """A cohort step plans more memory than is free: the round would run out."""


def record_plan(sim, clients: int, planned: int | None, free: int | None) -> None:
    """Keep what a check planned on ``sim.memory_plan`` (strategy, clients, planned
    and free bytes), so that benchmarks can report it beside measured peaks."""
    sim.memory_plan = {"strategy": sim.strategy, "clients": clients,
                       "planned_bytes": planned, "free_bytes": free}


def check_enabled() -> bool:
    """Whether ``$FEDSIM_MEMORY_CHECK`` (default ``1``) asks for :func:`check_cohort_step`.

    Raises:
      ValueError: the variable is neither ``0`` nor ``1``, or ``$FEDSIM_MEMORY_LIMIT``
        is not a size.
    """
    flag = os.environ.get(CHECK_ENV, "1").strip()
    if flag not in ("0", "1"):
        raise ValueError(f"environment variable {CHECK_ENV} must be 0 or 1, got {flag!r}")
    memory_limit()  # named here too, before anything runs
    return flag == "1"


def check_cohort_step(sim) -> None:
    """Before a fixed strategy's first round: stop one that cannot fit, warn of a tight one.

    Plans ``sim.strategy``'s step for the real cohort (``clients_per_round``)
    with :func:`cohort_step_bytes`; the round then reuses that executable, so
    the check costs no extra compile. Skipped where ``$FEDSIM_MEMORY_CHECK`` is
    ``0`` or the backend reports neither estimate nor free memory.

    Raises:
      InsufficientMemoryError: the plan exceeds the free memory. On this CPU a
        warm round's memory grew by 0.96–1.15× the plan, so such a round would
        fail, and on a CPU the kernel kills the process with no message.
    """
    if not check_enabled():
        return
    cohort = sim.cfg.training.clients_per_round
    need, free = cohort_step_bytes(sim, cohort), available_bytes()
    record_plan(sim, cohort, need, free)
    if need is None or free is None:
        return
    per = ""
    if sim.mesh is not None:
        n = devices_sharing_memory(sim.mesh)
        per = (f" ({n} devices sharing this host's memory)" if n > 1
               else " per device")
    what = (f"training.client_parallelism={sim.strategy}: one round's cohort step for "
            f"training.clients_per_round={cohort} plans {gib(need)}{per}, {gib(free)} free")
    if need > free:
        raise InsufficientMemoryError(
            f"{what}: it would run out of memory. Use client_parallelism chunked "
            "(memory set by training.chunk_size), loop or auto, or fewer clients per round "
            f"(or set {CHECK_ENV}=0 to run anyway)")
    if not fits(need, free):
        warnings.warn(f"{what}: more than {HEADROOM:.0%} of it; the round may run out of memory",
                      RuntimeWarning, stacklevel=3)


#: Share of the kernel's ``vm.max_map_count`` from which a long-lived process
#: (a sweep, between its cells) drops JAX's compiled programs.
MAP_COUNT_RELEASE_FRACTION = 0.5
_MAX_MAP_COUNT = "/proc/sys/vm/max_map_count"


def memory_mappings() -> int | None:
    """How many memory mappings this process holds (``/proc/self/maps``; None elsewhere).

    XLA:CPU maps each compiled program's code into the process, about 9
    mappings for a small program (``benchmarks/results/diagnose_map_count``),
    and JAX keeps every program it compiled while its caches hold it. A process
    past the kernel's limit (:func:`max_map_count`) segfaults in XLA's next
    compile ("LLVM compilation error: Cannot allocate memory", then SIGSEGV,
    with the limit lowered in that script); a test-suite worker that kept all
    its programs crashed inside XLA late in a run, as fits this
    (``tests/worker_health.py``).
    """
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def max_map_count() -> int | None:
    """The kernel's limit on one process's memory mappings (None where unreadable)."""
    try:
        with open(_MAX_MAP_COUNT) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def near_map_limit(fraction: float | None = None) -> tuple[bool, int | None, int | None]:
    """Whether this process holds at least ``fraction`` (default
    :data:`MAP_COUNT_RELEASE_FRACTION`) of :func:`max_map_count` mappings.

    Returns:
      ``(near, mappings, limit)``; never near where either count is unknown.
    """
    fraction = MAP_COUNT_RELEASE_FRACTION if fraction is None else fraction
    held, limit = memory_mappings(), max_map_count()
    if held is None or limit is None:
        return False, held, limit
    return held >= fraction * limit, held, limit


def release_compiled_programs_near_map_limit(where: str) -> str | None:
    """Drop JAX's compiled programs where this process nears the mapping limit.

    XLA:CPU maps each compiled program's code into the process and JAX keeps
    every program it compiled; a process that builds many simulations or runs
    many attacks one after another (a sweep, a reproduction script, a notebook)
    grows towards ``vm.max_map_count``, past which XLA segfaults
    (``benchmarks/results/diagnose_map_count/``). Once :func:`near_map_limit`
    says so, ``jax.clear_caches()`` unmaps them; a program needed again is
    compiled again (or loaded from the persistent compilation cache), the same
    program, so no number changes. Every process decides as process 0 does
    (:func:`fedsim.distributed.agree`), so that they compile alike: call it at
    the same point in every process.

    Args:
      where: the point it is called at, for the returned line, e.g. ``"after
        cell 3"``.

    Returns:
      A line saying what was dropped and why, or None where nothing was.
    """
    near, held, limit = near_map_limit()
    if not distributed.agree(near):
        return None
    jax.clear_caches()
    return (f"{where}: {held} memory mappings of the kernel's vm.max_map_count {limit}; "
            "dropped JAX's compiled programs")
