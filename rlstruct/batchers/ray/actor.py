"""The body of a ``RayBatcher`` actor: a :class:`~rlstruct.batchers.core.WorkerCore` (the same
worker core as a ``Batcher`` process worker) behind four calls, ``start``, ``reset``, ``execute``
and ``close``.

Every call answers ``("ok", value)`` or ``("error", payload)``, where ``payload`` is the worker
core's error report (type, message, traceback, worker, global env, step, phase): an exception
never leaves the actor, so Ray never wraps it. Updates arrive as a list of ``(kind, version,
ref)`` ops (``kind`` is ``"weights"`` or ``"info"``), loaded oldest first at the start of the next
call, never in the middle of a segment.

Nothing here imports Ray: :class:`rlstruct.batchers.ray.remote.RayBatcherWorker` adds the two calls
that need it (fetching the ops' objects, naming the node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlstruct.batchers.buffer import SlotBuffer, Specs
from rlstruct.batchers.core import CoreSpec, WorkerCore, error_payload
from rlstruct.batchers.ray.wire import from_wire, readonly_ok, to_wire
from rlstruct.dicttensor import DictTensor

__all__ = ["ActorSpec", "ActorBody", "Op", "Reply"]

#: An update queued for an actor: ``(kind, version, object ref)``.
Op = tuple[str, int, Any]
#: An actor's answer: ``("ok", value)`` or ``("error", payload)``.
Reply = tuple[str, Any]


@dataclass
class ActorSpec(CoreSpec):
    """Everything one actor needs (sent once, when the actor is created)."""

    step_specs: Specs
    info_specs: Specs
    timeout: float  # seconds to fetch an update's objects


class ActorBody:
    """One actor's worker core, its own buffer of its ``n`` rows, and its staging weights."""

    def __init__(self, spec: ActorSpec) -> None:
        self.spec = spec
        self.buffer: SlotBuffer | None = None
        self.core: WorkerCore | None = None
        self.staging: dict[str, torch.Tensor] = {}

    def _error(self, exc: BaseException) -> Reply:
        if self.core is None:
            return "error", error_payload(exc, self.spec.index, None)
        return "error", self.core.error_payload(exc)

    def _fetch(self, refs: list[Any]) -> list[Any]:
        """The objects of ``refs`` (a Ray call)."""
        raise NotImplementedError

    def _where(self) -> dict[str, Any]:
        """Where the actor runs: ``{"node": ..., "host": ..., "pid": ...}`` (a Ray call)."""
        raise NotImplementedError

    def start(self) -> Reply:
        """Builds env, agent and rollout; answers where the actor runs."""
        spec = self.spec
        try:
            device = torch.device(spec.device)
            buffer = SlotBuffer(
                spec.n_envs, spec.n_timesteps, spec.step_specs, spec.info_specs, device
            )
            # Row 0 of the actor's buffer holds the env of global index spec.offset.
            self.buffer, self.core = buffer, WorkerCore(spec, buffer, 0)
            self.core.build()
            return "ok", self._where()
        except BaseException as e:  # noqa: BLE001 - answered to the batcher, which raises it
            return self._error(e)

    def _apply(self, ops: Sequence[Op]) -> None:
        """Loads the updates queued since the last call, oldest first."""
        if not ops:
            return
        values = self._fetch([ref for _kind, _version, ref in ops])
        for (kind, _version, _ref), value in zip(ops, values):
            if kind == "weights":
                self.core.load(self._stage(value))  # type: ignore[union-attr]
            else:
                self.core.apply(value)  # type: ignore[union-attr]

    def _stage(self, arrays: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The weights copied out of the object store into this actor's own tensors (the
        store's views are shared by every actor of the node and read-only)."""
        with readonly_ok():
            for key, value in arrays.items():
                src = from_wire(value)
                dst = self.staging.get(key)
                if dst is None or dst.shape != src.shape or dst.dtype != src.dtype:
                    dst = self.staging[key] = torch.empty_like(src)
                dst.copy_(src)
        return {key: self.staging[key] for key in arrays}

    def reset(self, ops: Sequence[Op], agent_info: DictTensor, env_info: DictTensor) -> Reply:
        """Loads queued updates, resets every env and agent state; answers ``n_running``."""
        try:
            self._apply(ops)
            return "ok", self.core.reset(agent_info, env_info)  # type: ignore[union-attr]
        except BaseException as e:  # noqa: BLE001 - answered to the batcher, which raises it
            return self._error(e)

    def execute(self, ops: Sequence[Op], version: int, agent_info: DictTensor | None) -> Reply:
        """Loads queued updates, collects one segment; answers its rows (numpy arrays)."""
        try:
            self._apply(ops)
            buffer = self.buffer
            n_running = self.core.collect(buffer, version, agent_info)  # type: ignore[union-attr]
            t = int(buffer.lengths.max()) if buffer.lengths.numel() else 0
            # Everything this segment wrote lies in steps [0, t): the driver's copy of these
            # rows stays equal to this buffer (padding included).
            return "ok", {
                "n_running": n_running,
                "cpu_s": self.core.cpu_seconds(),  # type: ignore[union-attr]
                "t": t,
                "lengths": to_wire(buffer.lengths),
                "steps": {k: to_wire(v[:t]) for k, v in buffer.steps.items()},
                "info": {k: to_wire(v) for k, v in buffer.info.items()},
            }
        except BaseException as e:  # noqa: BLE001 - answered to the batcher, which raises it
            return self._error(e)

    def close(self) -> None:
        """Closes the envs and the agent (the batcher kills the actor afterwards)."""
        if self.core is not None:
            self.core.close()
