"""Helpers shared by the tests of algos/ppo.py and algos/a2c.py.

- :func:`check_episode_returns`: a known-answer test of an ``EpisodeReturns`` tracker over two
  consecutive auto-reset segments (episodes that span the cut, padding, several ends per row).
- :func:`gae_by_loops`: GAE written with plain Python loops over one row at a time.
- :func:`collect`: consecutive segments from a SerialBatcher (the reference batcher).
"""

from __future__ import annotations

from typing import Any

import torch
from algo_helpers_vd import steps

from rlstruct import SerialBatcher, Trajectories


def check_episode_returns(tracker_cls: type) -> None:
    """Asserts the returns and lengths an ``EpisodeReturns`` reports for two segments."""
    tracker = tracker_cls()
    # Row 0: an episode ends at t=1 (return 3, 2 steps), the next runs on into segment 2.
    # Row 1: no end in segment 1 (padding at t=2 holds garbage that must not count).
    first = steps(
        [3, 2],
        reward=torch.tensor([[1.0, 2.0, 4.0], [1.0, 1.0, 99.0]]),
        done=torch.tensor([[False, True, False], [False, False, True]]),
        **{"_observation/env_step": torch.tensor([[1, 2, 1], [5, 6, 7]])},
    )
    returns, lengths = tracker(first)
    assert returns.tolist() == [3.0] and lengths.tolist() == [2]
    # Row 0 ends its carried episode at t=0 (4 + 8) and a fresh one at t=2 (16 + 32 + ...).
    # Row 1 ends its long episode at t=1 (1 + 1 + 2 + 2).
    second = steps(
        [3, 3],
        reward=torch.tensor([[8.0, 16.0, 32.0], [2.0, 2.0, 5.0]]),
        done=torch.tensor([[True, False, True], [False, True, False]]),
        **{"_observation/env_step": torch.tensor([[2, 1, 2], [7, 8, 1]])},
    )
    returns, lengths = tracker(second)
    assert returns.tolist() == [12.0, 48.0, 6.0] and lengths.tolist() == [2, 2, 8]
    assert tracker.carry.tolist() == [0.0, 5.0]


def gae_by_loops(reward, value, next_value, terminated, truncated, lengths, gamma, lam):
    """GAE and returns, one row and one step at a time (0 on padding)."""
    adv = torch.zeros_like(reward)
    for b, n in enumerate(lengths):
        acc = 0.0
        for t in reversed(range(n)):
            bootstrap = 0.0 if terminated[b, t] else gamma * float(next_value[b, t])
            delta = float(reward[b, t]) + bootstrap - float(value[b, t])
            goes_on = t + 1 < n and not (terminated[b, t] or truncated[b, t])
            acc = delta + (gamma * lam * acc if goes_on else 0.0)
            adv[b, t] = acc
    mask = torch.arange(reward.shape[1]) < torch.tensor(lengths).unsqueeze(1)
    return adv, torch.where(mask, adv + value, 0.0)


def collect(
    create_agent: Any, model: torch.nn.Module, n_segments: int, n_timesteps: int = 8,
    env: str = "CartPole-v1", n_envs: int = 4,
) -> list[Trajectories]:
    """``n_segments`` consecutive auto-reset segments of ``env`` played by the agent."""
    from rlstruct.envs import GymEnvInf

    with SerialBatcher(
        n_timesteps, create_agent, {"model": model}, GymEnvInf, {"env": env, "n_envs": n_envs}
    ) as batcher:
        batcher.reset()
        segments = []
        for _ in range(n_segments):
            batcher.execute()
            segments.append(batcher.get()[0])
    return segments
