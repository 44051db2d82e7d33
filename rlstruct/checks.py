"""``CheckDevice``: a transparent wrapper that enforces an agent's device contract.

The contract (see :mod:`rlstruct.agent`):

| argument         | when                               | must live on                     |
|------------------|------------------------------------|----------------------------------|
| ``state``        | before ``__call__``/``call_replay`` | ``device``                       |
| ``observation``  | before ``__call__``                 | ``device``                       |
| ``agent_info``   | before ``__call__``                 | the CPU (or be empty)            |
| ``trajectories`` | before ``call_replay``              | ``device``                       |
| ``action``       | after ``__call__``/``call_replay``  | ``device``                       |
| ``new_state``    | after ``__call__``/``call_replay``  | ``device``                       |
| ``initial_state``| after ``initial_state``             | ``device``                       |

A breach raises :class:`~rlstruct.errors.DeviceContractError` before the agent computes anything
(inputs) or as soon as it returns (outputs). The checks read each DictTensor's device, which the
DictTensor invariant keeps equal for all its tensors: no allocation, no copy, no host sync.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlstruct.agent import Agent
from rlstruct.dicttensor import DeviceLike, DictTensor, _same_device
from rlstruct.errors import DeviceContractError
from rlstruct.temporal import TemporalDictTensor
from rlstruct.trajectories import Trajectories

__all__ = ["CheckDevice"]

_CPU = torch.device("cpu")
_OWN = frozenset({"_agent", "_expected", "_where"})
_HINTS = {
    "agent_info": "agent_info stays on the CPU during acquisition; the agent moves what it needs",
    "action": "the agent must return its outputs on the device of its inputs",
    "new_state": "the agent must return its state on the device of its inputs",
    "initial_state": "initial_state must build the state on the agent's device",
    "trajectories": "move them with trajectories.to(device) before replaying",
}


class CheckDevice(Agent):
    """Wraps ``agent`` and checks the device of everything that enters or leaves it.

    Same interface, same behaviour, cheap to remove (like gymnasium's ``PassiveEnvChecker``):
    every method and attribute of the wrapped agent is forwarded (``seed``, ``update``,
    ``close``, ``to``, ``modules`` and any custom one); setting an attribute
    sets it on the wrapped agent. Only ``__call__``, ``call_replay`` and ``initial_state`` add
    checks (see the module docstring); other replay methods are forwarded unchecked.

    ``device="cuda"`` accepts tensors on any CUDA device (tensors always carry an index);
    ``"cuda:1"`` accepts only ``cuda:1``. :meth:`to` moves the wrapped agent and makes the new
    device the expected one.

    Args:
        agent: the agent to check.
        device: the device where state, observations, outputs and replayed trajectories live.

    Raises:
        DeviceContractError: on a breach, with ``argument``, ``key``, ``expected`` and
            ``actual`` set, e.g. ``observation['frame'] is on meta, expected cpu (CheckDevice
            around MyAgent)``.

    Examples:
        >>> class Echo(Agent):
        ...     def __call__(self, state, observation, agent_info):
        ...         return DictTensor({"action": observation["x"]}), state
        >>> agent = CheckDevice(Echo(), "cpu")
        >>> obs = DictTensor({"x": torch.zeros(2, device="meta")})
        >>> agent(DictTensor(batch_size=2), obs, DictTensor())
        Traceback (most recent call last):
        ...
        rlstruct.errors.DeviceContractError: observation['x'] is on meta, expected cpu (...)
    """

    def __init__(self, agent: Agent, device: DeviceLike) -> None:
        object.__setattr__(self, "_agent", agent)
        object.__setattr__(self, "_expected", torch.device(device))
        object.__setattr__(self, "_where", f"CheckDevice around {type(agent).__name__}")

    # ------------------------------------------------------------------ checked methods
    def __call__(
        self, state: DictTensor, observation: DictTensor, agent_info: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        """Checks the inputs, calls the agent, checks its outputs (see the module docstring)."""
        self._check(state, "state", self._expected)
        self._check(observation, "observation", self._expected)
        self._check(agent_info, "agent_info", _CPU)
        return self._check_result(self._agent(state, observation, agent_info))

    def call_replay(
        self, trajectories: Trajectories, t: int, state: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        """Checks trajectories and state, replays step ``t``, checks the outputs.

        ``agent_info`` is not checked here: in replay it comes from ``trajectories.info`` and
        lives on the trajectories' device.
        """
        if not isinstance(trajectories, Trajectories):
            raise TypeError(
                f"trajectories must be Trajectories, got {type(trajectories).__name__} "
                f"({self._where})"
            )
        self._check(trajectories.trajectories, "trajectories", self._expected)
        self._check(trajectories.info, "trajectories", self._expected)
        self._check(state, "state", self._expected)
        return self._check_result(self._agent.call_replay(trajectories, t, state))

    def initial_state(self, agent_info: DictTensor, n: int) -> DictTensor:
        """The wrapped agent's initial state, checked to be on ``device``.

        ``agent_info`` may live on the CPU (acquisition) or on ``device`` (replay).
        """
        state = self._agent.initial_state(agent_info, n)
        self._check(state, "initial_state", self._expected)
        return state

    # ------------------------------------------------------------------ forwarded methods
    def modules(self) -> dict[str, nn.Module]:
        """Forwarded to the wrapped agent."""
        return self._agent.modules()

    def to(self, device: DeviceLike) -> CheckDevice:
        """Moves the wrapped agent to ``device``, which becomes the expected device; returns
        the wrapper."""
        self._agent.to(device)
        object.__setattr__(self, "_expected", torch.device(device))
        return self

    def update(self, info: Any) -> None:
        """Forwarded to the wrapped agent."""
        self._agent.update(info)

    def seed(self, seed: int) -> None:
        """Forwarded to the wrapped agent."""
        self._agent.seed(seed)

    def close(self) -> None:
        """Forwarded to the wrapped agent."""
        self._agent.close()

    @property
    def unwrapped(self) -> Agent:
        """The innermost agent (through nested wrappers)."""
        return getattr(self._agent, "unwrapped", self._agent)

    @property
    def expected_device(self) -> torch.device:
        """The device the contract expects for state, observations, outputs, trajectories."""
        return self._expected

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails. While unpickling or copying, ``_agent`` is not
        # set yet: refuse instead of recursing.
        agent = self.__dict__.get("_agent")
        if agent is None or name in _OWN:
            raise AttributeError(name)
        return getattr(agent, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._agent, name, value)

    def __repr__(self) -> str:
        return f"CheckDevice({self._agent!r}, device={self._expected})"

    # ------------------------------------------------------------------ checks
    def _check(self, value: Any, argument: str, expected: torch.device) -> None:
        if not isinstance(value, DictTensor | TemporalDictTensor):
            raise TypeError(
                f"{argument} must be a DictTensor, got {type(value).__name__} ({self._where})"
            )
        actual = value.device()
        if actual is None or _same_device(actual, expected):
            return
        key = next(iter(value.keys()), None)
        if key is None:
            if isinstance(value, DictTensor):  # empty: no tensor to misplace
                return
            key = "lengths"
        for k, v in value.items():  # the failure path only: name the first offending key
            if not _same_device(v.device, expected):
                key, actual = k, v.device
                break
        hint = _HINTS.get(argument)
        raise DeviceContractError(
            f"{argument}[{key!r}] is on {actual}, expected {expected} ({self._where})"
            + (f"; {hint}" if hint else ""),
            argument=argument,
            key=key,
            expected=expected,
            actual=actual,
        )

    def _check_result(self, result: Any) -> tuple[DictTensor, DictTensor]:
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(
                f"the agent must return (action, new_state), got {type(result).__name__} "
                f"({self._where})"
            )
        action, new_state = result
        self._check(action, "action", self._expected)
        self._check(new_state, "new_state", self._expected)
        return result
