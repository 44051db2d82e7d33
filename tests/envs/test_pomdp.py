"""rlstruct/CartPoleNoVel-v1 (rlstruct.envs.pomdp): CartPole-v1 observing ``(x, theta)`` only,
the same dynamics, rewards, terminations and 500-step truncation, solved at 475."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

import rlstruct.envs  # noqa: F401  (registers the id)
from rlstruct.envs import CARTPOLE_NOVEL_ID, GymEnvInf
from rlstruct.envs.pomdp import CartPoleNoVelocity


def test_the_id_is_registered_with_cartpoles_limits():
    spec = gym.spec(CARTPOLE_NOVEL_ID)
    assert CARTPOLE_NOVEL_ID == "rlstruct/CartPoleNoVel-v1"
    assert spec.max_episode_steps == 500 and spec.reward_threshold == 475.0
    env = gym.make(CARTPOLE_NOVEL_ID)
    full = gym.make("CartPole-v1")
    assert isinstance(env.unwrapped, CartPoleNoVelocity)
    assert env.observation_space.shape == (2,) and env.observation_space.dtype == np.float32
    np.testing.assert_array_equal(env.observation_space.high, full.observation_space.high[[0, 2]])
    assert env.action_space == full.action_space


def test_it_observes_cartpoles_position_and_angle_under_the_same_seed_and_actions():
    env, full = gym.make(CARTPOLE_NOVEL_ID), gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    episodes = 0
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        obs_full, _ = full.reset(seed=seed)
        np.testing.assert_array_equal(obs, obs_full[[0, 2]])
        while True:
            action = int(rng.integers(2))
            obs, reward, terminated, truncated, _ = env.step(action)
            obs_full, reward_full, term_full, trunc_full, _ = full.step(action)
            assert obs.shape == (2,) and obs.dtype == np.float32
            np.testing.assert_array_equal(obs, obs_full[[0, 2]])
            assert (reward, terminated, truncated) == (reward_full, term_full, trunc_full)
            if terminated or truncated:
                episodes += terminated
                break
    assert episodes == 3  # random play ends each episode by a fall


def test_an_episode_that_never_falls_is_truncated_at_500_steps():
    """A pole held by a controller that reads the full state (CartPole's own, underneath) is
    truncated at step 500, not terminated."""
    env = gym.make(CARTPOLE_NOVEL_ID)
    env.reset(seed=0)
    steps, truncated, terminated = 0, False, False
    while not (terminated or truncated):
        _x, x_dot, theta, theta_dot = env.unwrapped.state
        action = int(theta + 0.5 * theta_dot + 0.01 * x_dot > 0)
        _obs, reward, terminated, truncated, _ = env.step(action)
        assert reward == 1.0
        steps += 1
    assert (steps, truncated, terminated) == (500, True, False)


def test_the_vec_env_serves_two_float_entries_per_env():
    env = GymEnvInf(CARTPOLE_NOVEL_ID, n_envs=3, seed=0)
    try:
        obs, _ = env.reset()
        assert obs["frame"].shape == (3, 2) and obs["frame"].dtype == torch.float32
    finally:
        env.close()
