"""The ``Agent`` base class: the policy a batcher runs and ``replay_agent`` re-runs.

Contract of ``__call__`` (one step over a batch of ``n`` environments, all tensors on the agent's
device, ``agent_info`` on the CPU or empty):

    action, new_state = agent(state, observation, agent_info)

- ``state``: DictTensor ``(n, ...)``, the agent's recurrent state (empty for memoryless agents).
  The agent resets the rows where ``observation["initial_state"]`` is true (use
  :meth:`Agent.initial_state` and :func:`rlstruct.masked_dicttensor`).
- ``observation``: DictTensor ``(n, ...)`` with the env's keys (``frame`` or one key per leaf,
  ``reward``, ``terminated``, ``truncated``, ``done``, ``initial_state``, ``last_action``,
  ``env_step``).
- ``agent_info``: DictTensor ``(n, ...)`` of per-row parameters (epsilon, greedy flag, ...).
  During replay it comes from ``trajectories.info`` and lives on the trajectories' device.
- returns ``action`` (must hold the key ``action``; extra keys such as probabilities or values are
  stored in the trajectories too) and ``new_state`` (same keys and shapes as ``state``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from rlstruct import keys as K
from rlstruct.dicttensor import DeviceLike, DictTensor
from rlstruct.trajectories import Trajectories

__all__ = ["Agent"]


class Agent:
    """Base class of the policies that batchers run.

    Subclasses implement :meth:`__call__` and, for recurrent agents, :meth:`initial_state`.
    Models are ``torch.nn.Module`` attributes of the agent: :meth:`to` moves them all and the
    default :meth:`update` loads a ``state_dict`` into the agent's only module.
    """

    def initial_state(self, agent_info: DictTensor, n: int) -> DictTensor:
        """The state of ``n`` fresh rows (default: empty, a memoryless agent).

        Args:
            agent_info: DictTensor ``(n, ...)`` of per-row parameters (may be empty).
            n: number of rows.

        Returns:
            DictTensor ``(n, ...)``.
        """
        return DictTensor(batch_size=n)

    def __call__(
        self, state: DictTensor, observation: DictTensor, agent_info: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        """One step over ``n`` rows; see the module docstring for the contract.

        Returns:
            ``(action, new_state)``: DictTensors ``(n, ...)``; ``action`` holds ``"action"``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")

    def call_replay(
        self, trajectories: Trajectories, t: int, state: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        """The default replay step: calls the agent on step ``t`` of stored trajectories.

        :func:`rlstruct.agent_replay.replay_agent` calls it for ``t = 0 .. T-1``;
        :func:`rlstruct.agent_replay.replay_agent_stateless` calls it once with ``t = 0`` on the
        ``B * T`` steps flattened into trajectories of one step. Override it (or pass another
        method name to the replay functions) to compute extra outputs during replay.

        Args:
            trajectories: Trajectories ``(B, T, ...)`` on the agent's device.
            t: the time step.
            state: DictTensor ``(B, ...)``, the state before step ``t``.

        Returns:
            ``(action, new_state)`` as :meth:`__call__` returns them (with gradients).
        """
        observation = trajectories.trajectories.temporal_index(t).truncate_key(K.OBSERVATION)
        agent_info = trajectories.info.truncate_key(K.AGENT_INFO)
        return self(state, observation, agent_info)

    def modules(self) -> dict[str, nn.Module]:
        """The agent's ``torch.nn.Module`` attributes, by name."""
        return {k: v for k, v in vars(self).items() if isinstance(v, nn.Module)}

    def to(self, device: DeviceLike) -> Agent:
        """Moves every module attribute to ``device``; returns self."""
        for module in self.modules().values():
            module.to(device)
        return self

    def update(self, info: Any) -> None:
        """Refreshes the agent, by default by loading a ``state_dict`` into its only module.

        Args:
            info: a ``state_dict`` (mapping of tensors); subclasses may accept anything.
        """
        modules = self.modules()
        if isinstance(info, Mapping) and len(modules) == 1:
            module = next(iter(modules.values()))
            device = next(module.parameters(), torch.empty(0)).device
            module.load_state_dict({k: v.to(device) for k, v in info.items()})
            return
        raise NotImplementedError(
            f"{type(self).__name__}.update: the default loads a state_dict into the agent's only "
            f"module, but it has {len(modules)} ({sorted(modules)}); override update()"
        )

    def seed(self, seed: int) -> None:
        """Seeds the agent's own random generators (default: nothing to seed)."""

    def close(self) -> None:
        """Releases the agent's resources (default: nothing)."""
