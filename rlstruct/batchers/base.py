"""What both batchers share: argument checks, the call-order state machine, info handling."""

from __future__ import annotations

import enum
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from rlstruct.batchers.buffer import Specs
from rlstruct.batchers.restart import RestartPolicy
from rlstruct.batchers.rows import broadcast_rows
from rlstruct.dicttensor import DeviceLike, DictTensor
from rlstruct.errors import BatcherStateError, ConfigError, ShapeError
from rlstruct.trajectories import Trajectories

__all__ = ["BatcherBase", "Phase", "serialized"]

_F = TypeVar("_F", bound=Callable[..., Any])


def serialized(method: _F) -> _F:
    """Runs ``method`` under the batcher's lock: ``update`` may be called from any thread, and
    calls from several threads take turns (each one whole), so versions are counted exactly and
    no two calls ever talk to the workers at once."""

    @functools.wraps(method)
    def locked(self: BatcherBase, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


class Phase(enum.Enum):
    """Where a batcher is in its call order."""

    NEW = "created, reset() not called yet"
    READY = "ready for execute()"
    RUNNING = "a segment is being collected; call get()"
    STREAMING = "pipelined collection is running; call get(), or reset() to stop it"
    FAILED = "failed"
    CLOSED = "closed"


class BatcherBase:
    """Call order, shared by both batchers::

        reset() -> execute() -> get() -> execute() -> get() ... -> close()

    ``update`` may be called at any time before ``close``; ``reset`` is refused while a segment
    is being collected. A wrong order raises :class:`BatcherStateError` at once.
    """

    _phase: Phase = Phase.NEW
    _failure: str | None = None
    _lock: threading.RLock
    #: Segment slots: 1 for synchronous collection (execute, then get), ``K >= 2`` for
    #: pipelined collection (see ``Batcher``).
    pipeline: int = 1

    def __new__(cls, *args: Any, **kwargs: Any) -> BatcherBase:
        self = super().__new__(cls)
        self._lock = threading.RLock()  # see serialized()
        return self

    def _validate_common(  # the values as the user gave them: anything, checked here
        self, n_timesteps: Any, create_agent: Any, agent_args: Any, create_env: Any,
        env_args: Any, seeds: Any, agent_info: Any, env_info: Any,
    ) -> list[str]:
        problems = []
        if isinstance(n_timesteps, bool) or not isinstance(n_timesteps, int) or n_timesteps <= 0:
            problems.append(f"n_timesteps must be a positive int, got {n_timesteps!r}")
        if not callable(create_agent):
            problems.append(f"create_agent must be callable, got {type(create_agent).__name__}")
        if not callable(create_env):
            problems.append(f"create_env must be callable, got {type(create_env).__name__}")
        for name, value in (("agent_args", agent_args), ("env_args", env_args)):
            if value is not None and not isinstance(value, Mapping):
                problems.append(f"{name} must be a dict of keyword arguments, got {value!r}")
        if env_args and "seed" in env_args:
            problems.append("env_args must not hold 'seed': the batcher gives every env its seed")
        for name, value in (("agent_info", agent_info), ("env_info", env_info)):
            if value is not None and not isinstance(value, DictTensor):
                problems.append(f"{name} must be a DictTensor, got {type(value).__name__}")
        if isinstance(seeds, bool) or not isinstance(seeds, (int, Sequence)):
            problems.append(f"seeds must be an int or a list of ints, got {seeds!r}")
        return problems

    @staticmethod
    def _validate_workers(
        n_processes: Any,
        seeds: Any,
        agent_seeds: Any,
        n_threads: Any,
        restart: Any,
        timeout: Any,
        start_timeout: Any,
    ) -> list[str]:
        """The problems of the arguments every multi-worker batcher takes (Batcher, RayBatcher)."""
        problems = []
        if isinstance(n_processes, bool) or not isinstance(n_processes, int) or n_processes <= 0:
            problems.append(f"n_processes must be a positive int, got {n_processes!r}")
        else:
            if agent_seeds is not None and len(agent_seeds) != n_processes:
                problems.append(
                    f"agent_seeds has {len(agent_seeds)} entries, expected one per process "
                    f"({n_processes})"
                )
            if not isinstance(seeds, int) and isinstance(seeds, Sequence) and (
                len(seeds) != n_processes
            ):
                problems.append(
                    f"seeds has {len(seeds)} entries, expected one per process ({n_processes})"
                )
        if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads <= 0:
            problems.append(f"n_threads must be a positive int, got {n_threads!r}")
        if restart is not None and not isinstance(restart, RestartPolicy):
            problems.append(f"restart must be a RestartPolicy or None, got {restart!r}")
        if not _positive(timeout) or not _positive(start_timeout):
            problems.append(f"timeouts must be > 0, got {timeout!r} and {start_timeout!r}")
        return problems

    @staticmethod
    def validate_pipeline(pipeline: Any) -> list[str]:
        """The problems of a ``pipeline`` argument (the one check of every batcher that takes
        one, and of ``make_batcher``).

        Args:
            pipeline: the value given (1: synchronous, K >= 2: K segment slots).

        Returns:
            One message if it is not an int >= 1 (a bool is not), else ``[]``.
        """
        if isinstance(pipeline, bool) or not isinstance(pipeline, int) or pipeline < 1:
            return [
                f"pipeline must be an int >= 1 (1: synchronous, K >= 2: K segment slots), "
                f"got {pipeline!r}"
            ]
        return []

    @staticmethod
    def _raise_problems(problems: list[str]) -> None:
        if problems:
            raise ConfigError("invalid batcher configuration:\n  - " + "\n  - ".join(problems))

    def _require(self, method: str, *allowed: Phase) -> None:
        phase = self._phase
        if phase in allowed:
            return
        if phase is Phase.FAILED:
            raise BatcherStateError(
                f"{method}() on a batcher that failed earlier ({self._failure}); create a new one"
            )
        if phase is Phase.CLOSED:
            raise BatcherStateError(f"{method}() on a closed batcher")
        hints = {
            Phase.NEW: "call reset() first",
            Phase.READY: "call execute() first",
            Phase.RUNNING: "a segment is in flight: call get() first",
            Phase.STREAMING: "pipelined collection is streaming: call get(), or reset() to stop",
        }
        raise BatcherStateError(f"{method}() is not allowed now ({phase.value}): {hints[phase]}")

    _n_running: int | None = None

    def _require_running_envs(self) -> None:
        if self._n_running == 0:
            raise BatcherStateError(
                "execute(): no env is running (every episode ended in an earlier segment); "
                "call reset() to start new episodes"
            )

    def _begin_execute(self, agent_info: DictTensor | None) -> DictTensor | None:
        """The checks of every ``execute``: call order, running envs, and ``agent_info``
        (returned broadcast to all rows and checked; None when not given)."""
        self._require("execute", Phase.READY)
        self._require_running_envs()
        if agent_info is None:
            return None
        return self._rows_info(agent_info, self._agent_info, self._agent_info_specs, "agent_info")

    def _rows_info(
        self, given: DictTensor | None, default: DictTensor, specs: Specs, name: str
    ) -> DictTensor:
        """``given`` broadcast to all rows and checked against the example's specs."""
        if given is None:
            return default
        rows = broadcast_rows(given, default.n_elems(), name)
        expected = {k: v for k, v in specs.items()}
        got = rows.specs()
        if got != expected:
            raise ShapeError(
                f"{name} has specs {_fmt(got)}, expected {_fmt(expected)} like the example "
                f"{name} given to the constructor"
            )
        return rows

    @property
    def n_running(self) -> int | None:
        """Envs still running (after ``reset``: all; after ``get``: what it returned)."""
        return self._n_running

    def n_elems(self) -> int:
        """``B``: the number of rows (envs) of a full batch."""
        return self._n_rows

    _n_rows: int = 0

    def reset(
        self, agent_info: DictTensor | None = None, env_info: DictTensor | None = None
    ) -> None:
        """Resets every env and agent state."""
        raise NotImplementedError

    def execute(self, agent_info: DictTensor | None = None) -> None:
        """Starts collecting one segment."""
        raise NotImplementedError

    def get(
        self, blocking: bool = True, device: DeviceLike | None = None
    ) -> tuple[Trajectories | None, int | None]:
        """The segment started by ``execute`` (on ``device`` when given)."""
        raise NotImplementedError

    def close(self) -> None:
        """Releases everything."""
        raise NotImplementedError

    def __enter__(self) -> BatcherBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0


def _fmt(specs: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {tuple(s)} {d}" for k, (s, d) in sorted(specs.items())) + "}"
