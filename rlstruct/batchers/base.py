"""What both batchers share: argument checks, the call-order state machine, info handling."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlstruct.agent import Agent
from rlstruct.batchers.buffer import Specs
from rlstruct.batchers.rows import broadcast_rows
from rlstruct.dicttensor import DeviceLike, DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.errors import BatcherStateError, ConfigError, ShapeError
from rlstruct.trajectories import Trajectories

__all__ = ["BatcherBase", "Phase"]


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

    def _validate_common(
        self,
        n_timesteps: int,
        create_agent: Callable[..., Agent],
        agent_args: Mapping[str, Any] | None,
        create_env: Callable[..., VecEnv],
        env_args: Mapping[str, Any] | None,
        seeds: int | Sequence[int],
        agent_info: DictTensor | None,
        env_info: DictTensor | None,
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


def _fmt(specs: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {tuple(s)} {d}" for k, (s, d) in sorted(specs.items())) + "}"
