"""How long a worker pool's workers may stay silent: :class:`Deadlines`.

A worker that answers nothing (a hung env or agent) is reported as a
:class:`~rlstruct.errors.WorkerTimeoutError` once it was silent for longer than the pool's
limit (:meth:`Deadlines.at`):

- ``timeout`` seconds (the constructor's ``timeout``), the fixed limit by default;
- with ``adaptive=True``, once a segment has been delivered: :data:`ADAPTIVE_FACTOR` times the
  longest silence seen so far in a segment (from a segment's release, or the worker's previous
  delivery, to its delivery), at least :data:`ADAPTIVE_FLOOR_S` and at most ``timeout``: the
  limit follows the measured step times;
- with ``until`` (a ``time.monotonic()`` value, e.g. the end of a run's time budget), no wait
  lasts past it, except that a wait that starts close to it or after it still gets
  :data:`UNTIL_MIN_WAIT_S` seconds;
- time the pool's own process spent stopped does not count: from its first wait on, a thread
  of the pool's process (:meth:`Deadlines.watch`) wakes every :data:`WATCH_TICK_S` seconds, and
  a gap of more than :data:`PAUSE_GAP_S` seconds between two of its ticks
  (:meth:`Deadlines.looked`) means the process was stopped (SIGSTOP or Ctrl-Z to the job's
  process group, a suspended Slurm job, a machine that slept), its workers with it, whatever
  it was doing (waiting for the workers, or learning with a segment under way); every limit is
  moved on by that pause, and the silences measured across it leave it out.

Example:
    >>> d = Deadlines(timeout=300.0, adaptive=True, until=None, n_workers=1)
    >>> d.limit()  # nothing measured yet: the timeout
    300.0
    >>> d.delivered(0, released=10.0, now=12.0)  # a segment took 2 s
    >>> d.limit()  # 10 x 2 s, but at least the floor
    60.0
"""

from __future__ import annotations

import math
import threading
import time

__all__ = ["Deadlines", "ADAPTIVE_FACTOR", "ADAPTIVE_FLOOR_S", "UNTIL_MIN_WAIT_S",
           "MAX_WORKER_TIMEOUT_S", "PAUSE_GAP_S", "WATCH_TICK_S", "budget_grace",
           "worker_waits"]

#: With ``adaptive``: the limit is this many times the longest silence seen in a segment...
ADAPTIVE_FACTOR = 10.0
#: ... and never less than this many seconds (a segment slowed down by a busy machine).
ADAPTIVE_FLOOR_S = 60.0
#: A wait that starts close to ``until`` (or after it) still lasts this many seconds.
UNTIL_MIN_WAIT_S = 10.0
#: The most a training worker may stay silent in a segment with ``worker_timeout=None``.
MAX_WORKER_TIMEOUT_S = 300.0
#: A gap between two ticks of the pause watch longer than this many seconds is a pause of the
#: pool's own process, not a silence of its workers.
PAUSE_GAP_S = 10.0
#: The pause watch's thread wakes this often (seconds).
WATCH_TICK_S = 1.0


def budget_grace(time_budget: float) -> float:
    """Seconds a segment still running when the time budget ends may take to come back before
    its silent workers are reported: a tenth of the budget, at least 10 s."""
    return max(10.0, 0.1 * time_budget)


def worker_waits(worker_timeout: float | None, start: float, time_budget: float) -> dict:
    """A run's :func:`~rlstruct.batchers.make.make_batcher` ``timeout``, ``adaptive_timeout``
    and ``deadline``: ``worker_timeout`` seconds, or (None) a limit derived from the measured
    segments (at most :data:`MAX_WORKER_TIMEOUT_S`); and no wait past the time budget (from
    ``start``, a ``time.monotonic()`` value) plus :func:`budget_grace`."""
    return {"timeout": worker_timeout or MAX_WORKER_TIMEOUT_S,
            "adaptive_timeout": worker_timeout is None,
            "deadline": start + time_budget + budget_grace(time_budget)}


class Deadlines:
    """The silence limit of a pool's workers (see the module notes).

    Args:
        timeout: seconds a worker may stay silent (with ``adaptive``: the most it may).
        adaptive: follow the measured segments (see the module notes).
        until: a ``time.monotonic()`` value past which no wait lasts (None: none).
        n_workers: the pool's workers.

    Attributes:
        longest_silence: the longest silence seen in a segment so far, in seconds (0: none
            delivered yet).
    """

    def __init__(self, timeout: float, adaptive: bool, until: float | None,
                 n_workers: int) -> None:
        self.timeout, self.adaptive, self.until = float(timeout), bool(adaptive), until
        self.longest_silence = 0.0
        self._delivered_at = [-math.inf] * n_workers
        self._pauses: list[tuple[float, float]] = []  # (start, end), monotonic seconds
        self._watch: threading.Thread | None = None
        self._closed, self._lock = threading.Event(), threading.Lock()
        self._last_tick: float | None = None  # the watch's, while it runs

    @staticmethod
    def problems(adaptive: object, until: object) -> list[str]:
        """The problems of the ``adaptive_timeout`` and ``deadline`` arguments of a pool."""
        problems = []
        if not isinstance(adaptive, bool):
            problems.append(f"adaptive_timeout must be a bool, got {adaptive!r}")
        if until is not None and (isinstance(until, bool) or not isinstance(until, (int, float))
                                  or not math.isfinite(until)):
            problems.append(f"deadline must be a time.monotonic() value or None, got {until!r}")
        return problems

    def delivered(self, w: int, released: float, now: float | None = None) -> None:
        """Worker ``w`` delivered a segment released at ``released`` (monotonic seconds)."""
        now = time.monotonic() if now is None else now
        since = max(released, self._delivered_at[w])
        silence = now - since - self.paused(since, now)
        self.longest_silence = max(self.longest_silence, silence)
        self._delivered_at[w] = now

    def looked(self, last: float, now: float) -> None:
        """The pause watch ticked at ``last`` and again at ``now`` (monotonic seconds): a gap
        longer than :data:`PAUSE_GAP_S` is recorded as a pause."""
        with self._lock:
            self._record(last, now)

    def _record(self, last: float, now: float) -> None:
        if now - last > PAUSE_GAP_S:  # the caller holds the lock
            self._pauses.append((last, now))

    def watch(self) -> None:
        """Starts the pause watch (a daemon thread that ticks every :data:`WATCH_TICK_S`
        seconds, :meth:`looked`) unless it runs or :meth:`close` was called; :meth:`at` calls
        it, so it runs from a pool's first wait to its ``close``."""
        if self._watch is None and not self._closed.is_set():
            self._watch = threading.Thread(target=self._tick, name="rlstruct-pause-watch",
                                           daemon=True)
            self._last_tick = time.monotonic()
            self._watch.start()

    def _tick(self) -> None:
        while not self._closed.wait(WATCH_TICK_S):
            now = time.monotonic()
            with self._lock:  # the pause and the new tick at once, for paused()
                last, self._last_tick = self._last_tick or now, now
                self._record(last, now)

    def close(self, timeout: float = 2.0) -> None:
        """Stops the pause watch (within ``timeout`` seconds); idempotent."""
        self._closed.set()
        if self._watch is not None:
            self._watch.join(timeout)

    def paused(self, since: float, until: float = math.inf) -> float:
        """Seconds of the recorded pauses between ``since`` and ``until``, and of the one under
        way: the watch's last tick more than :data:`PAUSE_GAP_S` ago (a process continued a
        moment ago, whose watch has not ticked yet)."""
        with self._lock:
            pauses, last = list(self._pauses), self._last_tick
        now = time.monotonic()
        if last is not None and not self._closed.is_set() and now - last > PAUSE_GAP_S:
            pauses.append((last, now))
        return sum(max(0.0, min(b, until) - max(a, since)) for a, b in pauses)

    def limit(self) -> float:
        """Seconds a worker may stay silent now (``until`` aside)."""
        if not self.adaptive or self.longest_silence <= 0:
            return self.timeout
        return min(self.timeout, max(ADAPTIVE_FLOOR_S, ADAPTIVE_FACTOR * self.longest_silence))

    def at(self, since: float) -> float:
        """The deadline of a wait whose workers were last heard from at ``since`` (moved on by
        the pauses recorded since then); starts the pause watch (:meth:`watch`)."""
        self.watch()
        paused = self.paused(since)
        at = since + paused + self.limit()
        if self.until is not None:
            at = min(at, max(self.until + paused, since + paused + UNTIL_MIN_WAIT_S))
        return at

    def describe(self) -> str:
        """Which limit a timeout ran into, for its message."""
        if self.until is not None and time.monotonic() >= self.until:
            return (f"the run's deadline, its time budget plus a grace, passed "
                    f"{time.monotonic() - self.until:.0f} s ago")
        if self.adaptive and self.longest_silence > 0:
            return (f"the timeout of {self.limit():g} s: {ADAPTIVE_FACTOR:g} x the slowest "
                    f"segment so far ({self.longest_silence:.2f} s), at least "
                    f"{ADAPTIVE_FLOOR_S:g} s, at most {self.timeout:g} s")
        return f"the timeout of {self.limit():g} s"
