"""MuJoCo locomotion (the ``mujoco`` extra): HalfCheetah-v5, Hopper-v5 and Walker2d-v5 in a
``GymEnvInf`` and in the batchers' worker processes, with their float64 observations kept or
cast by ``obs_dtype``.

The MuJoCo tests skip without the ``mujoco`` package (``pip install -e '.[mujoco]'``); the
``obs_dtype`` error tests use gymnasium's classic envs and always run.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rlstruct import DictTensor
from rlstruct.agent import Agent
from rlstruct.batchers import Batcher
from rlstruct.envs import GymEnvInf
from rlstruct.errors import ConfigError

needs_mujoco = pytest.mark.skipif(
    importlib.util.find_spec("mujoco") is None,
    reason="mujoco is not installed (pip install -e '.[mujoco]')",
)
#: env id -> (observation size, action size); every action space is [-1, 1]^D.
ENVS = {"HalfCheetah-v5": (17, 6), "Hopper-v5": (11, 3), "Walker2d-v5": (17, 6)}


class UniformBoxAgent(Agent):
    """Uniform actions in ``[-1, 1]^D`` from torch's global RNG, as a quick user script does."""

    def __init__(self, n_dims: int) -> None:
        self.n_dims = n_dims

    def __call__(self, state, observation, agent_info):
        n = observation["frame"].shape[0]
        return DictTensor({"action": torch.rand(n, self.n_dims) * 2 - 1}), state


@needs_mujoco
@pytest.mark.parametrize("env_id", list(ENVS))
def test_float64_observations_are_kept_or_cast(env_id):
    obs_dim, act_dim = ENVS[env_id]
    action = DictTensor({"action": torch.full((2, act_dim), 0.5)})
    frames = []
    for obs_dtype, expected in ((None, torch.float64), ("float32", torch.float32),
                                (torch.float32, torch.float32)):
        env = GymEnvInf(env_id, n_envs=2, seed=0, obs_dtype=obs_dtype)
        try:
            assert env.observation_specs()["frame"] == (torch.Size([obs_dim]), expected)
            obs, _ = env.reset()
            (answer, _), _ = env.step(action)
        finally:
            env.close()
        assert obs["frame"].dtype == answer["frame"].dtype == expected
        frames.append(answer["frame"])
    # The same seed and actions: the cast observation is the float64 one rounded, nothing else.
    assert torch.equal(frames[1], frames[0].float()) and torch.equal(frames[1], frames[2])


@needs_mujoco
@pytest.mark.slow
@pytest.mark.parametrize(("env_id", "obs_dtype"), [
    ("HalfCheetah-v5", None), ("Hopper-v5", "float32"), ("Walker2d-v5", None),
])
def test_runs_in_batcher_worker_processes(env_id, obs_dtype):
    obs_dim, act_dim = ENVS[env_id]
    env_args = {"env": env_id, "n_envs": 2, "obs_dtype": obs_dtype}
    with Batcher(32, UniformBoxAgent, {"n_dims": act_dim}, GymEnvInf, env_args,
                 n_processes=2, seeds=1) as batcher:
        batcher.reset()
        batcher.execute()
        traj, _ = batcher.get()
    steps = traj.trajectories
    dtype = torch.float64 if obs_dtype is None else torch.float32
    assert steps["observation/frame"].shape == (4, 32, obs_dim) and steps.full()
    assert steps["observation/frame"].dtype == steps["_observation/frame"].dtype == dtype
    assert steps["action/action"].abs().max() <= 1
    reward = steps["_observation/reward"]
    assert torch.isfinite(reward).all() and reward.abs().sum() > 0
    # Within an episode, the env's answer at t is what the agent sees at t + 1.
    going_on = ~steps["_observation/done"][:, :-1]
    assert torch.equal(steps["observation/frame"][:, 1:][going_on],
                       steps["_observation/frame"][:, :-1][going_on])


def test_obs_dtype_refuses_a_non_float_dtype_and_non_box_observations():
    with pytest.raises(ConfigError, match=r"obs_dtype must be a float dtype.*'int32'"):
        GymEnvInf("Pendulum-v1", n_envs=1, obs_dtype="int32")
    with pytest.raises(ConfigError, match=r"obs_dtype must be a float dtype.*'nonsense'"):
        GymEnvInf("Pendulum-v1", n_envs=1, obs_dtype="nonsense")
    with pytest.raises(ConfigError, match=r"casts float Box observations.*Discrete"):
        GymEnvInf("FrozenLake-v1", n_envs=1, obs_dtype="float32")


def test_obs_dtype_casts_float32_observations_up():
    env = GymEnvInf("Pendulum-v1", n_envs=2, seed=0, obs_dtype=torch.float64)
    try:
        obs, _ = env.reset()
    finally:
        env.close()
    assert obs["frame"].dtype == torch.float64 and obs["frame"].shape == (2, 3)


@needs_mujoco
def test_the_settotalmass_warning_prints_at_most_once(capfd) -> None:
    """Issue 38: MuJoCo warns at every model it compiles; HalfCheetah's settotalmass warning
    printed twice (the probe of the spaces, then the training env)."""
    from rlstruct.envs.registry import env_spaces

    capfd.readouterr()
    env_spaces("HalfCheetah-v5")
    GymEnvInf("HalfCheetah-v5", n_envs=2, seed=0).close()
    assert capfd.readouterr().err.count("settotalmass") <= 1
