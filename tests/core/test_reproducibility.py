"""Reproducibility for agents written the way users write them (issue 9, section 1).

The agent here builds its model inside ``create_agent`` without a seed and samples from torch's,
numpy's and Python's GLOBAL generators: nothing of it is seeded by the user.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.gym import GymEnvInf

pytestmark = pytest.mark.timeout(120)


class GlobalRNGAgent(Agent):
    """CartPole policy: unseeded MLP, actions sampled from the global generators."""

    def __init__(self) -> None:
        self.model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))

    def __call__(self, state, observation, agent_info):
        logits = self.model(observation["frame"])
        action = torch.distributions.Categorical(logits=logits).sample()
        n = action.shape[0]
        noise = torch.tensor(np.random.rand(n), dtype=torch.float32)
        coin = torch.tensor([random.random() for _ in range(n)], dtype=torch.float32)
        weights = sum(float(p.sum()) for p in self.model.parameters())
        return DictTensor(
            {
                "action": action,
                "noise": noise,
                "coin": coin,
                "weights": torch.full((n,), weights, dtype=torch.float64),
            }
        ), state


def make_agent() -> GlobalRNGAgent:
    return GlobalRNGAgent()


def cartpole(n_envs: int, seed: int) -> GymEnvInf:
    return GymEnvInf("CartPole-v1", n_envs=n_envs, seed=seed)




def collect(batcher, n_segments: int = 3) -> list:
    with batcher as b:
        b.reset()
        out = []
        for _ in range(n_segments):
            b.execute()
            out.append(b.get()[0])
        return out


def serial(**kw) -> SerialBatcher:
    return SerialBatcher(8, make_agent, {}, cartpole, {"n_envs": 4}, seeds=3, **kw)


def batcher(n_processes: int, n_envs: int) -> Batcher:
    return Batcher(8, make_agent, {}, cartpole, {"n_envs": n_envs}, n_processes=n_processes,
                   seeds=3)


def assert_equal(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.trajectories.lengths.tolist() == y.trajectories.lengths.tolist()
        for dx, dy in ((x.info, y.info), (x.trajectories, y.trajectories)):
            assert sorted(dx.keys()) == sorted(dy.keys())
            for k in dx:
                assert torch.equal(dx[k], dy[k]), k


def test_two_serial_batchers_with_the_same_seeds_are_bitwise_equal():
    assert_equal(collect(serial()), collect(serial()))


def test_serial_batcher_does_not_consume_the_callers_random_streams():
    torch.manual_seed(11)
    np.random.seed(11)
    random.seed(11)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(11)
    np.random.seed(11)
    random.seed(11)
    collect(serial())
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0])
    assert np.array_equal(got[1], expected[1])
    assert got[2] == expected[2]


def test_serial_batcher_ignores_the_callers_random_state():
    torch.manual_seed(1)
    a = collect(serial())
    torch.manual_seed(2)
    np.random.seed(2)
    b = collect(serial())
    assert_equal(a, b)


def test_batcher_does_not_consume_the_callers_random_streams():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    collect(batcher(1, 2), n_segments=1)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.slow
def test_same_batcher_configuration_twice_is_bitwise_equal():
    assert_equal(collect(batcher(2, 2)), collect(batcher(2, 2)))


@pytest.mark.slow
def test_serial_batcher_equals_a_one_process_batcher():
    assert_equal(collect(serial()), collect(batcher(1, 4)))


@pytest.mark.slow
def test_a_model_built_in_create_agent_has_the_same_weights_in_every_worker():
    (batch,) = collect(batcher(2, 2), n_segments=1)
    weights = batch.trajectories["action/weights"]
    assert torch.equal(weights, torch.full_like(weights, float(weights[0, 0])))
    (ref,) = collect(serial(), n_segments=1)
    assert float(ref.trajectories["action/weights"][0, 0]) == float(weights[0, 0])


@pytest.mark.slow
def test_workers_sample_from_streams_of_their_own():
    (batch,) = collect(batcher(2, 2), n_segments=1)
    noise = batch.trajectories["action/noise"]
    assert not torch.equal(noise[:2], noise[2:])  # rows of worker 0 vs worker 1
