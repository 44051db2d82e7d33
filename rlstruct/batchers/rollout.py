"""The ONE acquisition loop, shared by ``SerialBatcher`` and the workers of ``Batcher``.

A :class:`Rollout` owns a VecEnv of ``n`` envs, an agent and the rows ``[offset, offset + n)`` of a
:class:`~rlstruct.batchers.buffer.SlotBuffer`. Per step it calls the agent ONCE over all running
envs, steps the envs, and writes observation, action and the env's answer into the buffer by
index. Nothing is concatenated, unfolded or pickled per step.

Right after each agent call it checks the agent's outputs (a DictTensor holding ``action``, on the
batcher's device, the buffer's): a breach is the agent's fault and is reported as such
(:class:`DeviceContractError` naming the agent, the key, both devices, worker and step), not as
an error of the env that would receive the action. A ``DeviceContractError`` raised inside the
agent's call (e.g. a DictTensor built from tensors on two devices) is re-raised naming the agent.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.agent import Agent
from rlstruct.batchers.buffer import SlotBuffer, Specs
from rlstruct.dicttensor import DictTensor, _same_device
from rlstruct.envs.base import VecEnv
from rlstruct.errors import (
    BatcherStateError,
    DeviceContractError,
    KeyMismatchError,
    ObservationError,
    ShapeError,
)

__all__ = ["Rollout", "infer_specs", "StepContext"]


class StepContext:
    """Where a failure happened, attached to the exception as ``exc.rlstruct_context``."""

    __slots__ = ("phase", "step", "env")

    def __init__(self, phase: str, step: int | None, env: int | None) -> None:
        self.phase = phase
        self.step = step
        self.env = env


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(note)


def _annotate(exc: BaseException, phase: str, step: int | None, env: int | None) -> None:
    if getattr(exc, "rlstruct_context", None) is None:
        exc.rlstruct_context = StepContext(phase, step, env)  # type: ignore[attr-defined]


def _locate_observation(exc: BaseException, worker: int, step: int | None) -> None:
    """Fills in the worker and the segment's step of an :class:`ObservationError`."""
    if isinstance(exc, ObservationError) and exc.worker is None:
        exc.worker, exc.step = worker, step


def _agent_name(agent: Agent) -> str:
    inner = getattr(agent, "unwrapped", agent)  # CheckDevice and other wrappers
    return type(inner).__name__


def _checkdevice_hint(device: torch.device) -> str:
    return (
        f"wrap the agent with rlstruct.CheckDevice(agent, {str(device)!r}) to find where in the "
        "agent it happens"
    )


def _agent_device_error(
    exc: DeviceContractError, agent: Agent, where: str, device: torch.device | None
) -> DeviceContractError:
    """A DeviceContractError raised inside the agent's call, re-raised naming the agent."""
    hint = ""
    if device is not None and "CheckDevice" not in str(exc):
        hint = (
            f"; every tensor the agent puts in a DictTensor or returns must live on {device}, "
            f"the batcher's device: {_checkdevice_hint(device)}"
        )
    return DeviceContractError(
        f"{where}: the agent's call ({_agent_name(agent)}.__call__) raised: {exc}{hint}",
        argument=exc.argument or "action",
        key=exc.key,
        expected=exc.expected,
        actual=exc.actual,
    )


def _check_agent_output(
    action: Any, new_state: Any, agent: Agent, device: torch.device, worker: int, step: int
) -> None:
    """Checks what the agent's call returned: a DictTensor ``action`` holding ``"action"`` and a
    DictTensor ``new_state``, every tensor on ``device`` (the batcher's).

    The common path reads each DictTensor's device (one for all its tensors, by the container's
    invariant): a few comparisons per step, no copy, no host sync, no string built.

    Raises:
        TypeError: an output is not a DictTensor.
        KeyMismatchError: ``action`` lacks the key ``"action"``.
        DeviceContractError: an output lives on another device; ``argument`` is ``action`` or
            ``new_state``, ``key`` the trajectory key (``action/action``) or the state key.
    """
    if (
        isinstance(action, DictTensor)
        and isinstance(new_state, DictTensor)
        and action.device() == device
        and K.ACTION_KEY in action
        and (new_state.empty() or new_state.device() == device)
    ):
        return
    where = f"worker {worker}, step {step}"
    name = _agent_name(agent)
    for argument, out in (("action", action), ("new_state", new_state)):
        if not isinstance(out, DictTensor):
            raise TypeError(
                f"{where}: the agent {name} returned {argument} as {type(out).__name__}; it must "
                "return (action, new_state), two DictTensors"
            )
        actual = out.device()
        if actual is None or out.empty() or _same_device(actual, device):
            continue
        keys = sorted(out.keys(), key=lambda k: k != K.ACTION_KEY)  # name "action" first
        key = next((k for k in keys if not _same_device(out[k].device, device)), keys[0])
        actual = out[key].device
        full = K.ACTION + key if argument == "action" else f"new_state[{key!r}]"
        raise DeviceContractError(
            f"{where}: the agent {name} returned {full} on {actual}, expected {device} (the "
            "batcher's device); the agent is the culprit, not the env: it must return its "
            f"outputs on the device of its observations; {_checkdevice_hint(device)}",
            argument=argument,
            key=full if argument == "action" else key,
            expected=device,
            actual=actual,
        )
    if K.ACTION_KEY not in action:
        raise KeyMismatchError(
            f"{where}: the agent {name} returned keys {sorted(action.keys())}; it must return "
            "the key 'action'"
        )


def _info_specs(prefix: str, dt: DictTensor) -> dict[str, tuple[torch.Size, torch.dtype]]:
    return {prefix + k: spec for k, spec in dt.specs().items()}


def infer_specs(
    env: VecEnv, agent: Agent, agent_info: DictTensor, env_info: DictTensor
) -> tuple[Specs, Specs]:
    """Runs one reset and one agent call to learn every key, shape and dtype a segment holds.

    Args:
        env: a fresh VecEnv (it is reset).
        agent: the agent (called once under ``no_grad``).
        agent_info: DictTensor ``(n, ...)`` on the CPU.
        env_info: DictTensor ``(n, ...)`` on the CPU.

    Returns:
        ``(step_specs, info_specs)`` with full keys.
    """
    n = env.n_envs()
    obs, _ = env.reset(None if env_info.empty() else env_info)
    state = agent.initial_state(agent_info, n)
    try:
        with torch.no_grad():
            action, _ = agent(state, obs, agent_info)
    except DeviceContractError as e:
        raise _agent_device_error(e, agent, "the batcher's first agent call", obs.device()) from e
    except KeyError as e:
        if agent_info.empty():
            _add_note(
                e,
                "The batcher calls the agent once to learn its outputs. If the agent "
                "reads agent_info, give the batcher an example: agent_info=DictTensor({...})",
            )
        raise
    if K.ACTION_KEY not in action:
        raise KeyMismatchError(
            f"the agent returned keys {sorted(action.keys())}; it must return the key 'action'"
        )
    step_specs = {
        **_info_specs(K.OBSERVATION, obs),
        **_info_specs(K.ACTION, action),
        **_info_specs(K.NEXT_OBSERVATION, obs),
    }
    info_specs = {
        **_info_specs(K.AGENT_INFO, agent_info),
        **_info_specs(K.ENV_INFO, env_info),
        **_info_specs(K.AGENT_STATE, state),
        K.ENV_ID: (torch.Size(), torch.long),
        K.POLICY_VERSION: (torch.Size(), torch.long),
    }
    return step_specs, info_specs


class Rollout:
    """The acquisition loop of one process over one VecEnv.

    Args:
        env: the VecEnv (``n`` envs), already on the batcher's device (e.g. via DeviceEnv).
        agent: the agent, on the batcher's device.
        buffer: the slot buffer; this rollout writes rows ``[offset, offset + n)``.
        offset: the first buffer row.
        worker: the worker index (for error messages).
        first_env: the global id of env 0 (default: ``offset``; a worker that fills a buffer
            of its own rows only, such as a Ray actor, writes rows from 0 but names its envs
            from its place in the whole batch).
    """

    def __init__(
        self,
        env: VecEnv,
        agent: Agent,
        buffer: SlotBuffer,
        offset: int,
        worker: int = 0,
        first_env: int | None = None,
    ) -> None:
        self.env = env
        self.agent = agent
        self.buffer = buffer
        self.n = env.n_envs()
        self.offset = offset
        self.first_env = offset if first_env is None else first_env
        self.worker = worker
        self.version = 0
        device = buffer.lengths.device
        self._device = device
        self._all_rows = slice(offset, offset + self.n)
        self._env_ids = torch.arange(self.first_env, self.first_env + self.n, device=device)
        self._running: Tensor | None = None
        self._obs: DictTensor | None = None
        self._state: DictTensor | None = None
        self.agent_info = DictTensor(batch_size=self.n, device="cpu")
        self.env_info = DictTensor(batch_size=self.n, device="cpu")
        self._agent_info_running: DictTensor | None = None

    @property
    def n_running(self) -> int:
        """Envs still running (0 before the first reset)."""
        return 0 if self._running is None else int(self._running.shape[0])

    def set_agent_info(self, agent_info: DictTensor) -> None:
        """Replaces the per-row agent_info (``(n, ...)``, CPU) used from the next step on."""
        self.agent_info = agent_info
        self._agent_info_running = None

    def reset(self, agent_info: DictTensor, env_info: DictTensor) -> None:
        """Resets every env and the agent state of every row."""
        self.set_agent_info(agent_info)
        self.env_info = env_info
        try:
            obs, running = self.env.reset(None if env_info.empty() else env_info)
        except Exception as e:
            env = getattr(e, "env_index", None)
            _annotate(e, "env reset", None, None if env is None else env + self.first_env)
            _locate_observation(e, self.worker, None)
            raise
        self._obs = obs
        self._running = running.to(self.buffer.lengths.device)
        try:
            self._state = self.agent.initial_state(agent_info, self.n)
        except Exception as e:
            _annotate(e, "agent initial_state", None, None)
            raise

    def _rows(self, running: Tensor) -> tuple[Tensor | slice, bool]:
        if running.shape[0] == self.n:
            return self._all_rows, True
        return running + self.offset, False

    def run(self, n_timesteps: int) -> int:
        """Collects one segment of at most ``n_timesteps`` steps into the buffer.

        Returns:
            The number of envs still running after the segment.
        """
        if self._running is None or self._obs is None or self._state is None:
            raise BatcherStateError("execute() before reset(): call reset() first")
        buffer, n, offset = self.buffer, self.n, self.offset
        buffer.lengths[offset : offset + n] = 0
        running, obs, state = self._running, self._obs, self._state
        if running.shape[0] == 0:
            return 0
        rows, full = self._rows(running)
        agent_info = self._running_agent_info(running, full)
        info = {
            **{K.AGENT_INFO + k: v for k, v in agent_info.items()},
            **{K.ENV_INFO + k: v for k, v in self._index_cpu(self.env_info, running, full).items()},
            **{K.AGENT_STATE + k: v for k, v in state.items()},
            K.ENV_ID: self._env_ids[running] if not full else self._env_ids,
            K.POLICY_VERSION: torch.full(
                (running.shape[0],), self.version, dtype=torch.long, device=buffer.lengths.device
            ),
        }
        buffer.write_info(info, rows)
        where = f"worker {self.worker}"
        n_steps = 0
        with torch.no_grad():
            for t in range(n_timesteps):
                n_run = running.shape[0]
                try:
                    action, new_state = self.agent(state, obs, agent_info)
                except DeviceContractError as e:
                    error = _agent_device_error(e, self.agent, f"{where}, step {t}", self._device)
                    _annotate(error, "agent call", t, None)
                    raise error from e
                except Exception as e:
                    _annotate(e, "agent call", t, None)
                    raise
                try:
                    _check_agent_output(action, new_state, self.agent, self._device, self.worker, t)
                except Exception as e:
                    _annotate(e, "agent call", t, None)
                    raise
                if action.n_elems() != n_run:
                    error = ShapeError(
                        f"{where}, step {t}: the agent returned {action.n_elems()} action rows "
                        f"for {n_run} running envs"
                    )
                    _annotate(error, "agent call", t, None)
                    raise error
                try:
                    (obs_t1, _was_running), (obs_next, still_running) = self.env.step(action)
                except Exception as e:
                    env = getattr(e, "env_index", None)
                    _annotate(e, "env step", t, None if env is None else env + self.first_env)
                    _locate_observation(e, self.worker, t)
                    raise
                try:
                    buffer.write_steps((obs, action, obs_t1), rows, n_run, t, where)
                except Exception as e:
                    _annotate(e, "buffer write", t, None)
                    raise
                n_steps = t + 1
                if still_running.shape[0] != n_run:
                    # Rows that stop here have n_steps valid steps; the others get theirs below.
                    buffer.lengths[rows] = n_steps
                    still_running = still_running.to(running.device)
                    keep = torch.searchsorted(running, still_running)
                    new_state = self._keep_rows(new_state, keep)
                    running = still_running
                    rows, full = self._rows(running)
                    agent_info = self._running_agent_info(running, full)
                obs, state = obs_next, new_state
                if running.shape[0] == 0:
                    break
        if running.shape[0]:
            buffer.lengths[rows] = n_steps
        self._running, self._obs, self._state = running, obs, state
        return int(running.shape[0])

    @staticmethod
    def _keep_rows(state: DictTensor, keep: Tensor) -> DictTensor:
        if state.empty():
            return DictTensor(batch_size=int(keep.shape[0]), device=state.device())
        return state.index(keep)

    @staticmethod
    def _index_cpu(dt: DictTensor, running: Tensor, full: bool) -> DictTensor:
        if full or dt.empty():
            return dt if full else DictTensor(batch_size=int(running.shape[0]), device="cpu")
        return dt.index(running.cpu())

    def _running_agent_info(self, running: Tensor, full: bool) -> DictTensor:
        cached = self._agent_info_running
        if cached is None or cached.n_elems() != running.shape[0]:
            cached = self._index_cpu(self.agent_info, running, full)
            self._agent_info_running = cached
        return cached

    def describe_failure(self, exc: BaseException) -> dict[str, Any]:
        """Worker, env and step of a failure, for error reports."""
        ctx = getattr(exc, "rlstruct_context", None)
        return {
            "worker": self.worker,
            "env": None if ctx is None else ctx.env,
            "step": None if ctx is None else ctx.step,
            "phase": None if ctx is None else ctx.phase,
        }
