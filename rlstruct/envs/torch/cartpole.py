"""``CartPole``: gymnasium's ``CartPole-v1`` as a batched tensor computation.

Physics (Barto, Sutton and Anderson 1983; the frictionless model of gymnasium's
``CartPoleEnv``): a cart of mass ``M`` on a track carries a pole of mass ``m`` and half-length
``l`` hinged on it. With ``F = +-force_mag`` the push of the action and ``theta`` the pole's
angle from the vertical, Newton's laws for the cart and the pole give

    temp      = (F + m l theta_dot^2 sin theta) / (M + m)
    theta_acc = (g sin theta - cos theta * temp) / (l (4/3 - m cos^2 theta / (M + m)))
    x_acc     = temp - m l theta_acc cos theta / (M + m)

integrated with explicit Euler over ``tau = 0.02`` s (positions first from the old
velocities). Reward 1 at every step, the terminating one included; the episode terminates when
``|x| > 2.4`` or ``|theta| > 12`` degrees; the time limit is 500 steps (``CartPole-v1``).
State ``(x, x_dot, theta, theta_dot)``, observed as float32; initial state uniform in
``[low, high]^4`` (reset options ``low``, ``high``; default ``[-0.05, 0.05]``).

The products are evaluated in gymnasium's order, so that a float64 state follows gymnasium's
float64 state to the last bits (tests/envs/test_envs_torch.py compares 1000-step rollouts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from rlstruct.envs.torch.uniform_reset import UniformResetEnv

__all__ = ["CartPole"]

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_POLE + MASS_CART
HALF_LENGTH = 0.5  # half the pole's length
POLE_MASS_LENGTH = MASS_POLE * HALF_LENGTH
FORCE_MAG = 10.0
TAU = 0.02  # seconds between state updates
THETA_THRESHOLD = 12 * 2 * math.pi / 360  # radians
X_THRESHOLD = 2.4

_HIGH = np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf], dtype=np.float32)


class CartPole(UniformResetEnv):
    """``N`` CartPole-v1 envs in one state tensor ``(N, 4)``: ``(x, x_dot, theta, theta_dot)``.

    Observation ``Box((4,), float32)`` and action ``Discrete(2)`` (0 pushes left, 1 right) as in
    gymnasium; see the module doc for the dynamics and :class:`TorchVecEnv` for the arguments
    (``CartPole(n_envs, seed, device, dtype, max_episode_steps, auto_reset=...)``).

    Examples:
        >>> from rlstruct import DictTensor
        >>> env = CartPole(n_envs=3, seed=0, auto_reset=True)
        >>> obs, running = env.reset()
        >>> obs["frame"].shape, obs["frame"].dtype, env.state.shape
        (torch.Size([3, 4]), torch.float32, torch.Size([3, 4]))
        >>> action = DictTensor({"action": torch.ones(3, dtype=torch.long)})
        >>> (obs_t1, _), (obs_next, running) = env.step(action)
        >>> obs_t1["reward"].tolist(), obs_t1["env_step"].tolist(), running.tolist()
        ([1.0, 1.0, 1.0], [1, 1, 1], [0, 1, 2])
    """

    observation_space = spaces.Box(-_HIGH, _HIGH, dtype=np.float32)
    action_space = spaces.Discrete(2)
    state_size = 4
    n_draws = 4
    default_max_episode_steps = 500
    reset_options: ClassVar[Mapping[str, float]] = {"low": -0.05, "high": 0.05}

    def dynamics(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One Euler step of ``n`` carts: ``(next_state (n, 4), reward (n,), terminated (n,))``.

        Args:
            state: ``(n, 4)``.
            action: int64 ``(n,)``; 1 pushes right, anything else left.
        """
        x, x_dot, theta, theta_dot = state.unbind(1)
        force = torch.where(action == 1, FORCE_MAG, -FORCE_MAG).to(state.dtype)
        cos, sin = torch.cos(theta), torch.sin(theta)
        temp = (force + POLE_MASS_LENGTH * theta_dot.square() * sin) / TOTAL_MASS
        theta_acc = (GRAVITY * sin - cos * temp) / (
            HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * cos.square() / TOTAL_MASS)
        )
        x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS
        x = x + TAU * x_dot
        x_dot = x_dot + TAU * x_acc
        theta = theta + TAU * theta_dot
        theta_dot = theta_dot + TAU * theta_acc
        nxt = torch.stack((x, x_dot, theta, theta_dot), dim=1)
        terminated = (x.abs() > X_THRESHOLD) | (theta.abs() > THETA_THRESHOLD)
        reward = torch.ones(state.shape[0], dtype=torch.float32, device=state.device)
        return nxt, reward, terminated

    def observe(self, state: Tensor) -> Tensor:
        """The state as float32 ``(n, 4)`` (a copy)."""
        return state.to(torch.float32, copy=True)
