"""Partially observed control tasks: where an agent needs a memory.

``rlstruct/CartPoleNoVel-v1`` is gymnasium's ``CartPole-v1`` with the two velocities hidden:
the observation is ``(cart position, pole angle)`` only, so the state cannot be read off one
observation and a memoryless policy cannot balance the pole for long. It is the task
sb3-contrib benchmarks ``RecurrentPPO`` on (rl-zoo's ``CartPoleNoVel-v1``); a recurrent agent
recovers the velocities from successive observations.

Example:
    >>> import gymnasium as gym
    >>> import rlstruct.envs  # registers the id
    >>> env = gym.make(CARTPOLE_NOVEL_ID)
    >>> obs, _ = env.reset(seed=0)
    >>> obs.shape, env.spec.max_episode_steps
    ((2,), 500)
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control import CartPoleEnv

__all__ = ["CARTPOLE_NOVEL_ID", "CartPoleNoVelocity", "register_pomdp_envs"]

CARTPOLE_NOVEL_ID = "rlstruct/CartPoleNoVel-v1"
"""CartPole-v1 without its velocities (500 steps, solved at 475)."""

#: The observed entries of CartPole's state: cart position and pole angle.
_SEEN = np.array([0, 2])


class CartPoleNoVelocity(CartPoleEnv):
    """``CartPole-v1`` observing ``(x, theta)``, ``Box((2,), float32)``; the dynamics, the
    rewards and the termination are CartPole's."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        high = self.observation_space.high[_SEEN]
        self.observation_space = spaces.Box(-high, high, dtype=np.float32)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        return obs[_SEEN], info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[_SEEN], reward, terminated, truncated, info


def register_pomdp_envs() -> None:
    """Registers ``rlstruct/CartPoleNoVel-v1`` with gymnasium (idempotent)."""
    if CARTPOLE_NOVEL_ID not in gym.registry:
        gym.register(id=CARTPOLE_NOVEL_ID, entry_point="rlstruct.envs.pomdp:CartPoleNoVelocity",
                     max_episode_steps=500, reward_threshold=475.0)
