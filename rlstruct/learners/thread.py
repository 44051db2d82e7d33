"""A learner thread: ``learn`` runs on one batch while the main thread collects the next ones.

Like RLlib's learner thread (IMPALA/APPO), without its failure modes: a thread that dies silently,
a queue that blocks forever. The invariants, kept at every entry point of :class:`LearnerThread`:

- The queue is bounded (``max_queue``): :meth:`LearnerThread.put` blocks while it is full
  (back-pressure on collection), but always until a deadline, never forever.
- An exception raised by ``learn`` ends the thread and is re-raised in the owner's thread at its
  next interaction (:meth:`~LearnerThread.put`, :meth:`~LearnerThread.metrics`,
  :meth:`~LearnerThread.stop`, :meth:`~LearnerThread.wait_idle`,
  :meth:`~LearnerThread.raise_if_failed`) as a :class:`LearnerError` naming the batch, chained
  (``__cause__``) to the original exception, which keeps its own traceback from the learner thread.
- :meth:`~LearnerThread.stop` is bounded (a timeout) and idempotent; the thread is a daemon and a
  ``weakref.finalize`` stops it when its owner is collected or the interpreter exits.

The thread body is a module-level function over a small shared state that holds no reference to
the :class:`LearnerThread`, so that dropping the last reference to it really stops the thread.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from rlstruct.errors import (
    BatcherStateError,
    ConfigError,
    LearnerError,
    LearnerTimeoutError,
    RLStructError,
)
from rlstruct.learners.latest_weights import LatestWeights

__all__ = ["LatestWeights", "LearnerError", "LearnerThread", "LearnerTimeoutError"]

#: How often a blocked ``put`` looks whether the learner died, in seconds.
_POLL_S = 0.05
_STOP = object()

LearnFn = Callable[[Any], "Mapping[str, float] | None"]


class _Shared:
    """The state the learner thread and its owner share (guarded by ``lock``)."""

    def __init__(self, max_queue: int, window: int) -> None:
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # a batch learned or dropped, or a failure
        self.error: BaseException | None = None
        self.error_batch: int | None = None
        self.error_traceback = ""
        self.current: int | None = None  # index of the batch inside learn, if any
        self.current_since = 0.0
        self.put = self.learned = self.dropped = 0
        self.items_put = self.items_learned = 0
        self.publications = 0
        self.queue_sizes: deque[int] = deque(maxlen=window)
        self.put_wait_ms: deque[float] = deque(maxlen=window)
        self.dequeue_wait_ms: deque[float] = deque(maxlen=window)
        self.learn_ms: deque[float] = deque(maxlen=window)
        self.put_events: deque[tuple[float, int]] = deque(maxlen=window)  # (arrival, size)
        self.learn_events: deque[tuple[float, int]] = deque(maxlen=window)  # (start, size)
        self.last_metrics: dict[str, float] = {}


def _drop_queued(shared: _Shared) -> None:
    """Empties the queue without learning what it held (stop, or after a failure)."""
    dropped = 0
    while True:
        try:
            item = shared.queue.get_nowait()
        except queue.Empty:
            break
        dropped += item is not _STOP
    with shared.lock:
        shared.dropped += dropped
        shared.changed.notify_all()


def _signal_stop(shared: _Shared) -> None:
    """Asks the thread to exit after its current ``learn``; never blocks (also the finalizer)."""
    shared.stop.set()
    _drop_queued(shared)
    # Full only if a put slipped in: the thread then takes it, sees the stop flag and exits.
    with contextlib.suppress(queue.Full):
        shared.queue.put_nowait(_STOP)


def _learner_loop(shared: _Shared, learn: LearnFn) -> None:
    """The thread body: take a batch, learn on it, record; exit on stop or on a failure."""
    while True:
        t0 = time.perf_counter()
        item = shared.queue.get()
        waited_ms = (time.perf_counter() - t0) * 1e3
        if item is _STOP or shared.stop.is_set():
            if item is not _STOP:
                with shared.lock:
                    shared.dropped += 1
                    shared.changed.notify_all()
            return
        index, batch, size = item
        del item
        start = time.perf_counter()
        with shared.lock:
            shared.dequeue_wait_ms.append(waited_ms)
            shared.current, shared.current_since = index, start
        try:
            out = learn(batch)
            del batch  # don't hold the batch (GPU memory) while waiting for the next one
            if out is not None and not isinstance(out, Mapping):
                raise TypeError(
                    f"learn must return a Mapping[str, float] or None, got {type(out).__name__}"
                )
            metrics = {} if out is None else {str(k): float(v) for k, v in out.items()}
        except BaseException as exc:  # noqa: BLE001 - to the owner, which raises it (SystemExit too)
            batch = None  # the traceback keeps this frame: don't let it hold the batch too
            with shared.lock:
                shared.error, shared.error_batch = exc, index
                shared.error_traceback = "".join(traceback.format_exception(exc))
                shared.current = None
                shared.changed.notify_all()
            _drop_queued(shared)  # frees memory and wakes a put blocked on a full queue
            return
        end = time.perf_counter()
        with shared.lock:
            shared.learned += 1
            shared.items_learned += size
            shared.learn_ms.append((end - start) * 1e3)
            shared.learn_events.append((start, size))
            shared.last_metrics = metrics
            shared.current = None
            shared.changed.notify_all()


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of a sorted non-empty list."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _mean(values: deque[float] | deque[int]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def _rate(events: deque[tuple[float, int]], now: float) -> float:
    """Items per second over the window: its items over the time since its first event."""
    if not events:
        return 0.0
    span = now - events[0][0]
    return sum(size for _, size in events) / span if span > 0 else 0.0


def _check_seconds(name: str, value: float, *, positive: bool = False) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ConfigError(f"{name} must be a finite number of seconds {bound}, got {value}")
    return value


def _check_count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class LearnerThread:
    """Calls ``learn(batch)`` in a daemon thread, on each batch its owner puts, in order.

    Invariants (see the module notes): the queue holds at most ``max_queue`` batches and ``put``
    waits for a free slot at most ``timeout`` seconds; a failure of ``learn`` is re-raised in the
    owner's thread as :class:`LearnerError` chained to the original exception; ``stop`` is bounded
    and idempotent; the thread is a daemon and is stopped by a finalizer when this object is
    collected or the interpreter exits. The thread starts in the constructor.

    ``stop`` DROPS the batches still queued (it does not learn them: stopping must be bounded);
    call :meth:`wait_idle` first to have every batch put so far learned.

    Errors are reported once by ``metrics``, ``stop`` and ``__exit__`` (a second ``stop`` returns
    quietly), but every time by ``put``, ``wait_idle`` and ``raise_if_failed``, which cannot do
    their job with a dead learner.

    ``put`` is meant to be called from one thread (the owner's), which numbers the batches.

    Weight publications are counted by :meth:`count_publication`, which ``learn`` calls each time
    it publishes weights (e.g. after ``batcher.update(state_dict)``). A ``learn`` that refers to
    its ``LearnerThread`` keeps it alive while the thread runs, so the finalizer then only acts at
    interpreter exit: stop such a learner explicitly or use it as a context manager.

    Args:
        learn: called in the learner thread with each batch, in put order; returns a mapping of
            float metrics (tensors of one element are accepted) or None.
        max_queue: how many batches may wait in the queue, >= 1.
        name: the thread's name (in :func:`threading.enumerate` and error messages).
        put_timeout: default deadline of :meth:`put`, in seconds (finite, > 0).
        window: how many recent puts / batches the windowed metrics cover, >= 1.

    Raises:
        ConfigError: a non-callable ``learn`` or an invalid size or timeout.

    Examples:
        >>> seen = []
        >>> with LearnerThread(lambda batch: seen.append(batch) or {"loss": 0.5}) as learner:
        ...     for k in range(3):
        ...         learner.put(k, size=8)
        ...     learner.wait_idle(timeout=10.0)
        ...     m = learner.metrics()
        >>> seen, m["batches_learned"], m["items_learned"], m["learn/loss"]
        ([0, 1, 2], 3.0, 24.0, 0.5)
    """

    def __init__(
        self,
        learn: LearnFn,
        max_queue: int = 2,
        *,
        name: str = "rlstruct-learner",
        put_timeout: float = 300.0,
        window: int = 100,
    ) -> None:
        if not callable(learn):
            raise ConfigError(f"learn must be callable, got {type(learn).__name__}")
        self._max_queue = _check_count("max_queue", max_queue, 1)
        self._put_timeout = _check_seconds("put_timeout", put_timeout, positive=True)
        self._name = str(name)
        self._shared = _Shared(self._max_queue, _check_count("window", window, 1))
        self._stopped = False
        self._reported = False
        self._thread = threading.Thread(
            target=_learner_loop, args=(self._shared, learn), name=self._name, daemon=True
        )
        self._thread.start()
        self._finalizer = weakref.finalize(self, _signal_stop, self._shared)

    # ------------------------------------------------------------------ state
    @property
    def name(self) -> str:
        """The thread's name."""
        return self._name

    @property
    def running(self) -> bool:
        """Whether the thread is alive (it may be finishing a ``learn`` after ``stop``)."""
        return self._thread.is_alive()

    @property
    def error(self) -> BaseException | None:
        """The exception ``learn`` raised, if any (also after it was reported)."""
        return self._shared.error

    # ------------------------------------------------------------------ producer side
    def put(self, batch: Any, timeout: float | None = None, *, size: int = 1) -> None:
        """Queues ``batch`` for ``learn``, waiting while the queue is full (back-pressure).

        Args:
            batch: anything ``learn`` accepts; the thread holds it only until ``learn`` returns.
            timeout: seconds to wait for a free slot; None means the constructor's
                ``put_timeout``; 0 means do not wait.
            size: how many items (e.g. ``B * T`` transitions) the batch holds, for the
                ``sample_per_s`` / ``train_per_s`` metrics (1 counts batches).

        Raises:
            LearnerError: ``learn`` failed (now or before) or the thread is gone.
            LearnerTimeoutError: no slot freed before the deadline (the learner is slower than
                collection, or stuck in ``learn``).
            BatcherStateError: ``put`` after :meth:`stop`.
            ConfigError: an invalid ``timeout`` or ``size``.
        """
        self._raise_unless_usable()
        _check_count("size", size, 0)
        wait_s = self._put_timeout if timeout is None else _check_seconds("timeout", timeout)
        shared = self._shared
        arrival = time.perf_counter()
        with shared.lock:
            index = shared.put
            shared.queue_sizes.append(shared.queue.qsize())
        deadline = arrival + wait_s
        while True:
            remaining = deadline - time.perf_counter()
            try:
                shared.queue.put((index, batch, size), timeout=max(0.0, min(_POLL_S, remaining)))
                break
            except queue.Full:
                self._raise_unless_usable()
                if deadline - time.perf_counter() <= 0:
                    raise LearnerTimeoutError(
                        f"put waited {wait_s:g} s for a free slot in the queue of learner thread "
                        f"{self._name!r} (max_queue={self._max_queue}) and none freed; "
                        f"{self._describe_current()}. The learner is slower than collection or "
                        "stuck: give put a larger timeout (or put_timeout=) if learn is "
                        "legitimately this slow"
                    ) from None
        # learn may have failed while we waited (its thread then emptied the queue, which let
        # this put in): the batch will never be learned, so say so now.
        self._raise_if_error(always=True)
        with shared.lock:
            shared.put += 1
            shared.items_put += size
            shared.put_wait_ms.append((time.perf_counter() - arrival) * 1e3)
            shared.put_events.append((arrival, size))

    def count_publication(self, n: int = 1) -> None:
        """Counts ``n`` weight publications (call it from ``learn``; thread-safe)."""
        with self._shared.lock:
            self._shared.publications += int(n)

    def wait_idle(self, timeout: float = 300.0) -> None:
        """Blocks until every batch put so far has been learned (or dropped by ``stop``).

        Args:
            timeout: seconds to wait at most (finite, >= 0).

        Raises:
            LearnerError: ``learn`` failed (now or before).
            LearnerTimeoutError: batches are still queued or in ``learn`` after ``timeout``.
        """
        timeout = _check_seconds("timeout", timeout)
        shared = self._shared
        deadline = time.perf_counter() + timeout
        with shared.changed:
            while shared.learned + shared.dropped < shared.put and shared.error is None:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    pending = shared.put - shared.learned - shared.dropped
                    raise LearnerTimeoutError(
                        f"wait_idle: {pending} batch(es) of learner thread {self._name!r} still "
                        f"queued or in learn after {timeout:g} s"
                    )
                shared.changed.wait(remaining)
        self._raise_if_error(always=True)

    def raise_if_failed(self) -> None:
        """Raises :class:`LearnerError` if ``learn`` failed or the thread is gone (unstopped)."""
        self._raise_if_error(always=True)
        if not self._stopped and not self._thread.is_alive():
            raise LearnerError(f"learner thread {self._name!r} exited without being stopped")

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict[str, float]:
        """A snapshot of the learner's metrics (windowed ones over the last ``window`` events).

        Returns:
            A flat dict of floats:

            - ``batches_put``, ``batches_learned``, ``batches_dropped``, ``items_put``,
              ``items_learned``: counts since the start.
            - ``queue_size_mean``, ``queue_size_p50``, ``queue_size_p90``, ``queue_size_max``:
              the queue length each ``put`` found on arrival (0: the learner waits for data;
              ``max_queue``: collection waits for the learner).
            - ``put_wait_ms_mean``: time ``put`` blocked; ``dequeue_wait_ms_mean``: time the
              thread waited for a batch.
            - ``learn_ms_mean``, ``learn_ms_last``: duration of ``learn``.
            - ``sample_per_s``, ``train_per_s``: items put / learned per second over the window
              (from its first event to now).
            - ``publications``: the :meth:`count_publication` total.
            - ``learn/<key>``: the metrics the last successful ``learn`` returned.

        Raises:
            LearnerError: ``learn`` failed and this has not been reported yet.
        """
        self._raise_if_error(always=False)
        shared = self._shared
        now = time.perf_counter()
        with shared.lock:
            sizes = sorted(float(x) for x in shared.queue_sizes)
            out = {
                "batches_put": float(shared.put),
                "batches_learned": float(shared.learned),
                "batches_dropped": float(shared.dropped),
                "items_put": float(shared.items_put),
                "items_learned": float(shared.items_learned),
                "queue_size_mean": _mean(shared.queue_sizes),
                "queue_size_p50": _quantile(sizes, 0.5) if sizes else 0.0,
                "queue_size_p90": _quantile(sizes, 0.9) if sizes else 0.0,
                "queue_size_max": sizes[-1] if sizes else 0.0,
                "put_wait_ms_mean": _mean(shared.put_wait_ms),
                "dequeue_wait_ms_mean": _mean(shared.dequeue_wait_ms),
                "learn_ms_mean": _mean(shared.learn_ms),
                "learn_ms_last": shared.learn_ms[-1] if shared.learn_ms else 0.0,
                "sample_per_s": _rate(shared.put_events, now),
                "train_per_s": _rate(shared.learn_events, now),
                "publications": float(shared.publications),
            }
            out.update({f"learn/{k}": v for k, v in shared.last_metrics.items()})
        return out

    # ------------------------------------------------------------------ shutdown
    def stop(self, timeout: float = 5.0) -> None:
        """Stops the thread: drops the queued batches, lets a running ``learn`` finish, joins.

        Bounded and idempotent: returns within about ``timeout`` seconds; a later call joins
        again (and returns at once when the thread has exited).

        Args:
            timeout: seconds to wait for the thread to exit (finite, >= 0).

        Raises:
            LearnerTimeoutError: the thread is still inside ``learn`` after ``timeout`` (it exits
                when ``learn`` returns; as a daemon it never blocks interpreter exit).
            LearnerError: ``learn`` had failed and this was not reported yet.
        """
        timeout = _check_seconds("timeout", timeout)
        self._stopped = True
        self._finalizer()  # runs _signal_stop once, then detaches
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise LearnerTimeoutError(
                f"learner thread {self._name!r} is still running {timeout:g} s after stop(): "
                f"{self._describe_current()}. It exits when learn returns (it is a daemon "
                "thread: it does not block interpreter exit); call stop() again to wait longer"
            )
        self._raise_if_error(always=False)

    def __enter__(self) -> LearnerThread:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.stop()
            return
        try:
            self.stop()
        except RLStructError as err:  # the body's exception is the one to see; note ours on it
            if hasattr(exc, "add_note"):  # Python >= 3.11
                exc.add_note(f"while stopping learner thread {self._name!r}: {err}")

    # ------------------------------------------------------------------ internals
    def _describe_current(self) -> str:
        shared = self._shared
        with shared.lock:
            index, since = shared.current, shared.current_since
        if index is None:
            return "learn is not running"
        return f"learn has been running on batch {index} for {time.perf_counter() - since:.1f} s"

    def _raise_if_error(self, *, always: bool) -> None:
        shared = self._shared
        with shared.lock:
            original, index, text = shared.error, shared.error_batch, shared.error_traceback
        if original is None or (self._reported and not always):
            return
        self._reported = True
        raise LearnerError(
            f"learn raised {type(original).__name__} on batch {index} (counting from 0 in put "
            f"order) in learner thread {self._name!r}: {original}",
            batch=index,
            exc_type=type(original).__name__,
            learner_traceback=text,
        ) from original

    def _raise_unless_usable(self) -> None:
        self._raise_if_error(always=True)
        if self._stopped:
            raise BatcherStateError(
                f"put after stop(): learner thread {self._name!r} is stopped; create a new "
                "LearnerThread"
            )
        if not self._thread.is_alive():
            raise LearnerError(f"learner thread {self._name!r} exited without being stopped")
