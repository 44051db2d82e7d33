"""Tests of GymEnv and GymEnvInf: running sets, final vs reset observations, spaces, actions."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlstruct import DictTensor
from rlstruct.envs import CounterEnv, GymEnv, GymEnvInf, RepeatEnv, make_counter_env
from rlstruct.errors import (
    ActionError,
    BatcherStateError,
    ConfigError,
    DeviceContractError,
    KeyMismatchError,
    ObservationError,
    ShapeError,
    SpaceError,
)

ENV_KEYS = ["reward", "terminated", "truncated", "done", "initial_state", "last_action", "env_step"]


class SpaceEnv(gym.Env):
    """Any observation/action space; records what it returned and received.

    Observations are samples of the (seeded) observation space, or ``obs_fn(t)``; reward is t.
    """

    def __init__(
        self,
        obs_space: gym.Space,
        act_space: gym.Space | None = None,
        episode_length: int = 3,
        obs_fn: Callable[[int], Any] | None = None,
        info_fn: Callable[[int], dict] | None = None,
        reward_fn: Callable[[int], float] | None = None,
    ) -> None:
        self.observation_space = copy.deepcopy(obs_space)
        self.action_space = copy.deepcopy(act_space) if act_space else spaces.Discrete(2)
        self.episode_length = episode_length
        self.obs_fn, self.info_fn, self.reward_fn = obs_fn, info_fn, reward_fn
        self.returned: list[Any] = []
        self.actions: list[Any] = []
        self.seeds: list[int | None] = []
        self.options: list[Any] = []
        self.n_steps = 0
        self._t = 0

    def _obs(self) -> Any:
        obs = self.obs_fn(self._t) if self.obs_fn else self.observation_space.sample()
        self.returned.append(obs)
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.seeds.append(seed)
        self.options.append(options)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.n_steps += 1
        self.actions.append(action)
        self._t += 1
        info = self.info_fn(self._t) if self.info_fn else {}
        reward = self.reward_fn(self._t) if self.reward_fn else float(self._t)
        return self._obs(), reward, self._t >= self.episode_length, False, info


def space_env(n: int, obs_space: gym.Space, cls: type = GymEnv, **kwargs: Any) -> GymEnv:
    env_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k not in _VEC_KWARGS}
    return cls([partial(SpaceEnv, obs_space, **env_kwargs) for _ in range(n)], **kwargs)


_VEC_KWARGS = {
    "seed", "info_keys", "env_info_keys", "env_id_offset", "check_finite", "check_obs"
}


def counters(lengths: list[Any], cls: type = GymEnv, **kwargs: Any) -> GymEnv:
    return cls(
        [partial(CounterEnv, env_id=k, episode_length=length) for k, length in enumerate(lengths)],
        **kwargs,
    )


def act(*values: Any, dtype: torch.dtype = torch.long) -> DictTensor:
    return DictTensor({"action": torch.tensor(values, dtype=dtype)})


def get_leaf(obs: Any, key: str) -> Any:
    if key == "frame":
        return obs
    for part in key.split("/"):
        obs = obs[int(part)] if isinstance(obs, tuple) else obs[part]
    return obs


# ------------------------------------------------------------------ running sets and flags
def test_episodic_running_set_shrinks() -> None:
    env = counters([1, 3, 2])
    obs, running = env.reset()
    assert running.tolist() == [0, 1, 2] and running.dtype == torch.int64
    assert obs["frame"].tolist() == [[0, 0, 0], [1, 0, 0], [2, 0, 0]]
    expected_running = [[1, 2], [1], []]
    for t, still in enumerate(expected_running, start=1):
        n, before = running.shape[0], running.tolist()
        (obs_t1, was), (obs_next, running) = env.step(act(*[1] * n))
        assert was.tolist() == before and was.dtype == running.dtype == torch.int64
        assert obs_t1.n_elems() == n
        assert obs_t1["frame"][:, 2].tolist() == [t] * n  # the TRUE t of each stepped env
        assert running.tolist() == still
        assert obs_next.n_elems() == len(still)
        assert obs_next["frame"][:, 0].tolist() == still  # rows follow `running`
        assert not obs_next["done"].any()
    assert was.tolist() == [1]
    assert obs_t1["done"].tolist() == [True] and obs_t1["frame"].tolist() == [[1, 0, 3]]
    with pytest.raises(BatcherStateError, match="no running env"):
        env.step(act())
    obs, running = env.reset()  # a new episode for every env
    assert obs["frame"][:, 1].tolist() == [1, 1, 1] and running.tolist() == [0, 1, 2]


def test_auto_reset_keeps_all_rows_and_true_final_observation() -> None:
    env = counters([2, 3], cls=GymEnvInf)
    env.reset()
    for _ in range(3):
        (obs_t1, was), (obs_next, running) = env.step(act(1, 1))
        assert was.tolist() == running.tolist() == [0, 1]
        assert obs_t1.n_elems() == obs_next.n_elems() == 2
    # Step 3: env 1 ended its first episode (t=3); env 0 is at t=1 of its second.
    assert obs_t1["frame"].tolist() == [[0, 1, 1], [1, 0, 3]]
    assert obs_t1["done"].tolist() == [False, True]
    assert obs_t1["terminated"].tolist() == [False, True]
    assert obs_t1["env_step"].tolist() == [1, 3]
    assert obs_t1["reward"].tolist() == [1.0, 1.0]
    assert obs_t1["last_action"].tolist() == [1, 1]
    assert obs_t1["initial_state"].tolist() == [False, False]
    # obs_next: env 1 shows its reset observation, env 0 the same row as obs_t1.
    assert obs_next["frame"].tolist() == [[0, 1, 1], [1, 1, 0]]
    assert obs_next["initial_state"].tolist() == [False, True]
    assert obs_next["env_step"].tolist() == [1, 0]
    assert obs_next["done"].tolist() == [False, False]
    assert obs_next["terminated"].tolist() == [False, False]
    assert obs_next["reward"].tolist() == [1.0, 0.0]
    assert obs_next["last_action"].tolist() == [1, 0]


def test_auto_reset_step_before_and_after_each_end() -> None:
    env = counters([2], cls=GymEnvInf)
    env.reset()
    frames = []
    for _ in range(5):
        (obs_t1, _), (obs_next, _) = env.step(act(0))
        frames.append((obs_t1["frame"][0].tolist(), obs_next["frame"][0].tolist()))
    assert frames == [
        ([0, 0, 1], [0, 0, 1]),
        ([0, 0, 2], [0, 1, 0]),
        ([0, 1, 1], [0, 1, 1]),
        ([0, 1, 2], [0, 2, 0]),
        ([0, 2, 1], [0, 2, 1]),
    ]


@pytest.mark.parametrize("truncate", [False, True])
def test_terminated_vs_truncated(truncate: bool) -> None:
    env = GymEnv([partial(CounterEnv, episode_length=1, truncate=truncate)])
    env.reset()
    (obs_t1, _), (obs_next, running) = env.step(act(0))
    assert obs_t1["terminated"].tolist() == [not truncate]
    assert obs_t1["truncated"].tolist() == [truncate]
    assert obs_t1["done"].tolist() == [True]
    assert running.numel() == 0 and obs_next.n_elems() == 0
    assert set(obs_next.keys()) == set(obs_t1.keys())


def test_keys_and_dtypes_equal_at_reset_and_step() -> None:
    env = make_counter_env(2, auto_reset=True, episode_length=1, info_keys=("x",))
    specs = env.observation_specs()
    obs, _ = env.reset()
    assert obs.specs() == specs
    (obs_t1, _), (obs_next, _) = env.step(act(0, 1))
    assert obs_t1.specs() == obs_next.specs() == specs
    assert list(specs) == ["frame", *ENV_KEYS, "info/x"]
    assert specs["frame"] == (torch.Size([3]), torch.int64)
    assert specs["reward"] == (torch.Size([]), torch.float32)
    assert specs["env_step"] == (torch.Size([]), torch.int64)
    assert all(specs[k][1] == torch.bool for k in ["terminated", "truncated", "done"])
    assert specs["initial_state"][1] == torch.bool
    assert obs["initial_state"].all() and not obs["done"].any() and not obs["reward"].any()


def test_returned_tensors_do_not_alias_the_next_step() -> None:
    env = counters([5, 5], cls=GymEnvInf)
    obs, _ = env.reset()
    (obs_t1, _), _ = env.step(act(0, 0))
    kept = obs_t1.clone()
    env.step(act(1, 1))
    assert obs_t1.equal(kept)
    assert obs["frame"][:, 2].tolist() == [0, 0]


# ------------------------------------------------------------------ observation spaces
@pytest.mark.parametrize(
    ("space", "dtype", "shape"),
    [
        (spaces.Box(0, 255, (2, 3), np.uint8), torch.uint8, (2, 3)),
        (spaces.Box(-1, 1, (4,), np.float64), torch.float64, (4,)),
        (spaces.Box(-1, 1, (), np.float32), torch.float32, ()),
        (spaces.Discrete(5), torch.int64, ()),
        (spaces.MultiDiscrete([2, 3]), torch.int64, (2,)),
        (spaces.MultiBinary(3), torch.int8, (3,)),
    ],
)
def test_observation_dtype_and_values_preserved(
    space: gym.Space, dtype: torch.dtype, shape: tuple
) -> None:
    env = space_env(2, space)
    obs, _ = env.reset()
    (obs_t1, _), _ = env.step(act(0, 1))
    for o, i in ((obs, 0), (obs_t1, 1)):
        assert next(iter(o.keys())) == "frame"
        assert o["frame"].dtype == dtype and o["frame"].shape == (2, *shape)
        for k, gym_env in enumerate(env.envs):
            expected = torch.as_tensor(np.asarray(gym_env.returned[i]))
            assert torch.equal(o["frame"][k], expected.to(dtype))


def test_discrete_observation_given_as_python_int() -> None:
    env = GymEnvInf([partial(RepeatEnv, n_symbols=7, one_hot=False) for _ in range(3)], seed=0)
    obs, _ = env.reset()
    assert obs["frame"].dtype == torch.int64 and obs["frame"].shape == (3,)
    symbols = [e.unwrapped._symbol for e in env.envs]
    assert obs["frame"].tolist() == symbols
    (obs_t1, _), _ = env.step(DictTensor({"action": obs["frame"]}))
    assert obs_t1["reward"].tolist() == [1.0, 1.0, 1.0]
    assert obs_t1["frame"].tolist() == [e.unwrapped._symbol for e in env.envs]


def _dict_space() -> spaces.Dict:
    return spaces.Dict(
        {
            "img": spaces.Box(0, 255, (2, 2), np.uint8),
            "pos": spaces.Tuple((spaces.Discrete(3), spaces.Box(-1, 1, (2,), np.float64))),
            "deep": spaces.Dict({"bits": spaces.MultiBinary(3)}),
        }
    )


@pytest.mark.parametrize(
    ("space", "keys"),
    [
        (_dict_space(), ["deep/bits", "img", "pos/0", "pos/1"]),
        (
            spaces.Tuple((spaces.Box(0, 1, (2,)), spaces.Dict({"x": spaces.Discrete(4)}))),
            ["0", "1/x"],
        ),
    ],
)
@pytest.mark.parametrize("cls", [GymEnv, GymEnvInf])
def test_dict_and_tuple_observations_round_trip(
    space: gym.Space, keys: list[str], cls: type
) -> None:
    env = space_env(3, space, cls=cls, episode_length=2)
    obs, _ = env.reset()
    assert list(obs.keys()) == keys + ENV_KEYS
    observed = [obs]
    for _ in range(2):
        (obs_t1, _), (obs_next, _) = env.step(act(0, 1, 0))
        observed.append(obs_t1)
    for i, o in enumerate(observed):
        for key in keys:
            for k, gym_env in enumerate(env.envs):
                value = np.asarray(get_leaf(gym_env.returned[i], key))
                assert o[key][k].numpy().dtype == value.dtype
                np.testing.assert_array_equal(o[key][k].numpy(), value)
    if cls is GymEnvInf:  # the reset observation of the second episode
        for key in keys:
            for k, gym_env in enumerate(env.envs):
                np.testing.assert_array_equal(
                    obs_next[key][k].numpy(), get_leaf(gym_env.returned[3], key)
                )


class MySpace(gym.Space):
    def sample(self, mask: Any = None, probability: Any = None) -> int:
        return 0

    def contains(self, x: Any) -> bool:
        return True


class MyBox(spaces.Box):
    pass


@pytest.mark.parametrize(
    ("space", "match"),
    [
        (spaces.Text(5), r"Text.*not supported.*ObservationWrapper"),
        (spaces.Graph(spaces.Box(0, 1, (2,)), None), r"Graph.*not supported"),
        (spaces.Sequence(spaces.Discrete(2)), r"Sequence.*not supported"),
        (spaces.OneOf((spaces.Discrete(2), spaces.Discrete(3))), r"OneOf.*not supported"),
        (MySpace(), r"MySpace.*not supported.*Box or a Dict"),
        (MyBox(0, 1, (2,)), r"MyBox.*not supported"),
        (spaces.Dict({"a": spaces.Dict({"b": spaces.Text(3)})}), r"Text.*at key 'a/b'"),
        (spaces.Dict({"reward": spaces.Discrete(2)}), r"'reward' .*collides"),
    ],
)
def test_unsupported_observation_space_raises(space: gym.Space, match: str) -> None:
    with pytest.raises(SpaceError, match=match):
        GymEnv([lambda: SpaceEnv(space)])
    with pytest.raises(TypeError):  # SpaceError is a TypeError
        GymEnvInf([lambda: SpaceEnv(space)])


@pytest.mark.parametrize(
    "act_space",
    [spaces.Dict({"a": spaces.Discrete(2)}), spaces.Tuple((spaces.Discrete(2),)), spaces.Text(3)],
)
def test_unsupported_action_space_raises(act_space: gym.Space) -> None:
    with pytest.raises(SpaceError, match=r"action space .*not supported.*ActionWrapper"):
        GymEnv([lambda: SpaceEnv(spaces.Discrete(2), act_space)])


def test_envs_with_different_spaces_raise() -> None:
    with pytest.raises(SpaceError, match=r"env 1 has the observation space .*env 0 has"):
        GymEnv([lambda: SpaceEnv(spaces.Discrete(2)), lambda: SpaceEnv(spaces.Discrete(3))])


@pytest.mark.parametrize(
    ("obs_fn", "error", "match"),
    [
        (
            lambda t: np.zeros(2, np.float64),
            SpaceError,
            r"env 1: .*'frame' has dtype float64, expected float32.*DtypeObservation",
        ),
        (
            lambda t: np.zeros(3, np.float32),
            ShapeError,
            r"env 1: .*'frame' has shape \(3,\), expected \(2,\)",
        ),
        (lambda t: [0.0, 0.0], SpaceError, r"dtype list"),
    ],
)
def test_observation_not_matching_its_space_raises(
    obs_fn: Callable, error: type, match: str
) -> None:
    def good_fn(t: int) -> np.ndarray:
        return np.zeros(2, np.float32)

    def bad_fn(t: int) -> Any:
        return obs_fn(t) if t > 0 else good_fn(t)  # a valid reset, then a bad step

    good = partial(SpaceEnv, spaces.Box(0, 1, (2,)), obs_fn=good_fn)
    bad = partial(SpaceEnv, spaces.Box(0, 1, (2,)), obs_fn=bad_fn)
    env = GymEnv([good, bad])
    env.reset()
    with pytest.raises(error, match=match) as info:
        env.step(act(0, 0))
    assert info.value.env_index == 1
    with pytest.raises(BatcherStateError, match="before reset"):
        env.step(act(0, 0))
    env.reset()  # usable again


def test_dict_observation_missing_key_raises() -> None:
    space = spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Discrete(2)})
    env = GymEnv([lambda: SpaceEnv(space, obs_fn=lambda t: {"a": 0})])
    with pytest.raises(KeyMismatchError, match=r"env 0: .*no 'b'"):
        env.reset()


# ------------------------------------------------------------------ actions
@pytest.mark.parametrize(
    ("act_space", "default", "action", "dtype"),
    [
        (spaces.Discrete(3), 0, 2, torch.int64),
        (spaces.Discrete(3, start=2), 2, 4, torch.int64),
        (spaces.MultiDiscrete([2, 3]), [0, 0], [1, 2], torch.int64),
        (spaces.MultiBinary(3), [0, 0, 0], [1, 0, 1], torch.int8),
        (spaces.Box(-1, 1, (2,)), [0.0, 0.0], [0.5, -1.0], torch.float32),
        (spaces.Box(1, 2, (2,), np.float64), [1.0, 1.0], [1.5, 2.0], torch.float64),
        (
            spaces.Box(np.array([-2.0, -3.0], np.float32), np.array([-1.0, 4.0], np.float32)),
            [-1.0, 0.0],
            [-1.5, 4.0],
            torch.float32,
        ),
    ],
)
@pytest.mark.parametrize("cls", [GymEnv, GymEnvInf])
def test_every_action_space_and_last_action(
    act_space: gym.Space, default: Any, action: Any, dtype: torch.dtype, cls: type
) -> None:
    env = space_env(2, spaces.Discrete(2), cls=cls, act_space=act_space, episode_length=1)
    obs, _ = env.reset()
    assert obs["last_action"].dtype == dtype
    assert obs["last_action"].tolist() == [default, default]
    a = torch.tensor([action, action])
    (obs_t1, _), (obs_next, _) = env.step(DictTensor({"action": a}))
    assert obs_t1["last_action"].dtype == dtype
    assert obs_t1["last_action"].tolist() == [action, action]
    for gym_env in env.envs:
        got = gym_env.actions[-1]
        assert act_space.contains(got)
        np.testing.assert_array_equal(got, np.asarray(action, dtype=act_space.dtype))
    if cls is GymEnvInf:  # episode_length=1: every row was reset
        assert obs_next["last_action"].tolist() == [default, default]


@pytest.mark.parametrize(
    ("act_space", "action", "match"),
    [
        (spaces.Discrete(3), [0, 3], r"env 1: action 3 is outside the action space Discrete\(3\)"),
        (spaces.Discrete(3), [-1, 0], r"env 0: action -1 is outside .*Discrete\(3\)"),
        (
            spaces.Discrete(3, start=1),
            [0, 1],
            r"env 0: action 0 is outside .*Discrete\(3, start=1\)",
        ),
        (
            spaces.MultiDiscrete([2, 3]),
            [[1, 2], [1, 3]],
            r"env 1: action \[1, 3\].*MultiDiscrete",
        ),
        (
            spaces.MultiBinary(2),
            [[0, 2], [0, 1]],
            r"env 0: action \[0, 2\].*MultiBinary\(2\)",
        ),
        (
            spaces.Box(-1, 1, (2,)),
            [[0.0, 0.0], [float("nan"), 0.0]],
            r"env 1: action \[nan.*Box\(-1.0, 1.0, \(2,\), float32\).*NaN/Inf",
        ),
        (
            spaces.Box(-np.inf, np.inf, (1,)),
            [[float("inf")], [0.0]],
            r"env 0: action \[inf\].*Box",
        ),
        (
            spaces.Box(-1, 1, (1,)),
            [[0.0], [1.5]],
            r"env 1: action \[1.5\].*out of \[low, high\]",
        ),
        (
            spaces.Discrete(3),
            [[0], [1]],
            r"action has shape \(2, 1\), expected \(2,\) .*Discrete\(3\)",
        ),
        (spaces.Box(-1, 1, (2,)), [[0.0], [0.0]], r"shape \(2, 1\), expected \(2, 2\)"),
        (
            spaces.Discrete(3),
            [0.0, 1.0],
            r"dtype torch.float32 is not an integer dtype.*Discrete\(3\)",
        ),
    ],
)
def test_bad_action_raises_before_any_env_steps(
    act_space: gym.Space, action: list, match: str
) -> None:
    env = space_env(2, spaces.Discrete(2), act_space=act_space)
    env.reset()
    with pytest.raises(ActionError, match=match):
        env.step(DictTensor({"action": torch.tensor(action)}))
    assert [e.n_steps for e in env.envs] == [0, 0]
    # The VecEnv stays usable after a rejected action.
    good = torch.as_tensor(np.stack([act_space.sample(), act_space.sample()]))
    (obs_t1, _), _ = env.step(DictTensor({"action": good}))
    assert [e.n_steps for e in env.envs] == [1, 1] and obs_t1["env_step"].tolist() == [1, 1]


def test_bad_action_names_global_env_id() -> None:
    env = make_counter_env(3, env_id_offset=10)
    env.reset()
    with pytest.raises(ActionError, match=r"env 12: action 5 "):
        env.step(act(0, 1, 5))
    env.step(act(0, 1, 1))
    # Episodic: env 0 done -> the rows are envs 1 and 2; errors keep naming them right.
    env = counters([1, 3, 3], env_id_offset=10)
    env.reset()
    env.step(act(0, 0, 0))
    with pytest.raises(ActionError, match=r"env 11: action 7 ") as info:
        env.step(act(7, 0))
    assert info.value.env_index == 1


def test_step_errors() -> None:
    env = counters([3, 3])
    with pytest.raises(BatcherStateError, match="before reset"):
        env.step(act(0, 0))
    env.reset()
    with pytest.raises(ShapeError, match="action has 3 rows, expected 2"):
        env.step(act(0, 0, 0))
    with pytest.raises(KeyMismatchError, match="no key 'action'"):
        env.step(DictTensor({"a": torch.zeros(2, dtype=torch.long)}))
    with pytest.raises(DeviceContractError, match="DeviceEnv") as info:
        env.step(DictTensor({"action": torch.zeros(2, dtype=torch.long, device="meta")}))
    assert info.value.actual == torch.device("meta")
    env.step(act(0, 0))
    env.close()
    env.close()  # idempotent
    with pytest.raises(BatcherStateError, match="closed"):
        env.reset()


def test_env_exception_names_env_and_requires_reset() -> None:
    env = GymEnvInf(
        [partial(CounterEnv, env_id=k, fail_at=(0, 2) if k == 1 else None) for k in range(3)],
        env_id_offset=4,
    )
    env.reset()
    env.step(act(0, 0, 0))
    with pytest.raises(RuntimeError, match="injected failure") as info:
        env.step(act(0, 0, 0))
    assert info.value.env_index == 1  # local; the note names the global index
    notes = getattr(info.value, "__notes__", ["its env 1, global id 5 (env_step 2)"])
    assert any("its env 1, global id 5 (env_step 2)" in note for note in notes)
    with pytest.raises(BatcherStateError):
        env.step(act(0, 0, 0))


# ------------------------------------------------------------------ env_info, info_keys
class OptionsEnv(CounterEnv):
    """A CounterEnv that records the options of each reset."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[Any] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        self.seen.append(options)
        return super().reset(seed=seed, options=options)


@pytest.mark.parametrize("cls", [GymEnv, GymEnvInf])
def test_env_info_round_trip(cls: type) -> None:
    env = cls([partial(OptionsEnv, env_id=k, episode_length=9) for k in range(2)])
    env_info = DictTensor(
        {
            "episode_length": torch.tensor([1, 2]),
            "goal": torch.tensor([[0.5, 1.0], [2.0, 3.0]], dtype=torch.float64),
        }
    )
    env.reset(env_info)
    for k, gym_env in enumerate(env.envs):
        options = gym_env.seen[-1]
        assert set(options) == {"episode_length", "goal"}
        assert options["episode_length"] == k + 1 and isinstance(options["episode_length"], int)
        assert isinstance(options["goal"], np.ndarray)
        np.testing.assert_array_equal(options["goal"], env_info["goal"][k].numpy())
    (obs_t1, _), _ = env.step(act(0, 0))
    assert obs_t1["done"].tolist() == [True, False]  # the env read its options
    if cls is GymEnvInf:  # auto-resets reuse the env_info of the last reset()
        env.step(act(0, 0))
        assert [len(e.seen) for e in env.envs] == [3, 2]
        assert env.envs[0].seen[-1]["episode_length"] == 1
        assert env.envs[1].seen[-1]["episode_length"] == 2
    env.reset()  # no env_info: no options
    assert [e.seen[-1] for e in env.envs] == [None, None]


def test_env_info_keys_and_errors() -> None:
    env = GymEnv(
        [partial(OptionsEnv, env_id=k) for k in range(2)], env_info_keys=["episode_length"]
    )
    env.reset(DictTensor({"episode_length": torch.tensor([2, 3]), "other": torch.zeros(2)}))
    assert env.envs[0].seen[-1] == {"episode_length": 2}
    with pytest.raises(KeyMismatchError, match=r"env_info lacks \['episode_length'\]"):
        env.reset(DictTensor({"other": torch.zeros(2)}))
    with pytest.raises(ShapeError, match="env_info has 3 rows, expected 2"):
        env.reset(DictTensor({"episode_length": torch.tensor([2, 3, 4])}))


@pytest.mark.parametrize("cls", [GymEnv, GymEnvInf])
def test_info_keys(cls: type) -> None:
    env = space_env(
        2,
        spaces.Discrete(2),
        cls=cls,
        info_fn=lambda t: {"x": t * 0.5, "s": "text"} if t > 1 else {},
        info_keys=["x"],
        episode_length=5,
    )
    obs, _ = env.reset()
    assert obs["info/x"].dtype == torch.float32 and obs["info/x"].tolist() == [0.0, 0.0]
    (obs_t1, _), _ = env.step(act(0, 0))
    assert obs_t1["info/x"].tolist() == [0.0, 0.0]  # absent at t=1
    (obs_t1, _), (obs_next, _) = env.step(act(0, 0))
    assert obs_t1["info/x"].tolist() == [1.0, 1.0] == obs_next["info/x"].tolist()
    env = space_env(1, spaces.Discrete(2), info_fn=lambda t: {"s": "text"}, info_keys=["s"])
    env.reset()
    with pytest.raises(ConfigError, match=r"env 0: info\['s'\] is 'text' \(str\)"):
        env.step(act(0))


# ------------------------------------------------------------------ seeding
def _symbols(seed: int, n: int = 3, steps: int = 20) -> torch.Tensor:
    env = GymEnvInf(
        [partial(RepeatEnv, n_symbols=50, episode_length=4) for _ in range(n)], seed=seed
    )
    obs, _ = env.reset()
    rows = [obs["frame"].argmax(-1)]
    for _ in range(steps):
        _, (obs, _) = env.step(act(*[0] * n))
        rows.append(obs["frame"].argmax(-1))
    return torch.stack(rows, 1)  # (n, steps + 1)


def test_seeding_distinct_reproducible_and_offset() -> None:
    a, b, c = _symbols(3), _symbols(3), _symbols(4)
    assert torch.equal(a, b)  # run to run
    assert not torch.equal(a, c)  # another seed
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[1], a[2])  # distinct per env
    assert torch.equal(a[1], c[0]) and torch.equal(a[2], c[1])  # env k uses seed + k


def test_first_reset_only_is_seeded_and_action_space_seeded() -> None:
    env = space_env(3, spaces.Discrete(2), cls=GymEnvInf, seed=7, episode_length=1)
    for k, gym_env in enumerate(env.envs):
        expected = spaces.Discrete(2)
        expected.seed(7 + k)
        assert [gym_env.action_space.sample() for _ in range(20)] == [
            expected.sample() for _ in range(20)
        ]
    env.reset()
    env.step(act(0, 0, 0))  # auto-reset
    env.reset()
    assert [e.seeds for e in env.envs] == [[7, None, None], [8, None, None], [9, None, None]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_envs": 0}, "n_envs must be an int >= 1"),
        ({"n_envs": 3}, "n_envs=3 but 2 env factories"),
        ({"seed": -1}, "seed must be an int >= 0"),
        ({"make_kwargs": {"x": 1}}, "make_kwargs only applies"),
        ({"info_keys": "x"}, "info_keys must be a sequence"),
    ],
)
def test_config_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        GymEnv([CounterEnv, CounterEnv], **kwargs)


def test_config_errors_env_argument() -> None:
    with pytest.raises(ConfigError, match=r"pass \[lambda: e\]"):
        GymEnv(CounterEnv())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="env factory 1 returned int"):
        GymEnv([CounterEnv, lambda: 3])


def test_gymnasium_id_and_make_kwargs() -> None:
    env = GymEnv("rlstruct/Counter-v0", n_envs=2, make_kwargs={"episode_length": 2})
    obs, _ = env.reset()
    assert obs["frame"].tolist() == [[0, 0, 0], [0, 0, 0]]
    env.step(act(0, 1))
    (obs_t1, _), (_, running) = env.step(act(0, 1))
    assert obs_t1["done"].all() and running.numel() == 0
    env.close()
    with GymEnvInf("CartPole-v1", n_envs=3, seed=1) as cart:
        obs, _ = cart.reset()
        assert obs["frame"].shape == (3, 4) and obs["frame"].dtype == torch.float32
        ended = torch.zeros(3, dtype=torch.bool)
        for _ in range(30):
            (obs_t1, _), (obs, running) = cart.step(act(1, 1, 1))
            ended |= obs_t1["terminated"]
            assert running.tolist() == [0, 1, 2]
        assert ended.all()  # always pushing right ends CartPole within ~10 steps


# ------------------------------------------------------------------ check_finite
@pytest.mark.parametrize("where", ["frame", "reward"])
def test_check_finite(where: str) -> None:
    def obs_fn(t: int) -> np.ndarray:
        return np.array([np.nan if (where == "frame" and t == 2) else 0.0], np.float32)

    def reward_fn(t: int) -> float:
        return float("inf") if (where == "reward" and t == 2) else 0.0

    kw = {"obs_fn": obs_fn, "reward_fn": reward_fn, "episode_length": 5}
    env = space_env(2, spaces.Box(-1, 1, (1,)), check_finite=True, env_id_offset=3, **kw)
    env.reset()
    env.step(act(0, 0))
    # A NaN observation is an ObservationError (check_obs, which check_finite implies).
    error = ObservationError if where == "frame" else FloatingPointError
    with pytest.raises(error, match=rf"env 3: observation key '{where}' .* env_step 2") as info:
        env.step(act(0, 0))
    assert info.value.env_index == 0
    unchecked = space_env(2, spaces.Box(-1, 1, (1,)), check_obs=False, **kw)
    unchecked.reset()
    unchecked.step(act(0, 0))
    (obs_t1, _), _ = unchecked.step(act(0, 0))
    assert not torch.isfinite(obs_t1[where]).all()


def test_an_env_module_that_raises_on_import_is_reported_not_raised(tmp_path, monkeypatch):
    # rlstruct.envs.registry.env_module_problems swallows a module's own error into a message.
    from rlstruct.envs.registry import env_module_problems

    (tmp_path / "broken_env_module_xyz.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (problem,) = env_module_problems(["broken_env_module_xyz"])
    assert "'broken_env_module_xyz' cannot be imported: RuntimeError: boom at import" in problem
    assert env_module_problems(["json"]) == []
