"""Errors name the real culprit and nothing is cast silently (issue 9, section 3).

- A malformed observation of env 1 names env 1 (``exc.env_index``, the message, and
  ``WorkerError.env`` as the global index through a 2-worker ``Batcher``), not the last env of
  the loop; a list, an int64 value or a narrower dtype for a float32 ``Box`` is refused.
- A reward must be one real number: ``None``, ``"2.5"``, an array of several values or a complex
  number raise :class:`RewardError` naming env and env_step; a finite reward that overflows
  float32 warns (or raises with ``check_finite=True``) naming the env.
- An agent that returns its action on the wrong device, or mixes devices inside one DictTensor,
  is named as the culprit (not the env), with key, devices, worker and step.
"""

from __future__ import annotations

import warnings
from fractions import Fraction
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from support.batcher_helpers import counter_env

from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.batchers.seeding import SEED_BLOCK
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.gym import GymEnv, GymEnvInf
from rlstruct.errors import (
    DeviceContractError,
    RewardError,
    RLStructError,
    ShapeError,
    SpaceError,
    WorkerError,
)

pytestmark = pytest.mark.timeout(120)

RUN_SEED = 3
N_ENVS = 4  # per process; with 2 workers, global env 5 is env 1 of worker 1
BOX = spaces.Box(-1.0, 1.0, (2,), np.float32)

#: Malformed observations of a float32 Box of shape (2,), from a good one.
BAD_OBS = {
    "shape change": lambda good: np.zeros(3, good.dtype),
    "int64 array": lambda good: good.astype(np.int64),
    "int64 scalar": lambda good: np.int64(0),
    "python list": lambda good: good.tolist(),
    # numpy would promote these to the others' float32 without a word: still a cast.
    "int16 array": lambda good: good.astype(np.int16),
    "float16 array": lambda good: good.astype(np.float16),
}


class ScriptedEnv(gym.Env):
    """A float32 Box(2) env (or a Dict of one, ``dict_obs=True``) that returns the malformed
    observation ``BAD_OBS[bad_obs]`` and/or the reward ``reward`` at its ``bad_at``-th step of
    every episode; its other rewards are 0.0 and its observations zeros."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(
        self,
        bad_obs: str | None = None,
        reward: Any = 0.0,
        bad_at: int = 2,
        dict_obs: bool = False,
        episode_length: int = 100,
    ) -> None:
        self.observation_space = spaces.Dict({"x": BOX}) if dict_obs else BOX
        self.action_space = spaces.Discrete(2)
        self.bad_obs, self.reward, self.bad_at = bad_obs, reward, bad_at
        self.dict_obs, self.episode_length = dict_obs, episode_length
        self.t = 0

    def _wrap(self, obs: Any) -> Any:
        return {"x": obs} if self.dict_obs else obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._wrap(np.zeros(2, np.float32)), {}

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        self.t += 1
        due = self.t == self.bad_at
        obs = np.zeros(2, np.float32)
        if due and self.bad_obs is not None:
            obs = BAD_OBS[self.bad_obs](obs)
        reward = self.reward if due else 0.0
        return self._wrap(obs), reward, self.t >= self.episode_length, False, {}


def scripted_env(
    n_envs: int,
    seed: int,
    bad_env: int = -1,
    auto_reset: bool = True,
    dict_obs: bool = False,
    **kwargs: Any,
) -> GymEnv | GymEnvInf:
    """A ``create_env``: ``n_envs`` ScriptedEnvs; the one of GLOBAL index ``bad_env`` (recovered
    from the seed, as in ``batcher_helpers.counter_env``) gets ``kwargs``."""
    first = seed % SEED_BLOCK
    factories = [
        partial(ScriptedEnv, dict_obs=dict_obs, **(kwargs if first + k == bad_env else {}))
        for k in range(n_envs)
    ]
    return (GymEnvInf if auto_reset else GymEnv)(factories, seed=seed, env_id_offset=first)


class ZeroAgent(Agent):
    """Action 0 for every row."""

    def __call__(self, state, observation, agent_info):
        n = observation.n_elems()
        return DictTensor({"action": torch.zeros(n, dtype=torch.long)}), state


class WrongDeviceAgent(Agent):
    """On counter envs: from episode step ``at_t`` on, in the process whose envs include global
    env ``min_env`` or more, returns its action on the ``meta`` device (``mixed=False``) or
    builds ONE DictTensor from a CPU action and meta logits (``mixed=True``)."""

    def __init__(self, min_env: int = 0, at_t: int = 2, mixed: bool = False) -> None:
        self.min_env, self.at_t, self.mixed = min_env, at_t, mixed

    def __call__(self, state, observation, agent_info):
        frame = observation["frame"]
        n = frame.shape[0]
        action = torch.zeros(n, dtype=torch.long)
        bad = bool((frame[:, 0] >= self.min_env).all()) and int(frame[0, 2]) >= self.at_t
        if bad and self.mixed:
            return DictTensor({"action": action, "logits": torch.zeros(n, 2, device="meta")}), state
        if bad:
            action = torch.zeros(n, dtype=torch.long, device="meta")
        return DictTensor({"action": action}), state




def step(env: GymEnv, n: int = N_ENVS) -> Any:
    return env.step(DictTensor({"action": torch.zeros(n, dtype=torch.long)}))


def batcher(create_agent: type, agent_args: dict, create_env: Any, env_args: dict) -> Batcher:
    return Batcher(5, create_agent, agent_args, create_env, env_args, n_processes=2, seeds=RUN_SEED)


# ------------------------------------------------------------------ 1. malformed observations
@pytest.mark.parametrize("dict_obs", [False, True], ids=["box", "dict"])
@pytest.mark.parametrize("bad_obs", list(BAD_OBS))
def test_malformed_observation_names_its_env_not_the_last_one(bad_obs: str, dict_obs: bool) -> None:
    env = scripted_env(N_ENVS, seed=10, bad_env=11, dict_obs=dict_obs, bad_obs=bad_obs)
    env.reset()
    step(env)
    with pytest.raises((ShapeError, SpaceError)) as info:
        step(env)  # env_step 2: env 1 (global 11) misbehaves; env 3 is the loop's last
    assert info.value.env_index == 1
    assert str(info.value).startswith("env 11: observation key ")
    expected = ShapeError if bad_obs in ("shape change", "int64 scalar") else SpaceError
    assert type(info.value) is expected


def test_observation_promotion_is_refused_for_a_float64_box() -> None:
    box64 = spaces.Box(-1.0, 1.0, (2,), np.float64)

    class Env64(ScriptedEnv):
        def __init__(self, narrow: bool = False) -> None:
            super().__init__()
            self.observation_space, self.narrow = box64, narrow

        def reset(self, *, seed=None, options=None):
            obs, info = super().reset(seed=seed, options=options)
            return obs.astype(np.float64), info

        def step(self, action):
            obs, *rest = super().step(action)
            return obs.astype(np.float32 if self.narrow else np.float64), *rest

    env = GymEnv([Env64, Env64, partial(Env64, narrow=True), Env64])
    env.reset()
    with pytest.raises(SpaceError, match=r"env 2: .* dtype float32, expected float64") as info:
        step(env)
    assert info.value.env_index == 2


def test_an_old_gym_four_tuple_step_names_its_env() -> None:
    class OldGym(ScriptedEnv):
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, reward, terminated or truncated, info  # gym < 0.26

    env = GymEnv([ScriptedEnv, OldGym, ScriptedEnv, ScriptedEnv], env_id_offset=10)
    env.reset()
    with pytest.raises(
        ValueError, match=r"^env 11: step\(\) returned 4 values, expected the 5"
    ) as info:
        step(env)
    assert info.value.env_index == 1


@pytest.mark.timeout(180)
def test_malformed_observation_in_a_worker_names_the_global_env() -> None:
    env_args = {"n_envs": N_ENVS, "bad_env": 5, "bad_obs": "python list"}
    with batcher(ZeroAgent, {}, scripted_env, env_args) as b:
        b.reset()
        b.execute()
        with pytest.raises(WorkerError) as info:
            b.get()
    err = info.value
    assert (err.worker, err.env, err.step, err.exc_type) == (1, 5, 1, "SpaceError")
    assert "worker 1, env 5, step 1 during env step: SpaceError: env 5: observation" in str(err)


# ------------------------------------------------------------------ 2. rewards
BAD_REWARDS = {
    "None": None,
    "str": "2.5",
    "array": np.array([1.0, 2.0]),
    "list": [1.0],
    "complex": 1 + 2j,
    "numpy complex": np.complex64(1.0),
    "object": object(),
}


@pytest.mark.parametrize("dict_obs", [False, True], ids=["box", "dict"])
@pytest.mark.parametrize("reward", list(BAD_REWARDS.values()), ids=list(BAD_REWARDS))
def test_a_reward_that_is_not_a_real_number_raises_naming_the_env(
    reward: Any, dict_obs: bool
) -> None:
    env = scripted_env(N_ENVS, seed=10, bad_env=11, dict_obs=dict_obs, reward=reward)
    env.reset()
    step(env)
    with pytest.raises(RewardError, match=r"^env 11: its reward at env_step 2 is ") as info:
        step(env)
    assert isinstance(info.value, TypeError) and isinstance(info.value, RLStructError)
    assert info.value.env_index == 1
    env.reset()  # usable again after a reset
    step(env)


GOOD_REWARDS = {
    "int": (3, 3.0),
    "float": (2.5, 2.5),
    "bool": (True, 1.0),
    "numpy float64": (np.float64(-1.5), -1.5),
    "numpy float32": (np.float32(0.25), 0.25),
    "numpy int64": (np.int64(7), 7.0),
    "numpy bool": (np.bool_(True), 1.0),
    "0-d array": (np.array(2.0), 2.0),
    "0-d tensor": (torch.tensor(4.0), 4.0),
    "Fraction": (Fraction(1, 4), 0.25),
    "huge int": (10**30, float(np.float32(1e30))),
    "nan": (float("nan"), float("nan")),
}


@pytest.mark.parametrize("value, stored", list(GOOD_REWARDS.values()), ids=list(GOOD_REWARDS))
def test_real_scalar_rewards_are_accepted(value: Any, stored: float) -> None:
    env = scripted_env(N_ENVS, seed=0, bad_env=1, reward=value, bad_at=1)
    env.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (obs_t1, _), _ = step(env)
    reward = obs_t1["reward"]
    assert reward.dtype == torch.float32
    torch.testing.assert_close(
        reward, torch.tensor([0.0, stored, 0.0, 0.0]), equal_nan=True, rtol=0, atol=0
    )


@pytest.mark.parametrize(
    "value", [1e40, -1e40, np.float64(1e39), 10**400], ids=["1e40", "-1e40", "np1e39", "10**400"]
)
def test_a_reward_overflowing_float32_warns_naming_the_env(value: Any) -> None:
    env = scripted_env(N_ENVS, seed=10, bad_env=11, reward=value, bad_at=1)
    env.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (obs_t1, _), _ = step(env)
    assert [w.category for w in caught] == [RuntimeWarning]  # not numpy's anonymous one too
    assert str(caught[0].message).startswith("env 11: the reward ")
    assert "at env_step 1 overflows float32" in str(caught[0].message)
    assert obs_t1["reward"].tolist() == [0.0, float("inf") if value > 0 else -float("inf"), 0, 0]


def test_a_reward_overflowing_float32_raises_with_check_finite() -> None:
    factories = [ScriptedEnv, partial(ScriptedEnv, reward=1e40, bad_at=1), ScriptedEnv]
    env = GymEnvInf(factories, env_id_offset=20, check_finite=True)
    env.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(
            FloatingPointError,
            match=r"^env 21: the reward 1e\+40 at env_step 1 overflows float32 .*check_finite",
        ) as info:
            step(env, 3)
    assert info.value.env_index == 1


@pytest.mark.timeout(180)
def test_a_bad_reward_in_a_worker_names_worker_global_env_and_step() -> None:
    env_args = {"n_envs": N_ENVS, "bad_env": 6, "reward": "2.5", "bad_at": 3}
    with batcher(ZeroAgent, {}, scripted_env, env_args) as b:
        b.reset()
        b.execute()
        with pytest.raises(WorkerError) as info:
            b.get()
    err = info.value
    assert (err.worker, err.env, err.step, err.exc_type) == (1, 6, 2, "RewardError")
    assert "env 6: its reward at env_step 3 is '2.5' (str)" in str(err)


# ------------------------------------------------------------------ 3. agent on the wrong device
def _assert_names_the_agent(message: str, name: str) -> None:
    assert f"the agent {name} returned action/action on meta, expected cpu" in message
    assert "the agent is the culprit, not the env" in message
    assert "rlstruct.CheckDevice(agent, 'cpu')" in message
    assert "DeviceEnv" not in message  # the old advice blamed the VecEnv


def test_agent_action_on_the_wrong_device_names_the_agent_serial() -> None:
    with SerialBatcher(
        5, WrongDeviceAgent, {}, counter_env, {"n_envs": N_ENVS, "auto_reset": True}
    ) as b:
        b.reset()
        with pytest.raises(DeviceContractError) as info:
            b.execute()
    err = info.value
    assert str(err).startswith("worker 0, step 2: ")
    _assert_names_the_agent(str(err), "WrongDeviceAgent")
    assert (err.argument, err.key) == ("action", "action/action")
    assert (err.expected, err.actual) == (torch.device("cpu"), torch.device("meta"))
    ctx = err.rlstruct_context
    assert (ctx.phase, ctx.step, ctx.env) == ("agent call", 2, None)


def test_agent_new_state_on_the_wrong_device_names_the_agent() -> None:
    class MetaState(ZeroAgent):
        def initial_state(self, agent_info, n):
            return DictTensor({"h": torch.zeros(n, 2)})

        def __call__(self, state, observation, agent_info):
            action, _ = super().__call__(state, observation, agent_info)
            return action, DictTensor({"h": torch.zeros(observation.n_elems(), 2, device="meta")})

    with SerialBatcher(3, MetaState, {}, counter_env, {"n_envs": N_ENVS, "auto_reset": True}) as b:
        b.reset()
        with pytest.raises(DeviceContractError, match=r"new_state\['h'\] on meta") as info:
            b.execute()
    assert (info.value.argument, info.value.key) == ("new_state", "h")


@pytest.mark.timeout(180)
def test_agent_action_on_the_wrong_device_names_the_agent_in_a_worker() -> None:
    env_args = {"n_envs": N_ENVS, "auto_reset": True}
    with batcher(WrongDeviceAgent, {"min_env": N_ENVS}, counter_env, env_args) as b:
        b.reset()
        b.execute()
        with pytest.raises(WorkerError) as info:
            b.get()
    err = info.value
    assert (err.worker, err.env, err.step, err.exc_type) == (1, None, 2, "DeviceContractError")
    assert str(err).startswith("worker 1, step 2 during agent call: DeviceContractError: ")
    _assert_names_the_agent(str(err), "WrongDeviceAgent")


def test_agent_mixing_devices_in_one_dicttensor_is_named_serial() -> None:
    args = {"mixed": True}
    with SerialBatcher(
        5, WrongDeviceAgent, args, counter_env, {"n_envs": N_ENVS, "auto_reset": True}
    ) as b:
        b.reset()
        with pytest.raises(DeviceContractError) as info:
            b.execute()
    err = info.value
    assert str(err).startswith(
        "worker 0, step 2: the agent's call (WrongDeviceAgent.__call__) raised: key 'logits' is "
        "on meta, expected cpu like the other tensors"
    )
    assert "rlstruct.CheckDevice(agent, 'cpu')" in str(err)
    assert (err.key, err.expected, err.actual) == (
        "logits",
        torch.device("cpu"),
        torch.device("meta"),
    )
    assert isinstance(err.__cause__, DeviceContractError)  # the original, with its traceback
    assert err.rlstruct_context.phase == "agent call"


def test_agent_mixing_devices_in_its_first_call_is_named_by_the_constructor() -> None:
    with pytest.raises(
        DeviceContractError,
        match=r"^the batcher's first agent call: the agent's call \(WrongDeviceAgent.__call__\) "
        r"raised: key 'logits' is on meta",
    ):
        SerialBatcher(
            5, WrongDeviceAgent, {"mixed": True, "at_t": 0}, counter_env, {"n_envs": N_ENVS}
        )


@pytest.mark.timeout(180)
def test_agent_mixing_devices_in_a_worker_is_named() -> None:
    env_args = {"n_envs": N_ENVS, "auto_reset": True}
    args = {"min_env": N_ENVS, "mixed": True}
    with batcher(WrongDeviceAgent, args, counter_env, env_args) as b:
        b.reset()
        b.execute()
        with pytest.raises(WorkerError) as info:
            b.get()
    err = info.value
    assert (err.worker, err.step, err.exc_type) == (1, 2, "DeviceContractError")
    assert "the agent's call (WrongDeviceAgent.__call__) raised: key 'logits' is on meta" in str(
        err
    )
