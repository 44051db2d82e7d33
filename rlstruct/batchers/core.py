"""The worker core: what one worker of any multi-worker backend does, whatever carries its calls.

A :class:`WorkerCore` builds the worker's env, agent and :class:`~rlstruct.batchers.rollout.Rollout`
from a :class:`CoreSpec`, applies weight and info updates, resets, and collects one segment into
a :class:`~rlstruct.batchers.buffer.SlotBuffer`. The process worker's pipe loop
(:mod:`rlstruct.batchers.process.worker`) serves it, and the Ray actor
(:mod:`rlstruct.batchers.ray.actor`)
wraps it: both backends build, seed, load and collect with the same lines, so they return the
same data for the same seeds.

Random numbers: the process's global generators (torch, numpy, ``random``) are seeded with the
build seed (the same in every worker) before the env and the agent are built, then with the
worker's own agent seed: a model initialised in ``create_agent`` has the same weights in every
worker and every run, and an agent that samples from the global generators is reproducible.

A failure is reported as a payload (:meth:`WorkerCore.error_payload`: type, message, traceback,
worker, global env, step, phase), which the driver turns into a
:class:`~rlstruct.errors.WorkerError` (:func:`rlstruct.batchers.pool.worker_error`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cloudpickle
import torch

from rlstruct.agent import Agent
from rlstruct.batchers.buffer import SlotBuffer
from rlstruct.batchers.rollout import Rollout, StepContext
from rlstruct.batchers.seeding import seed_global_rngs
from rlstruct.batchers.serial import make_env_on
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.parallel.transport import from_cpu_bytes

__all__ = ["CoreSpec", "WorkerCore", "error_payload"]


@dataclass
class CoreSpec:
    """What every worker needs to build itself (sent once, when the worker starts)."""

    index: int
    factories: bytes  # cloudpickle of (create_env, env_args, create_agent, agent_args)
    env_seed: int
    build_seed: int  # the global generators' seed while env and agent are built (same for all)
    agent_seed: int  # then: this worker's own stream, for everything the agent samples
    n_envs: int
    offset: int  # global index of env 0
    n_timesteps: int
    n_threads: int
    device: str  # where the agent and the worker's buffer live


def _mark(exc: Exception, phase: str) -> None:
    """Marks ``exc`` as raised in ``phase`` (no env, no step)."""
    exc.rlstruct_context = StepContext(phase, None, None)  # type: ignore[attr-defined]


def _describe(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception cannot even describe itself."""
    try:
        return str(exc)
    except BaseException as e:  # noqa: BLE001 - a broken __str__ must not kill the report
        return f"<{type(exc).__name__}.__str__ raised {type(e).__name__}>"


def _format_traceback(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:  # noqa: BLE001 - an exception that breaks formatting: frames only
        frames = "".join(traceback.format_tb(exc.__traceback__))
        head = "Traceback (most recent call last):\n"
        return f"{head}{frames}{type(exc).__name__}: {_describe(exc)}\n"


def error_payload(exc: BaseException, worker: int, rollout: Rollout | None) -> dict[str, Any]:
    """The report of a worker's failure: type, message, traceback, worker, env, step, phase."""
    where = rollout.describe_failure(exc) if rollout is not None else {"worker": worker}
    ctx = getattr(exc, "rlstruct_context", None)
    if rollout is None and ctx is not None:
        where.update(env=ctx.env, step=ctx.step, phase=ctx.phase)
    return {
        "type": type(exc).__name__,
        "message": _describe(exc),
        "traceback": _format_traceback(exc),
        **where,
    }


class WorkerCore:
    """One worker's env, agent and rollout.

    Args:
        spec: what to build.
        buffer: the buffer the rollout writes (its first slot, for a process worker).
        row: the first buffer row of this worker's envs (``spec.offset`` in a buffer of all
            rows, 0 in a buffer of this worker's rows only).
    """

    def __init__(self, spec: CoreSpec, buffer: SlotBuffer, row: int) -> None:
        self.spec = spec
        self.env: VecEnv | None = None
        self.agent: Agent | None = None
        self.rollout: Rollout | None = None
        self._buffer, self._row = buffer, row

    def build(self) -> None:
        """Builds env, agent and rollout, seeded as the module docstring says; on failure the
        parts already built stay in ``env``/``agent`` for :meth:`close`.

        Raises:
            Exception: what a factory raised, marked with its phase (``env factory``,
                ``agent factory``); ValueError when the env has another number of envs.
        """
        spec = self.spec
        torch.set_num_threads(spec.n_threads)
        device = torch.device(spec.device)
        seed_global_rngs(spec.build_seed, device)
        try:
            create_env, env_args, create_agent, agent_args = cloudpickle.loads(spec.factories)
            self.env = make_env_on(
                create_env, env_args, spec.env_seed, device, env_id_offset=spec.offset
            )
        except Exception as e:
            _mark(e, "env factory")
            raise
        if self.env.n_envs() != spec.n_envs:
            raise ValueError(
                f"worker {spec.index}: create_env built {self.env.n_envs()} envs, expected "
                f"{spec.n_envs} like the first one (every worker must own the same number)"
            )
        try:
            self.agent = create_agent(**agent_args)
            if device.type != "cpu":
                self.agent = self.agent.to(device)
            self.agent.seed(spec.agent_seed)
        except Exception as e:
            _mark(e, "agent factory")
            raise
        seed_global_rngs(spec.agent_seed, device)
        self.rollout = Rollout(
            self.env, self.agent, self._buffer, self._row, worker=spec.index, first_env=spec.offset
        )

    def load(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Loads weights into the agent (``agent.update``), between segments."""
        try:
            self.agent.update(state_dict)  # type: ignore[union-attr]
        except Exception as e:
            _mark(e, "agent update")
            raise

    def apply(self, blob: bytes) -> None:
        """Applies a non-tensor update (the bytes of ``transport.to_cpu_bytes``)."""
        self.load(from_cpu_bytes(blob))

    def reset(self, agent_info: DictTensor, env_info: DictTensor) -> int:
        """Resets every env and agent state; returns how many envs run."""
        self.rollout.reset(agent_info, env_info)  # type: ignore[union-attr]
        return self.rollout.n_running  # type: ignore[union-attr]

    def collect(
        self, buffer: SlotBuffer, version: int, agent_info: DictTensor | None = None
    ) -> int:
        """Collects one segment into ``buffer`` with the policy version ``version`` (and new
        per-row agent_info when given); returns how many envs still run."""
        rollout = self.rollout
        rollout.version = version  # type: ignore[union-attr]
        if agent_info is not None:
            rollout.set_agent_info(agent_info)  # type: ignore[union-attr]
        rollout.buffer = buffer  # type: ignore[union-attr]
        return rollout.run(self.spec.n_timesteps)  # type: ignore[union-attr]

    @staticmethod
    def cpu_seconds() -> float:
        """CPU seconds (user + system, all threads) this worker's process used so far: every
        worker reports it with each segment, so its CPU is counted wherever it runs."""
        return time.process_time()

    @staticmethod
    def where() -> dict[str, Any]:
        """The host name and pid of this worker's process."""
        return {"host": socket.gethostname(), "pid": os.getpid()}

    def error_payload(self, exc: BaseException) -> dict[str, Any]:
        """The report of ``exc`` (see :func:`error_payload`)."""
        return error_payload(exc, self.spec.index, self.rollout)

    def close(self) -> None:
        """Closes the env and the agent (never raises)."""
        for obj in (self.env, self.agent):
            with contextlib.suppress(Exception):  # close never raises: the failure is reported
                if obj is not None:
                    obj.close()
        self.env = self.agent = self.rollout = None
