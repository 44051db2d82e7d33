"""``MountainCar``: gymnasium's ``MountainCar-v0`` as a batched tensor computation.

Physics (Moore 1990; Sutton and Barto's book): a car on the curve ``y = sin(3 x)`` whose engine
is too weak to climb it directly. Action ``a`` in ``{0, 1, 2}`` pushes with force
``(a - 1) * 0.001``; gravity pulls along the slope with ``-0.0025 cos(3 x)``:

    v' = clip(v + (a - 1) * 0.001 - 0.0025 cos(3 x), -0.07, 0.07)
    x' = clip(x + v', -1.2, 0.6),  and v' = 0 when x' hits -1.2 while moving left

Reward -1 per step; the episode terminates when ``x' >= 0.5`` (with ``v' >= 0``, the goal
velocity); time limit 200 steps (``MountainCar-v0``). State ``(position, velocity)``,
observed as float32; initial position uniform in ``[low, high]`` (reset options ``low``,
``high``; default ``[-0.6, -0.4]``), velocity 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from rlstruct.envs.torch.base import TorchVecEnv
from rlstruct.envs.torch.uniform_reset import check_low_high

__all__ = ["MountainCar"]

MIN_POSITION = -1.2
MAX_POSITION = 0.6
MAX_SPEED = 0.07
GOAL_POSITION = 0.5
GOAL_VELOCITY = 0.0
FORCE = 0.001
GRAVITY = 0.0025


class MountainCar(TorchVecEnv):
    """``N`` MountainCar-v0 envs in one state tensor ``(N, 2)``: ``(position, velocity)``.

    Observation ``Box((2,), float32)`` and action ``Discrete(3)`` (0 left, 1 none, 2 right) as
    in gymnasium; see the module doc for the dynamics and :class:`TorchVecEnv` for the
    arguments.

    Examples:
        >>> env = MountainCar(n_envs=2, seed=0)
        >>> obs, _ = env.reset()
        >>> env.state[:, 1].tolist(), env.max_episode_steps
        ([0.0, 0.0], 200)
    """

    observation_space = spaces.Box(
        np.array([MIN_POSITION, -MAX_SPEED], dtype=np.float32),
        np.array([MAX_POSITION, MAX_SPEED], dtype=np.float32),
        dtype=np.float32,
    )
    action_space = spaces.Discrete(3)
    state_size = 2
    n_draws = 1
    default_max_episode_steps = 200
    reset_options: ClassVar[Mapping[str, float]] = {"low": -0.6, "high": -0.4}

    def initial_state(self, u: Tensor, options: Mapping[str, Tensor]) -> Tensor:
        """Position uniform in ``[low, high]``, velocity 0: ``(n, 2)`` from ``u`` ``(n, 1)``."""
        low, high = options["low"], options["high"]
        position = low + (high - low) * u[:, 0]
        return torch.stack((position, torch.zeros_like(position)), dim=1)

    def check_options(self, options: Mapping[str, Tensor]) -> None:
        """``low <= high`` for every env."""
        check_low_high(options)

    def dynamics(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One step of ``n`` cars: ``(next_state (n, 2), reward (n,), terminated (n,))``.

        Args:
            state: ``(n, 2)``.
            action: int64 ``(n,)`` in ``{0, 1, 2}``.
        """
        position, velocity = state.unbind(1)
        push = (action - 1).to(state.dtype) * FORCE
        velocity = velocity + (push + torch.cos(3 * position) * (-GRAVITY))
        velocity = velocity.clamp(-MAX_SPEED, MAX_SPEED)
        position = (position + velocity).clamp(MIN_POSITION, MAX_POSITION)
        velocity = velocity.masked_fill((position == MIN_POSITION) & (velocity < 0), 0.0)
        terminated = (position >= GOAL_POSITION) & (velocity >= GOAL_VELOCITY)
        reward = torch.full((state.shape[0],), -1.0, dtype=torch.float32, device=state.device)
        return torch.stack((position, velocity), dim=1), reward, terminated

    def observe(self, state: Tensor) -> Tensor:
        """The state as float32 ``(n, 2)`` (a copy)."""
        return state.to(torch.float32, copy=True)
