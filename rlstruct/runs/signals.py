"""How a run stops on a signal: SIGTERM (Slurm's time limit, preemption, ``--signal``,
``scancel``, torchrun's agent) and SIGINT (Ctrl-C) end it gracefully.

:class:`StopSignals` is installed by :class:`~rlstruct.runs.run.Run` in the main thread:

- **The first signal** stops the run at a consistent point. While the loop body learns on a
  segment (between two ``get`` of :meth:`Run.segments <rlstruct.runs.run.Run.segments>`: learn,
  publish, checkpoint) it is deferred: the body finishes, then the loop ends with
  ``stopped_by="interrupted"``. If the body takes longer than :data:`STOP_GRACE_S`, or the
  signal comes anywhere else (waiting for a segment, setting up), :class:`Terminated` is raised
  at once in the main thread. Either way :meth:`Run.__exit__
  <rlstruct.runs.run.Run.__exit__>` writes the last row, a final checkpoint that matches
  ``summary.json`` (a learner group's batch still in flight is collected first,
  :func:`settle_groups`), closes everything and raises :class:`Terminated`, which the command
  line (:func:`~rlstruct.runs.resolve.run_cli`) turns into one line and exit code
  :data:`~rlstruct.parallel.startup.EXIT_CODES` (0 after SIGTERM, 130 after Ctrl-C).
- **More SIGTERMs** are ignored: as with Kubernetes and systemd, one SIGTERM starts the grace
  period and SIGKILL is the force. A process-group kill, or ``scancel`` together with a
  forwarding trap, delivers SIGTERM twice, and the final checkpoint is what the stop is for.
- **A second Ctrl-C** (SIGINT, after either signal) ends the process at once: one line on
  stderr, the run's processes killed by PID, exit code 130. Under torchrun it is ignored too:
  its agent forwards the signal it received (a terminal's Ctrl-C reaches every rank twice) and
  sends SIGKILL 30 s later itself.
- **A library that turns the run's** :class:`Terminated` **into a bare KeyboardInterrupt**
  (Ray's ``ray.get`` and ``ray.wait`` run Python's signal handlers inside their wait and raise
  ``KeyboardInterrupt()`` for any KeyboardInterrupt a handler raised, SIGTERM's included) does
  not change how the run ends: :meth:`StopSignals.ending` takes it for the signal that was
  received, so a SIGTERM still ends with exit code 0.

Learner ranks and batcher workers ignore SIGINT: Ctrl-C to the process group reaches the main
process only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from rlstruct.errors import LearnerError
from rlstruct.parallel.startup import EXIT_CODES, Terminated

# EXIT_CODES is imported from rlstruct.parallel.startup (documented there), not re-exported.
__all__ = ["Terminated", "StopSignals", "Ending", "STOP_GRACE_S", "settle_groups", "exit_code",
           "final_checkpoint", "lost_rank", "kill_descendants"]

#: Seconds a deferred stop waits for the loop body (a learn phase) before it interrupts it;
#: the final checkpoint then has as long again, well within the 30 s after which Slurm
#: (``KillWait``) and torchrun send SIGKILL.
STOP_GRACE_S = 10.0

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class Ending:
    """How a run's ``with`` block ended, as its teardown reads it (:meth:`StopSignals.ending`).

    Attributes:
        finish: the run ends as it should: no exception, Ctrl-C, a stop signal, or an error
            taken for the stop signal's consequence.
        by_signal: a stop signal ended it: the teardown raises :class:`Terminated` after it.
        raised: an exception (Ctrl-C included) ended the block, other than one taken for the
            stop signal's consequence.
        after_signal: that consequence (``"Type: message"``), or None.
    """

    finish: bool
    by_signal: bool
    raised: bool
    after_signal: str | None = None


def exit_code(exc: BaseException) -> int:
    """The command line's exit code for a run that ended with ``exc`` (a
    :class:`Terminated`, or a KeyboardInterrupt outside a run: 130)."""
    return EXIT_CODES.get(getattr(exc, "signum", signal.SIGINT), 1)


class StopSignals:
    """The SIGTERM and SIGINT handlers of a run (see the module notes). Installed only from the
    main thread (signals are delivered there); elsewhere it does nothing.

    Args:
        on_hard_exit: called before a second signal ends the process (removes half-written
            files); must be quick.
        torchrun: the process is a torchrun rank (a second signal is then ignored).
        grace: seconds a deferred stop waits (:data:`STOP_GRACE_S`).
    """

    def __init__(self, on_hard_exit: Callable[[], None] = lambda: None, torchrun: bool = False,
                 grace: float = STOP_GRACE_S) -> None:
        self.signum: int | None = None
        self.received_at: float | None = None
        self._on_hard_exit, self._torchrun, self._grace = on_hard_exit, torchrun, grace
        self._deferring = False
        self._raised = False
        self._overdue = False
        self._tearing_down = False
        self._timer: threading.Timer | None = None
        self._old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)

    @property
    def requested(self) -> bool:
        """A signal asked the run to stop."""
        return self.signum is not None

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A block a first signal does not interrupt for up to ``grace`` seconds (the loop body);
        the caller checks :attr:`requested` after it."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            self._cancel_timer()

    def stop_now(self) -> Terminated:
        """The :class:`Terminated` that ends a run whose signal was deferred (it is not
        raised twice)."""
        self._raised = True
        return Terminated(self.signum or signal.SIGTERM)

    def teardown(self) -> None:
        """The run is tearing down: a signal from now on is a second one."""
        self._tearing_down = True
        self._cancel_timer()

    def ending(self, exc: BaseException | None, stopped_by: str | None) -> Ending:
        """Starts the teardown (:meth:`teardown`) of a run whose block ended with ``exc`` (or
        None) while its stop test said ``stopped_by``, and says how it ended. An error after a
        stop signal (not a learner rank's) is taken for its consequence: a signal to the whole
        process group (Slurm, ``timeout``) also stops the workers."""
        self.teardown()
        after = (exc is not None and self.requested
                 and not isinstance(exc, (KeyboardInterrupt, LearnerError)))
        raised = exc is not None and not after
        # A bare KeyboardInterrupt after this handler raised: a library (Ray's ray.get) caught
        # the Terminated and raised KeyboardInterrupt() instead; it is the signal received.
        converted = (isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Terminated)
                     and self._raised)
        by_signal = isinstance(exc, Terminated) or converted or (
            (exc is None or after) and self.requested and stopped_by in (None, "interrupted"))
        return Ending(finish=not raised or isinstance(exc, KeyboardInterrupt),
                      by_signal=by_signal, raised=raised,
                      after_signal=f"{type(exc).__name__}: {exc}" if after else None)

    def restore(self) -> None:
        """Puts back the handlers found at installation (idempotent)."""
        self._cancel_timer()
        for sig, old in self._old.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self._old = {}

    def reinstall(self) -> None:
        """Takes SIGTERM and SIGINT back from a library that replaced the handlers (Ray's
        ``ray.init`` installs ``sys.exit`` on SIGTERM)."""
        if self._old and threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                signal.signal(sig, self._handle)

    # ------------------------------------------------------------------ internals
    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:  # the first signal
            self.signum, self.received_at = signum, time.monotonic()
            if self._tearing_down:
                return  # the teardown (bounded) goes on: it writes the final checkpoint
            if self._deferring:
                self._timer = threading.Timer(self._grace, self._overdue_stop)
                self._timer.daemon = True
                self._timer.start()
                return
            self._raised = True
            raise Terminated(signum)
        if self._overdue and not self._raised and not self._tearing_down:
            self._raised = True  # the deferred stop's grace is over: interrupt the body
            raise Terminated(self.signum)
        if signum != signal.SIGINT or self._torchrun:
            # More SIGTERMs: the grace period goes on (SIGKILL is the force). Under torchrun
            # the agent forwards its signal too, and sends SIGKILL after 30 s itself.
            return
        self._hard_exit(signum)

    def _overdue_stop(self) -> None:
        self._overdue = True
        with contextlib.suppress(Exception):  # the main thread gone: the process is ending
            signal.pthread_kill(threading.main_thread().ident or 0, self.signum or signal.SIGTERM)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _hard_exit(self, signum: int) -> None:
        name = signal.Signals(signum).name
        print(f"rlstruct: second signal ({name}): stopping at once, without the final "
              "checkpoint (the last one written is kept)", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):  # cleanup must not stop the forced exit below
            self._on_hard_exit()
        kill_descendants()
        os._exit(128 + signum)


def kill_descendants() -> None:
    """SIGKILL to every descendant of this process, by PID (batcher workers, learner ranks,
    a local Ray cluster)."""
    try:
        import psutil

        procs = psutil.Process().children(recursive=True)
    except Exception:  # noqa: BLE001 - best effort on the way out: no psutil, a process gone
        return
    for proc in procs:
        with contextlib.suppress(Exception):  # already gone, or not ours to kill: go on
            proc.kill()


def settle_groups(groups: Iterable[Any], seconds: float) -> None:
    """Before the final checkpoint: collects a batch still in flight in each learner group (a
    stop that interrupted a learn phase), so that the checkpoint's model, optimizer and frames
    agree; every wait of the groups is bounded by ``seconds`` from now on.

    Raises:
        whatever ``collect`` raises (a rank that failed or did not finish in time).
    """
    deadline = time.monotonic() + seconds
    for group in groups:
        remaining = max(0.5, deadline - time.monotonic())
        if hasattr(group, "timeout"):
            group.timeout = min(group.timeout, remaining)
        while getattr(group, "pending", 0):
            group.collect(timeout=max(0.5, deadline - time.monotonic()))


def final_checkpoint(checkpoint: Callable[[], None], groups: Iterable[Any],
                     interrupted: bool) -> str | None:
    """Writes a run's last checkpoint with ``checkpoint``. After an interrupt, a learner group's
    batch in flight is collected first (:func:`settle_groups`, bounded by
    :data:`STOP_GRACE_S`), and a failure is returned (one line, also printed) rather than
    raised, so that the run still closes and writes its summary.

    Returns:
        None, or what went wrong.
    """
    if not interrupted:
        checkpoint()
        return None
    try:
        settle_groups(groups, STOP_GRACE_S)
        checkpoint()
    except Exception as err:  # noqa: BLE001 - returned, printed, in summary.json
        text = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
        print(f"rlstruct: the final checkpoint failed ({text}); checkpoints/latest.pt keeps the "
              "last one written (summary.json: checkpoint)", file=sys.stderr, flush=True)
        return text
    return None


def lost_rank(groups: Iterable[Any]) -> str | None:
    """Under torchrun: the rank whose death made torchrun's agent stop this one, described
    (None when every rank is alive: the signal came from outside)."""
    for group in groups:
        lost = getattr(group, "lost_rank", None)
        if callable(lost):
            return lost()
    return None
