"""Traps that rlstructures users fall into when porting, each caught with an error naming the fix.

1. ``[lambda: e for e in envs]``: Python's late binding makes every factory return the LAST env,
   so a VecEnv would step one env ``n`` times per step. Refused (naming the factories), and what
   was built is closed once.
2. rlstructures' ``GymEnv(envs, seed)``: env instances instead of factories, and the seed where
   rlstruct's ``n_envs`` is. Refused with what changed (factories, ``n_envs``, ``seed=``).
3. ``TimeLimit(env, max_episode_steps=None)`` (gym's "registered limit") raises gymnasium's
   ``TypeError``; a factory doing it gets a note with the gymnasium spelling.

See docs/migrating-from-rlstructures.md ("Traps").
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit

from rlstruct.compat import DictTensor, GymEnv, GymEnvInf
from rlstruct.envs.debug import CounterEnv
from rlstruct.errors import ConfigError


class ClosingEnv(gym.Env):
    """A one-number env that counts its steps and its ``close`` calls."""

    observation_space = spaces.Box(0, 1000, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.n_steps = 0
        self.n_closes = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.n_steps += 1
        return np.full(1, self.n_steps, np.float32), 0.0, False, False, {}

    def close(self) -> None:
        self.n_closes += 1


def zeros(n: int) -> DictTensor:
    return DictTensor({"action": torch.zeros(n, dtype=torch.long)})


# ------------------------------------------------------------------ 1. late binding
@pytest.mark.parametrize("cls", [GymEnv, GymEnvInf])
def test_late_bound_factories_are_refused_naming_them_and_the_fix(cls: type) -> None:
    envs = [ClosingEnv() for _ in range(3)]
    with pytest.raises(ConfigError) as info:
        cls([lambda: e for e in envs])  # noqa: B023 - the trap: every lambda returns envs[2]
    message = str(info.value)
    assert "env factories 0, 1 and 2 returned the same env object (ClosingEnv)" in message
    assert "[lambda e=e: e for e in envs]" in message
    assert "late binding" in message
    # The one env built three times is closed once; the others were never touched.
    assert [e.n_closes for e in envs] == [0, 0, 1]


def test_bound_factories_step_each_env_once_per_step() -> None:
    envs = [ClosingEnv() for _ in range(3)]
    vec = GymEnv([lambda e=e: e for e in envs])
    assert [e is f for e, f in zip(vec.envs, envs)] == [True, True, True]
    vec.reset()
    vec.step(zeros(3))
    (obs_t1, _), _ = vec.step(zeros(3))
    assert [e.n_steps for e in envs] == [2, 2, 2]
    assert obs_t1["frame"].squeeze(1).tolist() == [2.0, 2.0, 2.0]
    vec.close()
    assert [e.n_closes for e in envs] == [1, 1, 1]


def test_only_the_shared_factories_are_named_and_each_env_closed_once() -> None:
    a, b = ClosingEnv(), ClosingEnv()
    with pytest.raises(ConfigError, match=r"^env factories 1 and 3 returned the same env object"):
        GymEnv([lambda: b, lambda: a, lambda: CounterEnv(), lambda: a])
    assert (a.n_closes, b.n_closes) == (1, 1)


def test_wrappers_of_one_env_are_refused_and_the_env_closed_once() -> None:
    base = ClosingEnv()
    with pytest.raises(
        ConfigError, match=r"env factories 0 and 1 returned wrappers of the same env object"
    ):
        GymEnv([lambda: TimeLimit(base, 10) for _ in range(2)])
    assert base.n_closes == 1


def test_a_failing_factory_closes_what_was_built_once() -> None:
    shared = ClosingEnv()

    def broken() -> gym.Env:
        raise RuntimeError("cannot build")

    with pytest.raises(RuntimeError, match="cannot build") as info:
        GymEnv([lambda: shared, lambda: shared, broken])
    assert "raised while building env 2" in info.value.__notes__
    assert shared.n_closes == 1


# ------------------------------------------------------------------ 2. GymEnv(envs, seed)
def test_rlstructures_positional_call_with_two_envs_says_what_changed() -> None:
    env_a, env_b = gym.make("CartPole-v1"), gym.make("CartPole-v1")
    with pytest.raises(ConfigError) as info:
        GymEnv([env_a, env_b], 5)  # rlstructures: GymEnv(gym_env=[...], seed=5)
    message = str(info.value)
    assert message.startswith("GymEnv got a list of 2 env instances (CartPole-v1) and n_envs=5")
    assert "rlstructures' GymEnv(envs, seed)" in message
    assert "its second argument is n_envs" in message
    assert "the seed is the keyword seed=" in message
    assert "GymEnv('CartPole-v1', n_envs=2, seed=5)" in message
    assert "GymEnv([make_env] * 2, seed=5)" in message
    assert "GymEnv([lambda e=e: e for e in envs], seed=5)" in message
    # The caller's envs are left alone (not closed, still usable).
    env_a.reset(seed=0)
    env_a.step(0)


def test_rlstructures_positional_call_with_seed_0_is_not_an_n_envs_error() -> None:
    env_a = gym.make("CartPole-v1")
    with pytest.raises(ConfigError) as info:
        GymEnv([env_a], 0)  # used to say "n_envs must be an int >= 1 or None, got 0"
    message = str(info.value)
    assert "n_envs must be" not in message
    assert message.startswith("GymEnv got a list of 1 env instance (CartPole-v1) and n_envs=0")
    assert "GymEnv('CartPole-v1', n_envs=1, seed=0)" in message


@pytest.mark.parametrize("kwargs", [{}, {"seed": None}, {"seed": 3}])
def test_env_instances_are_refused_before_anything_else(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"^GymEnv got a list of 2 env instances \(ClosingEnv\)"):
        GymEnv([ClosingEnv(), ClosingEnv()], **kwargs)


def test_instances_among_factories_are_named() -> None:
    with pytest.raises(ConfigError, match=r"GymEnv got env instances at positions 1 and 2 \("):
        GymEnvInf([CounterEnv, CounterEnv(), ClosingEnv()])


def test_a_single_instance_still_gets_the_single_instance_fix() -> None:
    fix = "to keep this env instance e, pass [lambda: e]"
    with pytest.raises(ConfigError, match=re.escape(fix)):
        GymEnv(gym.make("CartPole-v1"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n_envs", "match"),
    [
        (5, r"n_envs=5 but 2 env factories were given; GymEnv's second argument is n_envs"),
        (0, r"n_envs must be an int >= 1 or None, got 0; GymEnv's second argument is n_envs"),
    ],
)
def test_a_seed_in_n_envs_place_with_factories_names_the_keyword(n_envs: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        GymEnv([CounterEnv, CounterEnv], n_envs)
    assert f"pass it as the keyword seed={n_envs}" in str(info.value)


# ------------------------------------------------------------------ 3. TimeLimit(None)
def test_time_limit_none_in_a_factory_gets_the_gymnasium_spelling() -> None:
    with pytest.raises(TypeError, match="max_episode_steps") as info:
        GymEnv([lambda: TimeLimit(gym.make("CartPole-v1"), max_episode_steps=None)])
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "gym.make(env_id, max_episode_steps=n)" in notes
    # ... and the spelling works: None keeps the registered limit, an int replaces it.
    for n, limit in ((None, 500), (20, 20)):
        with GymEnv([lambda n=n: gym.make("CartPole-v1", max_episode_steps=n)]) as env:
            assert env.envs[0].spec.max_episode_steps == limit
