"""``Pendulum``: gymnasium's ``Pendulum-v1`` as a batched tensor computation (continuous action).

Physics: a rigid pendulum of mass ``m = 1`` and length ``l = 1`` (a rod: moment of inertia
``m l^2 / 3`` about its pivot) under gravity ``g = 10``, with ``theta = 0`` upright, driven by
a torque ``u`` in ``[-2, 2]``. Its angular acceleration is ``3 g / (2 l) sin theta + 3 u /
(m l^2)``; one semi-implicit Euler step of ``dt = 0.05`` s updates the velocity first
(clipped to ``[-8, 8]``), then the angle with the new velocity. The reward is
``-(normalize(theta)^2 + 0.1 theta_dot^2 + 0.001 u^2)`` on the state BEFORE the step
(``normalize`` maps an angle into ``[-pi, pi)``); the episode never terminates; time limit 200
steps (``Pendulum-v1``). State ``(theta, theta_dot)`` (``theta`` is not wrapped, as in
gymnasium); observation ``(cos theta, sin theta, theta_dot)`` as float32; initial state uniform
in ``[-x_init, x_init] x [-y_init, y_init]`` (reset options ``x_init``, ``y_init``; default
``pi`` and 1).

The torque stays float32 (the action space's dtype) in the terms where gymnasium keeps it
float32, so float64 rewards agree with gymnasium's to the last bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from rlstruct.envs.torch.base import TorchVecEnv

__all__ = ["Pendulum", "angle_normalize"]

MAX_SPEED = 8
MAX_TORQUE = 2.0
DT = 0.05
G = 10.0
M = 1.0
L = 1.0
TWO_PI = 2 * np.pi


def angle_normalize(x: Tensor) -> Tensor:
    """``x`` mapped into ``[-pi, pi)``: ``((x + pi) mod 2 pi) - pi`` with an exact remainder
    (``fmod``, then one turn added to negative results: numpy's ``%`` on floats)."""
    r = torch.fmod(x + np.pi, TWO_PI)
    return torch.where(r < 0, r + TWO_PI, r) - np.pi


class Pendulum(TorchVecEnv):
    """``N`` Pendulum-v1 envs in one state tensor ``(N, 2)``: ``(theta, theta_dot)``.

    Observation ``Box((3,), float32)`` and action ``Box(-2, 2, (1,), float32)`` as in
    gymnasium; see the module doc for the dynamics and :class:`TorchVecEnv` for the arguments.

    Examples:
        >>> from rlstruct import DictTensor
        >>> env = Pendulum(n_envs=2, seed=0, auto_reset=True)
        >>> obs, _ = env.reset()
        >>> action = DictTensor({"action": torch.zeros(2, 1)})
        >>> (obs_t1, _), _ = env.step(action)
        >>> obs_t1["frame"].shape, obs_t1["last_action"].shape, bool(obs_t1["terminated"].any())
        (torch.Size([2, 3]), torch.Size([2, 1]), False)
    """

    observation_space = spaces.Box(
        low=-np.array([1.0, 1.0, MAX_SPEED], dtype=np.float32),
        high=np.array([1.0, 1.0, MAX_SPEED], dtype=np.float32),
        dtype=np.float32,
    )
    action_space = spaces.Box(low=-MAX_TORQUE, high=MAX_TORQUE, shape=(1,), dtype=np.float32)
    state_size = 2
    n_draws = 2
    default_max_episode_steps = 200
    reset_options: ClassVar[Mapping[str, float]] = {"x_init": math.pi, "y_init": 1.0}

    def initial_state(self, u: Tensor, options: Mapping[str, Tensor]) -> Tensor:
        """``theta`` uniform in ``[-x_init, x_init]``, ``theta_dot`` in ``[-y_init, y_init]``."""
        high = torch.stack((options["x_init"], options["y_init"]), dim=1)
        low = -high
        return low + (high - low) * u

    def dynamics(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One step of ``n`` pendulums: ``(next_state (n, 2), reward (n,), terminated (n,))``.

        Args:
            state: ``(n, 2)``.
            action: float32 ``(n, 1)``, the torque (clipped to ``[-2, 2]``).
        """
        theta, theta_dot = state.unbind(1)
        u = action[:, 0].clamp(-MAX_TORQUE, MAX_TORQUE)
        costs = angle_normalize(theta) ** 2 + 0.1 * theta_dot**2 + 0.001 * (u**2)
        acc = 3 * G / (2 * L) * torch.sin(theta) + 3.0 / (M * L**2) * u
        theta_dot = (theta_dot + acc * DT).clamp(-MAX_SPEED, MAX_SPEED)
        theta = theta + theta_dot * DT
        nxt = torch.stack((theta, theta_dot), dim=1).to(state.dtype)
        terminated = torch.zeros(state.shape[0], dtype=torch.bool, device=state.device)
        return nxt, (-costs).to(torch.float32), terminated

    def observe(self, state: Tensor) -> Tensor:
        """``(cos theta, sin theta, theta_dot)`` float32 ``(n, 3)``."""
        theta, theta_dot = state.unbind(1)
        return torch.stack((torch.cos(theta), torch.sin(theta), theta_dot), dim=1).to(
            torch.float32
        )
