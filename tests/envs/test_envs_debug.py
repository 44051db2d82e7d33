"""Tests of the debug envs (CounterEnv, RepeatEnv), their registration and their factories."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlstruct.envs
from rlstruct import DictTensor
from rlstruct.envs import (
    COUNTER_ID,
    REPEAT_ID,
    CounterEnv,
    GymEnv,
    GymEnvInf,
    RepeatEnv,
    make_counter_env,
    make_repeat_env,
    register_debug_envs,
)
from rlstruct.errors import ConfigError


def _length_of(env_id: int, episode: int) -> int:
    return env_id + episode + 1


def _episode_lengths(env: CounterEnv, n_episodes: int) -> list[int]:
    lengths = []
    for _ in range(n_episodes):
        obs, _ = env.reset()
        t = 0
        while True:
            obs, reward, terminated, truncated, _ = env.step(1)
            assert reward == 1.0
            t += 1
            assert obs.tolist() == [env.env_id, len(lengths), t]
            if terminated or truncated:
                break
        lengths.append(t)
    return lengths


@pytest.mark.parametrize(
    ("episode_length", "expected"),
    [(3, [3, 3, 3]), ([1, 2], [1, 2, 1]), (_length_of, [3, 4, 5])],
)
def test_counter_episode_lengths(episode_length: object, expected: list[int]) -> None:
    env = CounterEnv(env_id=2, episode_length=episode_length)  # type: ignore[arg-type]
    assert _episode_lengths(env, 3) == expected
    assert env.n_steps == sum(expected)


def test_counter_observation_reward_and_flags() -> None:
    env = CounterEnv(env_id=5, episode_length=2, n_actions=4, truncate=True)
    assert env.observation_space == gym.spaces.Box(0, 2**62, (3,), np.int64)
    assert env.action_space == gym.spaces.Discrete(4)
    obs, info = env.reset(seed=1)
    assert obs.dtype == np.int64 and obs.tolist() == [5, 0, 0]
    assert info == {"episode_length": 2}
    assert env.step(3)[1:4] == (3.0, False, False)
    obs, reward, terminated, truncated, _ = env.step(2)
    assert (obs.tolist(), reward, terminated, truncated) == ([5, 0, 2], 2.0, False, True)
    with pytest.raises(RuntimeError, match="without a running episode"):
        env.step(0)
    obs, _ = env.reset(options={"episode_length": 1})
    assert obs.tolist() == [5, 1, 0]
    assert env.step(0)[3] is True


def test_counter_faults_and_bad_config() -> None:
    env = CounterEnv(fail_at=(1, 2), episode_length=2)
    _episode_lengths(env, 1)
    env.reset()
    env.step(0)
    with pytest.raises(RuntimeError, match="injected failure at episode 1, t=2"):
        env.step(0)
    env = CounterEnv(hang_at=(0, 1), hang_seconds=0.05)
    env.reset()
    assert env.step(0)[0].tolist() == [0, 0, 1]
    with pytest.raises(ConfigError, match="has length 0"):
        CounterEnv(episode_length=0).reset()
    with pytest.raises(ConfigError, match="empty list"):
        CounterEnv(episode_length=[])


@pytest.mark.parametrize("one_hot", [True, False])
def test_repeat_env_rewards_the_observed_symbol(one_hot: bool) -> None:
    env = RepeatEnv(n_symbols=3, episode_length=4, one_hot=one_hot)
    if one_hot:
        assert env.observation_space == gym.spaces.Box(0, 1, (3,), np.float32)
    else:
        assert env.observation_space == gym.spaces.Discrete(3)
    obs, _ = env.reset(seed=0)
    rewards, ends = [], []
    for t in range(4):
        if one_hot:
            assert obs.dtype == np.float32 and obs.sum() == 1.0
        symbol = int(np.argmax(obs)) if one_hot else int(obs)
        action = symbol if t % 2 == 0 else (symbol + 1) % 3  # right, wrong, right, wrong
        obs, reward, terminated, truncated, _ = env.step(action)
        rewards.append(reward)
        ends.append((terminated, truncated))
    assert rewards == [1.0, 0.0, 1.0, 0.0]
    assert ends == [(False, False)] * 3 + [(True, False)]


def test_repeat_env_is_seeded() -> None:
    def symbols(seed: int) -> list[int]:
        env = RepeatEnv(n_symbols=100, episode_length=50)
        obs, _ = env.reset(seed=seed)
        out = [int(np.argmax(obs))]
        for _ in range(20):
            obs = env.step(0)[0]
            out.append(int(np.argmax(obs)))
        return out

    assert symbols(1) == symbols(1)
    assert symbols(1) != symbols(2)
    assert len(set(symbols(1))) > 5


def test_registration_is_idempotent_and_makes_envs() -> None:
    assert COUNTER_ID in gym.registry and REPEAT_ID in gym.registry
    spec = gym.registry[COUNTER_ID]
    register_debug_envs()
    register_debug_envs()
    assert gym.registry[COUNTER_ID] is spec  # not re-registered
    env = gym.make(COUNTER_ID, env_id=3, episode_length=2)
    assert env.reset()[0].tolist() == [3, 0, 0]
    env = gym.make(REPEAT_ID, n_symbols=4)
    assert env.observation_space.shape == (4,)
    assert "register_debug_envs" in rlstruct.envs.__all__


def test_factories_are_picklable_and_number_envs() -> None:
    env = pickle.loads(pickle.dumps(make_counter_env))(3, 5, env_id_offset=7, episode_length=2)
    assert isinstance(env, GymEnv)
    obs, _ = env.reset()
    assert obs["frame"][:, 0].tolist() == [7, 8, 9]
    assert [e.unwrapped.env_id for e in env.envs] == [7, 8, 9]
    inf = make_counter_env(2, auto_reset=True, truncate=True, episode_length=1)
    assert isinstance(inf, GymEnvInf)
    inf.reset()
    (obs_t1, _), _ = inf.step(DictTensor({"action": torch.zeros(2, dtype=torch.long)}))
    assert obs_t1["truncated"].all() and not obs_t1["terminated"].any()
    rep = make_repeat_env(2, seed=3, n_symbols=5)
    obs, _ = rep.reset()
    assert isinstance(rep, GymEnvInf) and obs["frame"].shape == (2, 5)
    assert pickle.loads(pickle.dumps(env.envs[0].unwrapped)).env_id == 7
