"""Envs behind gym.make's standard wrappers are stepped through ``unwrapped`` (issue 11): the
data must be exactly what the full wrapper chain gives, time limits included."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstruct.dicttensor import DictTensor
from rlstruct.envs.gym import GymEnv, GymEnvInf
from rlstruct.errors import ActionError


class UserWrapper(gym.Wrapper):
    """Changes nothing, but is not one of gym.make's standard wrappers: full chain stepped."""


def rollout(env, n_steps: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    out = []
    _obs, running = env.reset()
    for _ in range(n_steps):
        if running.numel() == 0:
            break
        action = torch.from_numpy(rng.integers(0, 2, size=running.numel()))
        (obs_t1, _), (_obs, running) = env.step(DictTensor({"action": action}))
        out.append({k: v.clone() for k, v in obs_t1.items()})
        out[-1].update({"next/" + k: v.clone() for k, v in _obs.items()})
    return out


@pytest.mark.parametrize("vec", [GymEnvInf, GymEnv])
def test_fast_path_gives_the_same_data_as_the_full_wrapper_chain(vec):
    limit = 15  # short episodes: many truncations by the time limit
    fast = vec("CartPole-v1", n_envs=3, seed=5, make_kwargs={"max_episode_steps": limit})
    full = vec(
        [lambda: UserWrapper(gym.make("CartPole-v1", max_episode_steps=limit))] * 3, seed=5
    )
    assert fast._own_limits and not full._own_limits
    assert fast._steppers[0] is fast.envs[0].unwrapped
    a, b = rollout(fast, 120), rollout(full, 120)
    assert len(a) == len(b) > 10
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for k in x:
            assert torch.equal(x[k], y[k]), k
    truncated = torch.cat([x["truncated"] for x in a])
    assert truncated.any()  # the time limit was exercised
    # Later resets go where the steps go; the first went through the whole chain.
    assert fast._resetters[0] is fast.envs[0].unwrapped
    assert fast.envs[0].get_wrapper_attr("_has_reset")  # OrderEnforcing saw the first reset
    assert full._resetters[0] is full.envs[0]
    steps_at_truncation = torch.cat([x["env_step"][x["truncated"]] for x in a])
    assert torch.all(steps_at_truncation == limit)


def test_fast_path_keeps_action_checks_and_the_space_answers():
    env = GymEnvInf("CartPole-v1", n_envs=2, seed=0)
    env.reset()
    with pytest.raises(ActionError):
        env.step(DictTensor({"action": torch.tensor([0, 2])}))
    space = env.envs[0].unwrapped.action_space
    assert space.contains(np.int64(1)) and not space.contains(np.int64(2))
    assert space.contains(1) and not space.contains(-1) and not space.contains("1")
    assert space == gym.spaces.Discrete(2)


def test_auto_reset_rows_of_obs_next():
    """GymEnvInf's obs_next: rows that go on are obs_t1's, reset rows are a reset observation
    (initial_state, env_step 0, reward 0, no end flag, the default last_action)."""
    env = GymEnvInf("CartPole-v1", n_envs=4, seed=1, make_kwargs={"max_episode_steps": 7})
    env.reset()
    rng = np.random.default_rng(0)
    n_reset = 0
    for _ in range(40):
        action = DictTensor({"action": torch.from_numpy(rng.integers(0, 2, size=4))})
        (t1, _), (nxt, _) = env.step(action)
        done = t1["done"]
        assert torch.equal(done, t1["terminated"] | t1["truncated"])
        for k in t1:
            assert torch.equal(nxt[k][~done], t1[k][~done]), k
            assert nxt[k].data_ptr() != t1[k].data_ptr() or not done.any(), k
        assert torch.equal(nxt["initial_state"], done)
        assert not (nxt["done"] | nxt["terminated"] | nxt["truncated"]).any()
        for k in ("env_step", "reward", "last_action"):
            assert (nxt[k][done] == 0).all(), k
        assert torch.equal(nxt["frame"][done], torch.from_numpy(env._reset_leaves[0])[done])
        n_reset += int(done.sum())
    assert n_reset >= 4


_I64 = np.iinfo(np.int64)


@pytest.mark.parametrize(
    ("space", "rows"),
    [
        (gym.spaces.Discrete(3, start=-1), [-1, 0, 1, -2, 2, _I64.min, _I64.max]),
        (gym.spaces.Discrete(2), [0, 1, -1, 2, _I64.min]),
        (gym.spaces.MultiDiscrete([2, 3], start=[1, 0]), [[1, 0], [2, 2], [0, 0], [1, 3], [1, -1]]),
        (gym.spaces.MultiBinary(3), [[0, 1, 1], [2, 0, 0], [0, -1, 0]]),
        (
            gym.spaces.Box(np.array([0, -5]), np.array([3, 5]), dtype=np.int64),
            [[0, 5], [3, -5], [4, 0], [0, -6], [_I64.max, 0]],
        ),
    ],
)
def test_integer_action_range_check_agrees_with_the_space(space, rows):
    """The action check (one unsigned comparison per value) accepts exactly what the space
    contains, at the int64 extremes too, and names the first row out of the space."""
    from rlstruct.envs.spaces import ActionSpec

    spec = ActionSpec(space)
    for row in rows:
        action = torch.tensor([row, row])
        inside = space.contains(np.asarray(row, dtype=space.dtype))
        if inside:
            out = spec.to_numpy(action, np.array([4, 7]), 10)
            assert out.dtype == space.dtype and np.array_equal(out, action.numpy())
        else:
            with pytest.raises(ActionError, match=r"env 14: action ") as info:
                spec.to_numpy(action, np.array([4, 7]), 10)
            assert info.value.env_index == 4
