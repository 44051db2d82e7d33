"""Fault-injecting envs for restart tests (Batcher and RayBatcher), and the row invariants of
counter envs. Sent by value to worker processes and actors (``register_pickle_by_value``).

Worker ``p`` of a run with int seed ``s`` and ``n`` envs per worker has env seeds from
``s * 2**20 + p * n``; a replacement adds ``r * 2**32``, which keeps ``seed % 2**20``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from rlstruct.batchers.seeding import SEED_BLOCK
from rlstruct.envs.debug import CounterEnv
from rlstruct.envs.gym import GymEnvInf


class AlwaysFailing(gym.Wrapper):
    """CartPole that raises at every step."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def step(self, action):
        raise RuntimeError("this env is broken for good")


def broken_worker_env(n_envs: int, seed: int) -> GymEnvInf:
    """Worker 1's envs raise at every step, in every replacement; the others are CartPoles."""
    worker = (seed % SEED_BLOCK) // n_envs
    if worker == 1:
        return GymEnvInf([AlwaysFailing for _ in range(n_envs)], seed=seed)
    return GymEnvInf("CartPole-v1", n_envs=n_envs, seed=seed)


class FlakyCounter(CounterEnv):
    """A counter env whose steps fail with probability ``p`` (its own RNG, seeded at reset)."""

    def __init__(self, env_id: int, p: float) -> None:
        super().__init__(env_id=env_id, episode_length=7)
        self.p = p
        self.rng = np.random.default_rng(0)

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.rng.random() < self.p:
            raise RuntimeError("flaky simulator")
        return super().step(action)


def flaky_counter_env(n_envs: int, seed: int, p: float) -> GymEnvInf:
    base = seed % SEED_BLOCK
    return GymEnvInf(
        [lambda k=k: FlakyCounter(base + k, p) for k in range(n_envs)], seed=seed,
        env_id_offset=base,
    )


def assert_counter_rows_are_valid(batch) -> None:
    """Every row holds consecutive steps of ONE counter env: nothing spliced, nothing stale."""
    frames = batch.trajectories["observation/frame"]
    nexts = batch.trajectories["_observation/frame"]
    done = batch.trajectories["_observation/done"]
    for row, (env_id, length) in enumerate(
        zip(batch.info["env_id"].tolist(), batch.trajectories.lengths.tolist())
    ):
        assert length > 0
        f, nx = frames[row, :length], nexts[row, :length]
        assert torch.all(f[:, 0] == env_id) and torch.all(nx[:, 0] == env_id)
        assert torch.all(nx[:, 2] == f[:, 2] + 1)  # each step advances the counter by one
        for t in range(length - 1):
            if not done[row, t]:
                assert torch.equal(f[t + 1], nx[t])  # the next step starts where this one ended
