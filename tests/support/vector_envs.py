"""Picklable factories of gymnasium vector envs for the VectorEnvAdapter tests (importable by
batcher workers and Ray actors)."""

from __future__ import annotations

import functools

import gymnasium as gym
from gymnasium.vector import AutoresetMode

#: The time limit of the CartPoles below: random play ends episodes both ways.
LIMIT = 12


def cartpole_vector_env(mode: AutoresetMode | str, num_envs: int) -> gym.vector.SyncVectorEnv:
    """``num_envs`` CartPoles with a 12-step limit in one ``SyncVectorEnv`` of auto-reset
    ``mode`` (the user's factory: ``functools.partial(cartpole_vector_env, mode)``)."""
    make = functools.partial(gym.make, "CartPole-v1", max_episode_steps=LIMIT)
    return gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode=mode)
