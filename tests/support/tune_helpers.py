"""Helpers of the tuner's tests: one batch collected and learned from as a tuned layout would."""

from __future__ import annotations

from typing import Any

import torch

from rlstruct.batchers.make import make_batcher
from rlstruct.trajectories import Trajectories


def learn_on_one_batch(setup: Any, n_timesteps: int, n_envs: int = 2) -> tuple[Trajectories, bool]:
    """Collects one batch of ``n_envs`` x ``n_timesteps`` with an ``AlgoSetup``'s factories in
    a ``SerialBatcher`` and runs its learn step on it; returns the batch and whether the step
    changed the published weights."""
    with make_batcher(device="cpu", n_processes=1, n_timesteps=n_timesteps,
                      create_agent=setup.create_agent, agent_args=setup.agent_args,
                      create_env=setup.create_env,
                      env_args={**setup.env_args, "n_envs": n_envs}, seeds=0) as batcher:
        batcher.reset()
        batcher.execute()
        traj, _ = batcher.get()
    before = {k: v.clone() for k, v in setup.weights.items()}
    setup.learn(traj)
    return traj, any(not torch.equal(before[k], v) for k, v in setup.weights.items())
