"""GPU layouts of the batchers (run only where CUDA is present)."""

from __future__ import annotations

import pytest
import torch
from support.agents import DeterministicAgent, MLPAgent
from support.batcher_helpers import counter_env

from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.errors import ConfigError

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]


def collect(device):
    with SerialBatcher(
        4,
        DeterministicAgent,
        {"n_actions": 3},
        counter_env,
        {"n_envs": 4, "n_actions": 3, "auto_reset": True},
        seeds=1,
        device=device,
    ) as b:
        b.reset()
        b.execute()
        return b.get()[0]


def test_device_batcher_equals_cpu_batcher():
    on_gpu = collect("cuda")
    assert on_gpu.device().type == "cuda"
    assert on_gpu.trajectories.equal(collect("cpu").trajectories)


def test_model_copy_goes_through_the_cpu():
    """A learner model on cuda:0 copied to a batcher on the last GPU allocates nothing on cuda:0
    beyond what the learner already holds."""
    last = torch.cuda.device_count() - 1
    model = MLPAgent(obs_dim=3, n_actions=3).model.to("cuda:0")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    with SerialBatcher(
        2,
        MLPAgent,
        {"obs_dim": 3, "n_actions": 3},
        counter_env,
        {"n_envs": 2, "n_actions": 3},
        device=f"cuda:{last}",
    ) as b:
        b.update(model.state_dict())
        b.reset()
        b.execute()
        traj, _ = b.get()
    assert traj.device() == torch.device(f"cuda:{last}")
    if last != 0:
        assert torch.cuda.memory_allocated(0) == before


def test_worker_batcher_refuses_cuda_tensors():
    model = torch.nn.Linear(3, 3).cuda()
    with pytest.raises(ConfigError, match="CPU-only"):
        Batcher(2, DeterministicAgent, {"model": model}, counter_env, {"n_envs": 2})
