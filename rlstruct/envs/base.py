"""The ``VecEnv`` contract: ``N`` environments stepped together on DictTensors.

    obs, running = env.reset(env_info)           # obs: DictTensor (N, ...), running: (N,) long
    (obs_t1, was_running), (obs_next, still_running) = env.step(action)

- ``reset(env_info=None)``: resets all ``N`` envs (``env_info``: DictTensor ``(N, ...)`` passed to
  each gymnasium env as ``reset(options={k: row})``). Returns the first observation of every env
  and ``running = arange(N)``.
- ``step(action)``: ``action`` is a DictTensor with one row per running env, in the order of
  ``running``. Returns ``obs_t1`` (the env's answer to the action: next observation, ``reward``,
  ``terminated``, ``truncated``, ``done``, ...) for the envs in ``was_running`` (the ``running`` of
  the call), and ``obs_next`` (the observation the agent sees next) for ``still_running``.
  Episodic envs drop finished envs from ``still_running``; auto-reset envs keep all ``N`` and put
  the reset observation in ``obs_next`` (``obs_t1`` keeps the TRUE final observation).
- Every observation DictTensor holds the env's own keys (``frame`` or one key per leaf of a Dict
  or Tuple space) plus ``reward`` (float32), ``terminated``, ``truncated``, ``done`` (bool),
  ``initial_state`` (bool), ``last_action``, ``env_step`` (int64). The same keys, shapes and dtypes
  appear at reset and at every step.
- An exception raised by env ``k`` (local index) during ``step`` or ``reset`` carries
  ``exc.env_index = k``; batchers add their offset to report the GLOBAL env index. Its message
  names the env by its global index: ``offset + k``, where a batcher sets ``offset`` with
  ``set_env_id_offset`` right after ``create_env`` (worker ``w`` of ``n`` envs each: ``w * n``).
- A float observation holding NaN or an infinity raises :class:`~rlstruct.errors.ObservationError`
  in the ``step`` or ``reset`` that produced it, before any agent sees it (``check_obs=True``, the
  default of rlstruct's VecEnvs).
- ``n_envs()`` has no side effect; ``close()`` releases the envs; ``action_space`` and
  ``observation_space`` are the single-env gymnasium spaces.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import gymnasium as gym
import torch
from torch import Tensor

from rlstruct.dicttensor import DictTensor

__all__ = ["VecEnv"]

StepResult = tuple[tuple[DictTensor, Tensor], tuple[DictTensor, Tensor]]


class VecEnv(ABC):
    """``N`` environments behind one batched, DictTensor-based interface (see module doc)."""

    action_space: gym.Space
    observation_space: gym.Space

    @abstractmethod
    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, Tensor]:
        """Resets every env; returns ``(observation (N, ...), running = arange(N))``."""

    @abstractmethod
    def step(self, action: DictTensor) -> StepResult:
        """Steps the running envs; returns ``((obs_t1, was_running), (obs_next, running))``."""

    @abstractmethod
    def n_envs(self) -> int:
        """``N``, the number of envs (no side effect)."""

    @property
    def device(self) -> torch.device:
        """Where the env's observations and running indices live and where ``step`` takes its
        actions: the CPU unless a subclass says otherwise (a torch-native env: its own device;
        ``DeviceEnv``: its ``to_device``). Batchers wrap an env in a ``DeviceEnv`` only when
        this is not their device."""
        return torch.device("cpu")

    def set_env_id_offset(self, offset: int) -> None:  # noqa: B027 - optional hook
        """Tells the VecEnv the GLOBAL index of its env 0, which its error messages name (env
        ``k`` is ``offset + k``). Batchers call it right after ``create_env`` with the worker's
        first global env index, so that messages agree with ``WorkerError.env``; the default
        does nothing (a VecEnv without such messages need not override it).

        Args:
            offset: the global index of env 0 (>= 0).
        """

    def close(self) -> None:  # noqa: B027 - envs without resources need not override
        """Releases the envs."""

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
