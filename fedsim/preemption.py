"""Stopping a run on SIGTERM at a round boundary, with a checkpoint, alike in every process.

Cluster schedulers end a job with SIGTERM and, a grace period later, SIGKILL
(SLURM's ``scancel``, preemption, a time limit). Without this:

* in one process, SIGTERM killed the run mid-round, and a rerun resumed from the
  last periodic checkpoint, losing the rounds since;
* across processes, JAX's preemption notifier (started by
  ``jax.distributed.initialize``) catches SIGTERM, so the run went on as if
  nothing had happened until SIGKILL.

:class:`Watch` asks, after every round, whether to stop. Across processes it
asks JAX's preemption sync manager
(``multihost_utils.reached_preemption_sync_point``), which makes every process
stop after the same round once any of them got the signal; in one process a
SIGTERM handler sets a flag, installed only where the run checkpoints (without
checkpoints a stop would save nothing, so SIGTERM keeps ending the process at
once). :func:`fedsim.run.run_simulation` then saves a checkpoint and raises
:class:`Preempted`; rerunning the same command resumes from that round.
"""

from __future__ import annotations

import signal
import threading

from fedsim import distributed


class Preempted(RuntimeError):
    """SIGTERM stopped the run after a round (checkpointed where checkpoints are on).

    Attributes:
      rounds_done: rounds finished when the run stopped.
      checkpointed: whether a checkpoint of those rounds was saved.
    """

    def __init__(self, rounds_done: int, checkpointed: bool):
        self.rounds_done, self.checkpointed = rounds_done, checkpointed
        then = ("a checkpoint is saved; run the same command again to resume from it"
                if checkpointed else "no checkpoint was saved (output.checkpoint_every is 0)")
        super().__init__(f"stopped by SIGTERM after round {rounds_done}: {then}")


class SweepPreempted(Preempted):
    """SIGTERM stopped a sweep between two cells (the cells before are finished).

    Attributes:
      cells_done: cells finished (run or found finished) when the sweep stopped.
      cells: cells in the grid.
    """

    def __init__(self, cells_done: int, cells: int):
        self.cells_done, self.cells = cells_done, cells
        self.rounds_done, self.checkpointed = None, True
        RuntimeError.__init__(self, f"stopped by SIGTERM after sweep cell {cells_done} of "
                                    f"{cells}: run the same command again to run the rest")


class Watch:
    """Whether a SIGTERM asks the run to stop after the current round.

    Use as a context manager around the round loop; call :meth:`stop_after`
    once per round, in every process, with the number of rounds done.

    Args:
      handle_signal: in one process, install a SIGTERM handler (restored on
        exit). Across processes JAX's notifier handles the signal either way.
    """

    def __init__(self, handle_signal: bool):
        self._handle = handle_signal
        self._across = distributed.joined()
        if self._across:
            from jax._src import distributed as jax_distributed  # no public query

            # None where JAX's preemption service is off (jax_enable_preemption_service).
            self._sync = jax_distributed.global_state.preemption_sync_manager is not None
        self._signalled = False
        self._previous = None

    def __enter__(self) -> "Watch":
        # signal.signal works only in the main thread; elsewhere SIGTERM keeps
        # its own behaviour.
        if (self._handle and not self._across
                and threading.current_thread() is threading.main_thread()):
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            previous, self._previous = self._previous, None
            signal.signal(signal.SIGTERM, previous)
            # A SIGTERM in a run's last round does not stop it (the run is
            # complete); the handler around the run, such as a sweep's, learns
            # of it, so that it does not start the next cell as if none came.
            # The default handler is not called: that would kill a finished run.
            if self._signalled and callable(previous):
                previous(signal.SIGTERM, None)

    def _on_signal(self, signum, frame) -> None:
        self._signalled = True

    def stop_after(self, rounds_done: int) -> bool:
        """Whether to stop now, ``rounds_done`` rounds in (the same answer in every process)."""
        if not self._across:
            return self._signalled
        if not self._sync:
            return False
        from jax.experimental import multihost_utils

        return bool(multihost_utils.reached_preemption_sync_point(rounds_done))
