"""``Acrobot``: gymnasium's ``Acrobot-v1`` as a batched tensor computation.

Physics (Sutton 1996; Sutton and Barto's book, the dynamics gymnasium uses by default): two
links of mass ``m1 = m2 = 1``, length ``l1 = 1``, centres of mass at ``lc1 = lc2 = 0.5`` and
moments of inertia ``I1 = I2 = 1`` hang from a fixed joint; the action applies a torque
``tau`` in ``{-1, 0, +1}`` at the joint between the links. The Lagrangian equations of motion,
with ``d1 = m1 lc1^2 + m2 (l1^2 + lc2^2 + 2 l1 lc2 cos theta2) + I1 + I2`` and
``d2 = m2 (lc2^2 + l1 lc2 cos theta2) + I2``, give::

    phi2 = m2 lc2 g cos(theta1 + theta2 - pi/2)
    phi1 = -m2 l1 lc2 dtheta2^2 sin theta2 - 2 m2 l1 lc2 dtheta2 dtheta1 sin theta2
           + (m1 lc1 + m2 l1) g cos(theta1 - pi/2) + phi2
    ddtheta2 = (tau + d2/d1 phi1 - m2 l1 lc2 dtheta1^2 sin theta2 - phi2)
               / (m2 lc2^2 + I2 - d2^2 / d1)
    ddtheta1 = -(d2 ddtheta2 + phi1) / d1

integrated with one classical 4th-order Runge-Kutta step of ``dt = 0.2`` s; then both angles
are wrapped into ``[-pi, pi]`` and the velocities clipped to ``4 pi`` and ``9 pi``. Reward -1
per step, 0 at the terminating one; the episode terminates when the free end rises above the
bar: ``-cos theta1 - cos(theta1 + theta2) > 1``; time limit 500 steps (``Acrobot-v1``).
State ``(theta1, theta2, dtheta1, dtheta2)``; observation
``(cos theta1, sin theta1, cos theta2, sin theta2, dtheta1, dtheta2)`` as float32; initial
state uniform in ``[low, high]^4`` rounded to float32 as gymnasium does (reset options
``low``, ``high``; default ``[-0.1, 0.1]``).

The terms are evaluated in gymnasium's order, so that a float64 state follows gymnasium's float64
state closely (tests/envs/test_envs_torch.py compares 1000-step rollouts).
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

__all__ = ["Acrobot"]

DT = 0.2
LINK_LENGTH_1 = 1.0
LINK_MASS_1 = 1.0
LINK_MASS_2 = 1.0
LINK_COM_POS_1 = 0.5
LINK_COM_POS_2 = 0.5
LINK_MOI = 1.0
MAX_VEL_1 = 4 * math.pi
MAX_VEL_2 = 9 * math.pi
GRAVITY = 9.8
PI = math.pi

_HIGH = np.array([1.0, 1.0, 1.0, 1.0, MAX_VEL_1, MAX_VEL_2], dtype=np.float32)


def _wrap(x: Tensor, low: float, high: float) -> Tensor:
    """``x`` wrapped into ``[low, high]`` by whole turns of ``high - low``.

    One masked turn each way (exactly gymnasium's loop for the angles one RK4 step produces),
    then a remainder for values further out (e.g. a state set by hand).
    """
    turn = high - low
    x = torch.where(x > high, x - turn, x)
    x = torch.where(x < low, x + turn, x)
    far = (x > high) | (x < low)
    return torch.where(far, torch.remainder(x - low, turn) + low, x)


class Acrobot(UniformResetEnv):
    """``N`` Acrobot-v1 envs in one state tensor ``(N, 4)``:
    ``(theta1, theta2, dtheta1, dtheta2)``.

    Observation ``Box((6,), float32)`` and action ``Discrete(3)`` (torque ``action - 1``) as in
    gymnasium; see the module doc for the dynamics and :class:`TorchVecEnv` for the arguments.

    Examples:
        >>> env = Acrobot(n_envs=2, seed=0)
        >>> obs, running = env.reset()
        >>> obs["frame"].shape, env.state.shape, env.max_episode_steps
        (torch.Size([2, 6]), torch.Size([2, 4]), 500)
    """

    observation_space = spaces.Box(low=-_HIGH, high=_HIGH, dtype=np.float32)
    action_space = spaces.Discrete(3)
    state_size = 4
    n_draws = 4
    default_max_episode_steps = 500
    reset_options: ClassVar[Mapping[str, float]] = {"low": -0.1, "high": 0.1}

    def initial_state(self, u: Tensor, options: Mapping[str, Tensor]) -> Tensor:
        """Uniform in ``[low, high]`` per component, rounded to float32: ``(n, 4)``."""
        return super().initial_state(u, options).to(torch.float32).to(u.dtype)

    @staticmethod
    def derivatives(s: Tensor, torque: Tensor) -> Tensor:
        """``d s / dt`` ``(n, 4)`` of states ``s`` ``(n, 4)`` under torques ``(n,)``."""
        m1, m2, l1 = LINK_MASS_1, LINK_MASS_2, LINK_LENGTH_1
        lc1, lc2, i1, i2, g = LINK_COM_POS_1, LINK_COM_POS_2, LINK_MOI, LINK_MOI, GRAVITY
        theta1, theta2, dtheta1, dtheta2 = s.unbind(1)
        sin2 = torch.sin(theta2)
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * torch.cos(theta2)) + i1 + i2
        d2 = m2 * (lc2**2 + l1 * lc2 * torch.cos(theta2)) + i2
        phi2 = m2 * lc2 * g * torch.cos(theta1 + theta2 - PI / 2.0)
        phi1 = (
            -m2 * l1 * lc2 * dtheta2**2 * sin2
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin2
            + (m1 * lc1 + m2 * l1) * g * torch.cos(theta1 - PI / 2)
            + phi2
        )
        ddtheta2 = (torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1**2 * sin2 - phi2) / (
            m2 * lc2**2 + i2 - d2**2 / d1
        )
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return torch.stack((dtheta1, dtheta2, ddtheta1, ddtheta2), dim=1)

    def dynamics(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One RK4 step of ``n`` acrobots: ``(next_state (n, 4), reward (n,), terminated (n,))``.

        Args:
            state: ``(n, 4)``.
            action: int64 ``(n,)`` in ``{0, 1, 2}``: torque ``action - 1``.
        """
        torque = (action - 1).to(state.dtype)
        f = self.derivatives
        half = DT / 2.0
        k1 = f(state, torque)
        k2 = f(state + half * k1, torque)
        k3 = f(state + half * k2, torque)
        k4 = f(state + DT * k3, torque)
        s = state + DT / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        theta1, theta2, dtheta1, dtheta2 = s.unbind(1)
        nxt = torch.stack(
            (
                _wrap(theta1, -PI, PI),
                _wrap(theta2, -PI, PI),
                dtheta1.clamp(-MAX_VEL_1, MAX_VEL_1),
                dtheta2.clamp(-MAX_VEL_2, MAX_VEL_2),
            ),
            dim=1,
        )
        terminated = -torch.cos(nxt[:, 0]) - torch.cos(nxt[:, 1] + nxt[:, 0]) > 1.0
        reward = torch.where(terminated, 0.0, -1.0).to(torch.float32)
        return nxt, reward, terminated

    def observe(self, state: Tensor) -> Tensor:
        """``(cos theta1, sin theta1, cos theta2, sin theta2, dtheta1, dtheta2)``, float32
        ``(n, 6)``."""
        theta1, theta2, dtheta1, dtheta2 = state.unbind(1)
        obs = (
            torch.cos(theta1),
            torch.sin(theta1),
            torch.cos(theta2),
            torch.sin(theta2),
            dtheta1,
            dtheta2,
        )
        return torch.stack(obs, dim=1).to(torch.float32)
