"""Trajectories for the algorithm tests: hand-built ones, real ones, and a reference GAE.

- :func:`steps`: a hand-built TemporalDictTensor with the trajectory keys the losses read.
- :func:`collect`: consecutive auto-reset segments from a SerialBatcher (the reference batcher).
- :func:`gae_by_loops`: GAE written with plain Python loops over one row and step at a time.
"""

from __future__ import annotations

from typing import Any

import torch

from rlstruct import SerialBatcher, TemporalDictTensor, Trajectories

_FULL_KEYS = {
    "reward": "_observation/reward",
    "terminated": "_observation/terminated",
    "truncated": "_observation/truncated",
    "done": "_observation/done",
    "env_step": "_observation/env_step",
    "frame": "observation/frame",
    "initial_state": "observation/initial_state",
    "next_frame": "_observation/frame",
    "action": "action/action",
}


def steps(lengths: list[int], **tensors: torch.Tensor) -> TemporalDictTensor:
    """A TemporalDictTensor of ``tensors`` (each ``(B, T, ...)``) with ``lengths``; the short
    names ``reward``, ``terminated``, ``truncated``, ``done``, ``env_step``, ``frame``,
    ``initial_state``, ``next_frame`` and ``action`` become the full trajectory keys."""
    return TemporalDictTensor(
        {_FULL_KEYS.get(k, k): v for k, v in tensors.items()}, torch.tensor(lengths)
    )


def collect(
    create_agent: Any, model: torch.nn.Module, n_segments: int, n_timesteps: int = 8,
    env: str = "CartPole-v1", n_envs: int = 4, create_env: Any = None,
) -> list[Trajectories]:
    """``n_segments`` consecutive segments of ``env`` played by the agent (auto-reset envs by
    default; pass ``create_env=GymEnv`` for episodic ones, reset once)."""
    from rlstruct.envs import GymEnvInf

    with SerialBatcher(
        n_timesteps, create_agent, {"model": model}, create_env or GymEnvInf,
        {"env": env, "n_envs": n_envs},
    ) as batcher:
        batcher.reset()
        segments = []
        for _ in range(n_segments):
            batcher.execute()
            traj, n_running = batcher.get()
            segments.append(traj)
            if n_running == 0:
                break
    return segments


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
