"""Tests of DeviceEnv: observations and running indices on to_device, actions on from_device."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from rlstruct import DictTensor
from rlstruct.envs import DeviceEnv, VecEnv, make_counter_env
from rlstruct.envs.base import StepResult
from rlstruct.errors import BatcherStateError


def act(n: int, value: int = 1, device: str | torch.device = "cpu") -> DictTensor:
    return DictTensor({"action": torch.full((n,), value, dtype=torch.long, device=device)})


class RecordingVecEnv(VecEnv):
    """Returns CPU tensors; records the device of every action and env_info it receives."""

    def __init__(self, n: int = 2, reset_rows: bool = False) -> None:
        self.n, self.reset_rows = n, reset_rows
        self.action_space = "action-space"  # type: ignore[assignment]
        self.observation_space = "observation-space"  # type: ignore[assignment]
        self.seen: list[torch.device] = []
        self.closed = False

    def _obs(self) -> DictTensor:
        return DictTensor({"frame": torch.arange(self.n), "reward": torch.zeros(self.n)})

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, Tensor]:
        if env_info is not None:
            self.seen.append(env_info.device())
        return self._obs(), torch.arange(self.n)

    def step(self, action: DictTensor) -> StepResult:
        self.seen.append(action["action"].device)
        obs_t1 = self._obs()
        obs_next = self._obs() if self.reset_rows else DictTensor(dict(obs_t1.items()))
        return (obs_t1, torch.arange(self.n)), (obs_next, torch.arange(self.n))

    def n_envs(self) -> int:
        return self.n

    def close(self) -> None:
        self.closed = True


def test_forward_direction_to_meta() -> None:
    inner = make_counter_env(3, episode_length=2)
    env = DeviceEnv(inner, "cpu", "meta")
    assert env.n_envs() == 3
    assert env.action_space is inner.action_space
    assert env.observation_space is inner.observation_space
    assert env.observation_specs() == inner.observation_specs()
    obs, running = env.reset()
    assert obs.device() == torch.device("meta") and running.device == torch.device("meta")
    assert all(v.device.type == "meta" for v in obs.values())
    assert obs.specs() == inner.observation_specs()  # dtypes and shapes survive the move
    env.close()
    with pytest.raises(BatcherStateError, match="closed"):
        inner.reset()


@pytest.mark.parametrize("reset_rows", [False, True])
def test_actions_go_to_from_device_and_shared_tensors_cross_once(reset_rows: bool) -> None:
    inner = RecordingVecEnv(reset_rows=reset_rows)
    env = DeviceEnv(inner, from_device="meta", to_device="meta")
    env.reset(DictTensor({"goal": torch.zeros(2)}))
    (obs_t1, was), (obs_next, running) = env.step(act(2))
    assert inner.seen == [torch.device("meta"), torch.device("meta")]
    assert obs_t1.device().type == obs_next.device().type == "meta"
    assert was.device.type == running.device.type == "meta"
    shared = [obs_next[k] is obs_t1[k] for k in obs_t1]
    assert shared == [not reset_rows] * 2
    env.close()
    assert inner.closed


def test_cpu_round_trip_equals_the_wrapped_env() -> None:
    ref = make_counter_env(3, seed=2, auto_reset=True, episode_length=[2, 3])
    env = DeviceEnv(
        make_counter_env(3, seed=2, auto_reset=True, episode_length=[2, 3]), "cpu", "cpu"
    )
    obs_ref, _ = ref.reset()
    obs, running = env.reset()
    assert obs.equal(obs_ref) and running.tolist() == [0, 1, 2]
    for t in range(6):
        (a_ref, _), (b_ref, _) = ref.step(act(3, t % 2))
        (a, was), (b, running) = env.step(act(3, t % 2))
        assert a.equal(a_ref) and b.equal(b_ref)
        assert was.tolist() == running.tolist() == [0, 1, 2]


@pytest.mark.gpu
def test_cuda_round_trip() -> None:
    ref = make_counter_env(4, seed=1, auto_reset=True, episode_length=[1, 2, 3])
    env = DeviceEnv(
        make_counter_env(4, seed=1, auto_reset=True, episode_length=[1, 2, 3]), "cpu", "cuda"
    )
    obs_ref, _ = ref.reset()
    obs, running = env.reset()
    assert obs.device().type == "cuda" and running.device.type == "cuda"
    assert obs.to("cpu").equal(obs_ref)
    for t in range(7):
        (a_ref, _), (b_ref, _) = ref.step(act(4, t % 2))
        (a, was), (b, running) = env.step(act(4, t % 2, device="cuda"))
        assert (
            a.device().type == b.device().type == running.device.type == was.device.type == "cuda"
        )
        assert a.to("cpu").equal(a_ref) and b.to("cpu").equal(b_ref)
        assert a.specs() == a_ref.specs()
    env.close()
