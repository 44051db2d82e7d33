"""A custom env trained from the command line: the module that registers it is all you write.

``Corridor-v0``: the agent starts at cell 0 of a corridor of ``length`` cells and steps left
(action 0) or right (action 1); reaching the last cell ends the episode with reward 1, every
step costs 0.01, and gymnasium's TimeLimit truncates at 50 steps. The observation is the
one-hot position. Importing this module registers the id with gymnasium.

Train it with any algorithm, naming the module that registers the env (its folder must be on
``PYTHONPATH``; ``--env-module`` may be given several times)::

    PYTHONPATH=examples rlstruct train ppo --env-module corridor --env-id Corridor-v0 \\
        --target-return 0.85 --max-frames 50000

or with gymnasium's ``module:Id`` form, which imports the module wherever an env is made::

    PYTHONPATH=examples rlstruct train ppo --env-id corridor:Corridor-v0 --target-return
    0.85

Running this file checks the env with gymnasium's env checker and trains PPO from Python.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class CorridorEnv(gym.Env):
    """Walk right to the end of a corridor of ``length`` cells (see the module docstring)."""

    def __init__(self, length: int = 10) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.position = 0

    def _observation(self) -> np.ndarray:
        obs = np.zeros(self.length, np.float32)
        obs[self.position] = 1.0
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.position = 0
        return self._observation(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.position = min(max(self.position + (1 if action == 1 else -1), 0), self.length - 1)
        arrived = self.position == self.length - 1
        return self._observation(), (1.0 if arrived else 0.0) - 0.01, arrived, False, {}


if "Corridor-v0" not in gym.registry:
    gym.register("Corridor-v0", entry_point=CorridorEnv, max_episode_steps=50)


if __name__ == "__main__":
    from gymnasium.utils.env_checker import check_env

    check_env(gym.make("Corridor-v0").unwrapped)
    from rlstruct.algos import ppo

    summary = ppo.main(ppo.Config(env_id="Corridor-v0", env_module=("corridor",),
                                  target_return=0.85, max_frames=50_000, eval_every=5))
    print(f"status {summary['status']}, train return {summary['train_return_mean20']:.2f}")
