"""Tests of the torch-native envs (rlstruct/envs/torch): gymnasium agreement, the VecEnv contract,
seeding, actions, the state, and the batchers.

The agreement tests put a float64 torch env and gymnasium's env in the same state, give both the
same actions for 1000 steps (half the envs follow a controller that reaches the env's episode
ends, half act at random), copy gymnasium's new state into the torch env wherever an episode
ends, and require observations within 1e-5 and every other key exactly equal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstruct import CheckDevice, DictTensor
from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.envs import GymEnv, GymEnvInf
from rlstruct.envs.torch import Acrobot, CartPole, MountainCar, Pendulum, TorchVecEnv
from rlstruct.envs.torch.base import mix64, splitmix64_uniform
from rlstruct.errors import (
    ActionError,
    BatcherStateError,
    ConfigError,
    DeviceContractError,
    KeyMismatchError,
    ShapeError,
)

ENVS: dict[str, type[TorchVecEnv]] = {
    "CartPole-v1": CartPole,
    "Acrobot-v1": Acrobot,
    "MountainCar-v0": MountainCar,
    "Pendulum-v1": Pendulum,
}
IDS = list(ENVS)
#: (an episode terminates, an episode is truncated) within 1000 steps of the agreement test
EXPECTED_ENDS = {
    "CartPole-v1": (True, True),
    "Acrobot-v1": (True, True),
    "MountainCar-v0": (True, True),
    "Pendulum-v1": (False, True),
}


def controller(gym_id: str, frame: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """Actions for a batch of observations: the first half of the rows follow a controller that
    reaches the env's episode ends (balance the pole, pump energy), the rest act at random."""
    n = frame.shape[0]
    half = n // 2
    if gym_id == "Pendulum-v1":
        return torch.from_numpy(rng.uniform(-2.0, 2.0, (n, 1)).astype(np.float32))
    n_actions = {"CartPole-v1": 2, "Acrobot-v1": 3, "MountainCar-v0": 3}[gym_id]
    a = torch.from_numpy(rng.integers(0, n_actions, n))
    if gym_id == "CartPole-v1":
        smart = (frame[:, 2] + 0.3 * frame[:, 3] > 0).long()
    elif gym_id == "Acrobot-v1":
        smart = torch.where(frame[:, 5] > 0, 2, 0)
    else:
        smart = torch.where(frame[:, 1] > 0, 2, 0)
    a[:half] = smart[:half]
    return a


def gym_state(env: gym.Env) -> torch.Tensor:
    return torch.as_tensor(np.asarray(env.unwrapped.state, dtype=np.float64))


def copy_states(torch_env: TorchVecEnv, ref: GymEnv | GymEnvInf, rows: list[int]) -> None:
    for k in rows:
        torch_env.state[k] = gym_state(ref.envs[k])


def act(a: torch.Tensor) -> DictTensor:
    return DictTensor({"action": a})


def assert_agree(t: DictTensor, r: DictTensor, where: str) -> None:
    assert t.specs() == r.specs(), where
    assert torch.allclose(t["frame"], r["frame"], rtol=0, atol=1e-5), where
    for key in r:
        if key != "frame":
            assert torch.equal(t[key], r[key]), f"{where}: {key}"


# ------------------------------------------------------------------ agreement with gymnasium
@pytest.mark.parametrize("gym_id", IDS)
def test_auto_reset_rollouts_match_gymnasium(gym_id: str) -> None:
    n, steps = 8, 1000
    ref = GymEnvInf(gym_id, n_envs=n, seed=0)
    env = ENVS[gym_id](n_envs=n, seed=0, dtype=torch.float64, auto_reset=True)
    assert env.observation_space == ref.observation_space
    assert env.action_space == ref.action_space
    assert env.observation_specs() == ref.observation_specs()
    assert env.max_episode_steps == gym.spec(gym_id).max_episode_steps
    r_obs, _ = ref.reset()
    t_obs, _ = env.reset()
    assert t_obs.specs() == r_obs.specs()
    copy_states(env, ref, list(range(n)))
    assert_agree(DictTensor({**dict(t_obs.items()), "frame": env.observe(env.state)}), r_obs, "0")
    rng = np.random.default_rng(1)
    n_terminated = n_truncated = 0
    for t in range(steps):
        a = controller(gym_id, r_obs["frame"], rng)
        (r1, _), (r_obs, r_run) = ref.step(act(a))
        (t1, was), (t_next, t_run) = env.step(act(a))
        assert_agree(t1, r1, f"obs_t1, step {t}")
        assert t_run.tolist() == was.tolist() == r_run.tolist() == list(range(n))
        ended = r1["done"].nonzero().squeeze(1).tolist()
        copy_states(env, ref, ended)  # the torch env drew its own initial states
        t_next = DictTensor({**dict(t_next.items()), "frame": env.observe(env.state)})
        assert_agree(t_next, r_obs, f"obs_next, step {t}")
        n_terminated += int(r1["terminated"].sum())
        n_truncated += int(r1["truncated"].sum())
    assert (n_terminated > 0, n_truncated > 0) == EXPECTED_ENDS[gym_id]


@pytest.mark.parametrize("gym_id", IDS)
def test_episodic_rollouts_match_gymnasium(gym_id: str) -> None:
    n, limit = 6, 40
    ref = GymEnv(gym_id, n_envs=n, seed=0, make_kwargs={"max_episode_steps": limit})
    env = ENVS[gym_id](n, 0, "cpu", torch.float64, limit)
    rng = np.random.default_rng(2)
    for episode in range(3):
        r_obs, r_run = ref.reset()
        env.reset()
        copy_states(env, ref, list(range(n)))
        t = 0
        while r_run.numel():
            a = controller(gym_id, r_obs["frame"], rng)
            (r1, r_was), (r_obs, r_run) = ref.step(act(a))
            (t1, t_was), (t_next, t_run) = env.step(act(a))
            where = f"episode {episode}, step {t}"
            assert_agree(t1, r1, where)
            assert_agree(t_next, r_obs, where)
            assert t_was.tolist() == r_was.tolist() and t_run.tolist() == r_run.tolist(), where
            assert t_run.dtype == torch.long
            t += 1
        assert t == limit or gym_id == "CartPole-v1"  # the controlled envs last to the limit
    with pytest.raises(BatcherStateError, match="no running env"):
        env.step(act(a))


# ------------------------------------------------------------------ the VecEnv contract
@pytest.mark.parametrize("gym_id", IDS)
def test_true_final_observation_and_reset_observation(gym_id: str) -> None:
    env = ENVS[gym_id](n_envs=64, seed=1, max_episode_steps=7, auto_reset=True)
    obs, _ = env.reset()
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(30):
        before = env.state.clone()
        a = controller(gym_id, obs["frame"], rng)
        (t1, _), (obs, _) = env.step(act(a))
        expected, _, _ = env.dynamics(before, a)
        done = t1["done"]
        # obs_t1 is the TRUE final observation; obs_next the reset one, where an episode ended
        assert torch.equal(t1["frame"], env.observe(expected))
        assert torch.equal(obs["frame"], env.observe(env.state))
        assert torch.equal(obs["initial_state"], done)
        assert (obs["env_step"][done] == 0).all() and (obs["reward"][done] == 0).all()
        assert not (obs["done"].any() or obs["terminated"].any() or obs["truncated"].any())
        assert (obs["last_action"][done] == 0).all()
        assert torch.equal(obs["last_action"][~done], t1["last_action"][~done])
        assert torch.equal(obs["env_step"][~done], t1["env_step"][~done])
        assert torch.equal(t1["truncated"], t1["env_step"] >= 7)
        assert torch.equal(t1["done"], t1["terminated"] | t1["truncated"])
        ends += int(done.sum())
    assert ends > 0


def test_terminated_and_truncated_stay_apart() -> None:
    env = CartPole(n_envs=3, seed=0, max_episode_steps=1, dtype=torch.float64)
    env.reset()
    env.state = torch.tensor(
        [[2.39, 10.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.2, 5.0]], dtype=torch.float64
    )
    (t1, _), (_, running) = env.step(act(torch.ones(3, dtype=torch.long)))
    assert t1["terminated"].tolist() == [True, False, True]
    assert t1["truncated"].tolist() == [True, True, True]
    assert running.numel() == 0


def test_keys_dtypes_devices_and_no_aliasing() -> None:
    env = CartPole(n_envs=4, seed=0, auto_reset=True)  # float32 state: observe must copy
    obs, running = env.reset()
    assert obs.specs() == env.observation_specs() == GymEnv("CartPole-v1").observation_specs()
    assert running.dtype == torch.long and running.device == env.device
    a = torch.ones(4, dtype=torch.long)
    (t1, was), (nxt, still) = env.step(act(a))
    for out in (obs, t1, nxt):
        assert out.specs() == env.observation_specs()
        assert all(v.device == env.device for v in out.values())
    assert t1["last_action"].data_ptr() != a.data_ptr()
    assert nxt["frame"] is t1["frame"]  # no env ended: obs_next shares obs_t1's tensors
    frame = t1["frame"].clone()
    t1["frame"].add_(100.0)
    assert (env.state.abs() < 10).all()  # returned frames are not the env's state
    env.step(act(a))
    assert torch.equal(t1["frame"], frame + 100.0)  # ...nor overwritten by the next step
    was.fill_(7)
    still.fill_(7)
    (_, was), _ = env.step(act(a))
    assert was.tolist() == [0, 1, 2, 3]


def test_state_is_assignable_and_checked() -> None:
    env = MountainCar(n_envs=2, seed=0, dtype=torch.float64)
    env.reset()
    env.state = torch.tensor([[0.49, 0.05], [-0.5, 0.0]], dtype=torch.float64)
    (t1, _), (_, running) = env.step(act(torch.tensor([2, 1])))
    assert t1["terminated"].tolist() == [True, False] and running.tolist() == [1]
    env.state[1, 0] = -1.2  # in-place writes count too
    env.state[1, 1] = -0.01
    (t1, _), _ = env.step(act(torch.tensor([0])))
    assert t1["frame"].tolist() == [[pytest.approx(-1.2), 0.0]]  # stopped at the wall
    with pytest.raises(ShapeError, match=r"\(2, 2\)"):
        env.state = torch.zeros(3, 2, dtype=torch.float64)
    with pytest.raises(TypeError, match="float64"):
        env.state = torch.zeros(2, 2)
    with pytest.raises(DeviceContractError):
        env.state = torch.zeros(2, 2, dtype=torch.float64, device="meta")


# ------------------------------------------------------------------ seeding
def reference_uniforms(seed: int, k: int, first: int, n: int, bits: int) -> list[float]:
    """The documented rule, in plain Python: SplitMix64 seeded with mix64(seed + k)."""
    mask = (1 << 64) - 1

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    state = mix((seed + k) & mask)
    return [
        (mix((state + i * 0x9E3779B97F4A7C15) & mask) >> (64 - bits)) / 2**bits
        for i in range(first + 1, first + n + 1)
    ]


def test_streams_follow_the_documented_rule() -> None:
    golden = 0x9E3779B97F4A7C15 - 2**64
    firsts = torch.tensor([0, 3, 8, 100, 2**40])
    u = splitmix64_uniform(mix64(torch.arange(5, 10)) + firsts * golden, 3, torch.float64)
    for r, (k, first) in enumerate(zip(range(5), firsts.tolist())):
        assert u[r].tolist() == reference_uniforms(5, k, first, 3, 53)
    # CartPole(seed=s): reset c of env k uses outputs c*4+1 .. c*4+4 of env k's stream
    env = CartPole(n_envs=3, seed=11, dtype=torch.float64)
    for c in range(2):
        env.reset()
        for k in range(3):
            u = torch.tensor(reference_uniforms(11, k, 4 * c, 4, 53), dtype=torch.float64)
            assert torch.equal(env.state[k], -0.05 + 0.1 * u)
    env32 = CartPole(n_envs=3, seed=11)
    env32.reset()
    u = torch.tensor(reference_uniforms(11, 2, 0, 4, 24), dtype=torch.float32)
    assert torch.equal(env32.state[2], -0.05 + (0.05 - -0.05) * u)


def rollout_frames(env: TorchVecEnv, rows: slice, steps: int = 200) -> torch.Tensor:
    """Frames (obs_t1 and obs_next) of ``rows`` under actions that depend on the frames only."""
    obs, _ = env.reset()
    out = []
    for _ in range(steps):
        a = (obs["frame"][:, 2] > 0).long()
        (t1, _), (obs, _) = env.step(act(a))
        out += [t1["frame"][rows], obs["frame"][rows]]
    return torch.stack(out)


def test_each_env_depends_on_its_seed_only() -> None:
    many = rollout_frames(CartPole(n_envs=8, seed=3, auto_reset=True), slice(5, 6))
    one = rollout_frames(CartPole(n_envs=1, seed=8, auto_reset=True), slice(0, 1))
    assert torch.equal(many, one)  # env 5 of seed 3 == env 0 of seed 8, resets included
    again = rollout_frames(CartPole(n_envs=8, seed=3, auto_reset=True), slice(0, 8))
    assert torch.equal(again, rollout_frames(CartPole(n_envs=8, seed=3, auto_reset=True),
                                             slice(0, 8)))
    other = rollout_frames(CartPole(n_envs=8, seed=4, auto_reset=True), slice(0, 8))
    assert not torch.equal(again[:1], other[:1])
    assert not torch.equal(again[:1, 0], again[:1, 1])  # envs of one VecEnv differ


@pytest.mark.parametrize("gym_id", IDS)
def test_masked_reset_path_equals_indexed_path(gym_id: str) -> None:
    """The host-sync-free auto-reset (used off the CPU) gives the CPU path's numbers."""
    outs = []
    for sync_free in (False, True):
        env = ENVS[gym_id](n_envs=32, seed=5, max_episode_steps=9, auto_reset=True)
        env._sync_free = sync_free
        obs, _ = env.reset()
        rng = np.random.default_rng(0)
        steps = []
        for _ in range(40):
            (t1, _), (obs, _) = env.step(act(controller(gym_id, obs["frame"], rng)))
            steps.append(torch.cat([v.reshape(32, -1).double() for v in (*t1.values(),
                                                                          *obs.values())], 1))
        outs.append(torch.stack(steps))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("gym_id", IDS)
def test_initial_state_ranges(gym_id: str) -> None:
    env = ENVS[gym_id](n_envs=20_000, seed=0, dtype=torch.float64)
    env.reset()
    s = env.state
    f64 = torch.float64
    if gym_id == "MountainCar-v0":
        lo, hi = torch.tensor([-0.6, 0.0], dtype=f64), torch.tensor([-0.4, 0.0], dtype=f64)
    elif gym_id == "Pendulum-v1":
        lo, hi = torch.tensor([-np.pi, -1.0], dtype=f64), torch.tensor([np.pi, 1.0], dtype=f64)
    else:
        r = 0.05 if gym_id == "CartPole-v1" else 0.1
        lo, hi = torch.full((4,), -r, dtype=f64), torch.full((4,), r, dtype=f64)
    slack = 1e-7 if gym_id == "Acrobot-v1" else 0.0  # rounded to float32 (as gymnasium does)
    assert (s >= lo - slack).all() and (s <= hi + slack).all()
    span = hi - lo
    assert torch.allclose(s.min(0).values, lo, atol=1e-3) and torch.allclose(
        s.max(0).values, hi, atol=1e-3
    )
    assert torch.allclose(s.mean(0), (lo + hi) / 2, atol=0.02 * float(span.max()))
    if gym_id == "Acrobot-v1":  # gymnasium rounds its initial state to float32
        assert torch.equal(s, s.float().double())


def test_reset_options_through_env_info() -> None:
    env = CartPole(n_envs=3, seed=0, max_episode_steps=1, auto_reset=True, dtype=torch.float64)
    low, high = torch.tensor([0.1, -0.05, 1.0]), torch.tensor([0.2, 0.05, 1.0])
    env.reset(DictTensor({"low": low, "high": high}))
    a = act(torch.zeros(3, dtype=torch.long))
    for _ in range(3):
        assert (env.state[0] >= 0.1).all() and (env.state[0] <= 0.2).all()
        assert (env.state[2] == 1.0).all()
        env.step(a)  # the time limit resets every env: the options hold for auto-resets
    env.reset()
    assert (env.state.abs() <= 0.05).all()  # reset(None) goes back to the defaults
    with pytest.raises(KeyMismatchError, match="reset options are"):
        env.reset(DictTensor({"x_init": torch.zeros(3)}))
    with pytest.raises(ConfigError, match="env 1"):
        env.reset(DictTensor({"low": torch.tensor([0.0, 0.5, 0.0])}))
    with pytest.raises(ShapeError, match="2 rows, expected 3"):
        env.reset(DictTensor({"low": torch.zeros(2)}))
    p = Pendulum(n_envs=2, seed=0)
    p.reset(DictTensor({"x_init": torch.tensor([0.0, 0.5]), "y_init": torch.tensor([0.0, 0.0])}))
    assert p.state[0].tolist() == [0.0, 0.0] and p.state[1, 0].abs() <= 0.5


# ------------------------------------------------------------------ actions and errors
@pytest.mark.parametrize(
    "make, action, error, match, index",
    [
        (CartPole, torch.zeros(3, dtype=torch.long), ShapeError, "expected 4", None),
        (CartPole, torch.zeros(4, 1, dtype=torch.long), ActionError, "shape", None),
        (CartPole, torch.zeros(4), ActionError, "integer", None),
        (CartPole, torch.tensor([0, 1, 2, 0]), ActionError, "env 12: action 2", 2),
        (Acrobot, torch.tensor([0, 1, -1, 3]), ActionError, "env 12: action -1", 2),
        (Pendulum, torch.zeros(4), ActionError, "shape", None),
        (Pendulum, torch.tensor([[0.0], [0.0], [0.0], [2.5]]), ActionError, "env 13", 3),
        (Pendulum, torch.tensor([[0.0], [float("nan")], [0.0], [0.0]]), ActionError, "env 11", 1),
        (Pendulum, torch.zeros(4, 1, dtype=torch.complex64), ActionError, "real", None),
        (CartPole, torch.zeros(4, dtype=torch.long, device="meta"), DeviceContractError, "meta",
         None),
    ],
)
def test_bad_actions_raise_before_any_env_steps(
    make: type[TorchVecEnv], action: torch.Tensor, error: type[Exception], match: str,
    index: int | None,
) -> None:
    env = make(n_envs=4, seed=0, env_id_offset=10, auto_reset=True)
    env.reset()
    state = env.state.clone()
    with pytest.raises(error, match=match) as info:
        env.step(act(action))
    if index is not None:
        assert info.value.env_index == index  # the LOCAL index; the message names the global
    assert torch.equal(env.state, state)
    good = torch.zeros(4, 1) if make is Pendulum else torch.zeros(4, dtype=torch.long)
    env.step(act(good))  # still usable


def test_integer_and_float64_actions_are_converted_after_checks() -> None:
    env = CartPole(n_envs=2, seed=0, auto_reset=True)
    env.reset()
    (t1, _), _ = env.step(act(torch.tensor([1, 0], dtype=torch.uint8)))
    assert t1["last_action"].dtype == torch.long and t1["last_action"].tolist() == [1, 0]
    p = Pendulum(n_envs=2, seed=0)
    p.reset()
    (t1, _), _ = p.step(act(torch.tensor([[1.5], [-2.0]], dtype=torch.float64)))
    assert t1["last_action"].dtype == torch.float32
    with pytest.raises(ActionError, match="env 0"):
        p.step(act(torch.tensor([[1e39], [0.0]], dtype=torch.float64)))  # inf as float32
    lax = Pendulum(n_envs=1, seed=0, check_actions=False, dtype=torch.float64)
    ref = Pendulum(n_envs=1, seed=0, dtype=torch.float64)
    lax.reset()
    ref.reset()
    (a, _), _ = lax.step(act(torch.tensor([[5.0]])))  # clipped by the dynamics
    (b, _), _ = ref.step(act(torch.tensor([[2.0]])))
    assert torch.equal(a["frame"], b["frame"]) and torch.equal(lax.state, ref.state)


def test_call_order_and_config_errors() -> None:
    env = CartPole(n_envs=2)
    with pytest.raises(BatcherStateError, match="before reset"):
        env.step(act(torch.zeros(2, dtype=torch.long)))
    env.close()
    with pytest.raises(BatcherStateError, match="closed"):
        env.reset()
    for kwargs, match in [
        ({"n_envs": 0}, "n_envs"),
        ({"seed": -1}, "seed"),
        ({"max_episode_steps": 0}, "max_episode_steps"),
        ({"dtype": torch.int64}, "dtype"),
        ({"device": "meta"}, "meta"),
        ({"device": "nonsense"}, "device"),
        *([] if torch.cuda.is_available() else [({"device": "cuda"}, "device")]),
    ]:
        with pytest.raises(ConfigError, match=match):
            CartPole(**kwargs)


# ------------------------------------------------------------------ batchers
class Balance(Agent):
    """Deterministic CartPole controller (push towards the pole's lean); counts its calls."""

    def __call__(self, state, observation, agent_info):
        frame = observation["frame"]
        action = (frame[:, 2] + 0.3 * frame[:, 3] > 0).long()
        return DictTensor({"action": action}), state


def checked_balance(device: str = "cpu") -> Agent:
    return CheckDevice(Balance(), device)


def test_serial_batcher_on_the_cpu_auto_reset() -> None:
    kwargs: dict[str, Any] = {"n_envs": 16, "auto_reset": True, "max_episode_steps": 20}
    with SerialBatcher(32, checked_balance, {}, CartPole, kwargs, seeds=2) as b:
        assert b.env.__class__ is CartPole  # no DeviceEnv around a CPU env on the CPU
        b.reset()
        b.execute()
        traj, n_running = b.get()
    steps = traj.trajectories
    assert n_running == 16 and steps.full() and steps.n_timesteps() == 32
    done = steps["_observation/done"]
    assert torch.equal(done, steps["_observation/env_step"] == 20)  # the controller balances
    initial = steps["observation/initial_state"]
    assert torch.equal(initial[:, 1:], done[:, :-1]) and initial[:, 0].all()
    # the TRUE final observation at a done step, the reset one in the next step's observation
    last, first = steps["_observation/frame"][:, 19], steps["observation/frame"][:, 20]
    assert (first.abs() <= 0.05).all() and not torch.equal(last, first)
    # the env seeds follow the batcher's rule: env g of run seed 2 gets 2 * 2**20 + g
    env = CartPole(n_envs=16, seed=2 * 2**20)
    obs, _ = env.reset()
    assert torch.equal(steps["observation/frame"][:, 0], obs["frame"])


def test_serial_batcher_on_the_cpu_episodic() -> None:
    with SerialBatcher(600, checked_balance, {}, CartPole, {"n_envs": 8}, seeds=0) as b:
        b.reset()
        b.execute()
        traj, n_running = b.get()
    assert n_running == 0
    lengths = traj.trajectories.lengths
    done = traj.trajectories["_observation/done"]
    assert done[torch.arange(8), lengths - 1].all() and int(done.sum()) == 8


@pytest.mark.timeout(120)
def test_batcher_workers_equal_the_serial_batcher() -> None:
    """2 worker processes x 8 envs == one SerialBatcher of 16 envs: each env's episodes depend
    on its global seed only (and the agent is deterministic)."""
    env_args = {"auto_reset": True, "max_episode_steps": 25}
    with SerialBatcher(40, checked_balance, {}, CartPole, {**env_args, "n_envs": 16},
                       seeds=4) as serial:
        serial.reset()
        serial.execute()
        expected, _ = serial.get()
    with Batcher(40, checked_balance, {}, CartPole, {**env_args, "n_envs": 8}, n_processes=2,
                 seeds=4) as batcher:
        batcher.reset()
        batcher.execute()
        got, _ = batcher.get()
    assert got.trajectories.equal(expected.trajectories)
    assert got.info.equal(expected.info)


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_gpu_env_matches_the_cpu_env_and_never_syncs() -> None:
    kwargs: dict[str, Any] = {"auto_reset": True, "max_episode_steps": 30, "dtype": torch.float64}
    gpu = CartPole(n_envs=256, seed=1, check_actions=False, check_obs=False, device="cuda",
                   **kwargs)
    cpu = CartPole(n_envs=256, seed=1, **kwargs)
    g_obs, g_run = gpu.reset()
    c_obs, _ = cpu.reset()
    assert g_obs.device().type == "cuda" and g_run.device.type == "cuda"
    assert torch.equal(g_obs["frame"].cpu(), c_obs["frame"])  # same streams on every device
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(60):
            a = torch.ones(256, dtype=torch.long, device="cuda")
            (g_t1, _), (g_obs, _) = gpu.step(act(a))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for _ in range(60):
        (c_t1, _), (c_obs, _) = cpu.step(act(torch.ones(256, dtype=torch.long)))
    assert torch.equal(g_t1["done"].cpu(), c_t1["done"])
    assert torch.allclose(g_obs["frame"].cpu(), c_obs["frame"], atol=1e-5)


@pytest.mark.gpu
def test_serial_batcher_on_the_gpu_without_cpu_round_trip() -> None:
    env_args = {"n_envs": 64, "auto_reset": True, "device": "cuda"}
    with SerialBatcher(16, checked_balance, {"device": "cuda"}, CartPole, env_args, seeds=0,
                       device="cuda") as b:
        assert isinstance(b.env, CartPole)  # not wrapped in a DeviceEnv
        b.reset()
        b.execute()
        traj, _ = b.get()
    assert traj.device().type == "cuda" and traj.trajectories.full()


# ------------------------------------------------------------------ the benchmark
@pytest.mark.timeout(120)
def test_torch_envs_benchmark_quick(tmp_path) -> None:
    """benchmarks/torch_envs.py runs and reports every row and ratio (no timing asserted)."""
    out = tmp_path / "torch_envs.json"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "torch_envs.py"), "--quick", "--reps", "1",
         "--min-time", "0", "--profile", "--json", str(out)],
        capture_output=True, text=True, timeout=110, cwd=root,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    assert set(data["rows"]) == {"gym_sync", "hand", "rl_serial", "rl_env"}
    assert data["rows"]["rl_serial"]["info"]["env_wrapped"] == "CartPole"
    assert [(r["num"], r["den"], r["target"]) for r in data["ratios"]] == [
        ("rl_serial", "gym_sync", 10.0), ("rl_serial", "hand", 0.8)
    ]
    parts = data["profile"]["per_step_us"]
    assert all(parts[k] > 0 for k in ("agent_call", "env_step", "buffer_write_steps", "total"))
