"""Tests of EnvPoolEnv (rlstruct/envs/envpool.py): envpool's batch behind the VecEnv contract.

envpool's CartPole draws its initial states with its own generators, so they cannot match
gymnasium's for a seed. The agreement test therefore copies envpool's observation (CartPole's
observation IS its state) into gymnasium's ``unwrapped.state`` before every step, gives both the
same action, and requires the same next observation (to float32 rounding), reward and
termination, across episode ends: a reset row is followed by the dynamics of its own action, so
no action is dropped by envpool's next-step auto-reset. The batcher tests check the counter-style
invariants of every row and that Batcher workers equal a SerialBatcher.

Everything but the ImportError test is skipped without envpool (``pip install -e
'.[envpool]'``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstruct import DictTensor
from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.envs.envpool import EnvPoolEnv
from rlstruct.errors import (
    ActionError,
    BatcherStateError,
    ConfigError,
    DeviceContractError,
    KeyMismatchError,
    ShapeError,
)

HAVE_ENVPOOL = importlib.util.find_spec("envpool") is not None
needs_envpool = pytest.mark.skipif(
    not HAVE_ENVPOOL, reason="envpool is not installed (pip install -e '.[envpool]')"
)
KEYS = {
    "frame": ((4,), torch.float32),
    "reward": ((), torch.float32),
    "terminated": ((), torch.bool),
    "truncated": ((), torch.bool),
    "done": ((), torch.bool),
    "initial_state": ((), torch.bool),
    "last_action": ((), torch.int64),
    "env_step": ((), torch.int64),
}


def act(values: torch.Tensor | list[int]) -> DictTensor:
    return DictTensor({"action": torch.as_tensor(values, dtype=torch.long)})


def balance(frame: torch.Tensor) -> torch.Tensor:
    """A CartPole controller that keeps the pole up (episodes reach the time limit)."""
    return (frame[:, 2] + 0.3 * frame[:, 3] > 0).long()


# ------------------------------------------------------------------ installation
def test_missing_envpool_raises_an_import_error_naming_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "envpool", None)  # "import envpool" now fails
    with pytest.raises(ImportError, match=r"pip install -e '\.\[envpool\]'"):
        EnvPoolEnv("CartPole-v1", 2)


# ------------------------------------------------------------------ the contract
@needs_envpool
def test_keys_dtypes_and_running_at_reset_and_step() -> None:
    env = EnvPoolEnv("CartPole-v1", 3, seed=1)
    assert {k: (tuple(s), d) for k, (s, d) in env.observation_specs().items()} == KEYS
    obs, running = env.reset()
    assert running.tolist() == [0, 1, 2] and running.dtype == torch.int64
    for o in [obs, *[x for pair in env.step(act([0, 1, 0])) for x in pair[:1]]]:
        assert {k: (tuple(v.shape[1:]), v.dtype) for k, v in o.items()} == KEYS
    assert obs["initial_state"].all() and (obs["env_step"] == 0).all()
    assert (obs["frame"].abs() <= 0.05).all()  # CartPole's initial states
    env.close()
    env.close()  # idempotent
    with pytest.raises(BatcherStateError, match="closed"):
        env.reset()


@needs_envpool
def test_seeds_env_k_gets_seed_plus_k_and_runs_are_reproducible() -> None:
    many = EnvPoolEnv("CartPole-v1", 4, seed=10)
    obs, _ = many.reset()
    for k in range(4):
        one, _ = EnvPoolEnv("CartPole-v1", 1, seed=10 + k).reset()
        assert torch.equal(one["frame"][0], obs["frame"][k])
    assert len({tuple(r) for r in obs["frame"].tolist()}) == 4

    def rollout(seed: int) -> torch.Tensor:
        env = EnvPoolEnv("CartPole-v1", 4, seed=seed, max_episode_steps=15)
        o, _ = env.reset()
        frames = []
        gen = torch.Generator().manual_seed(0)
        for _ in range(40):
            (t1, _), (o, _) = env.step(act(torch.randint(0, 2, (4,), generator=gen)))
            frames += [t1["frame"], o["frame"]]
        return torch.stack(frames)

    a, b = rollout(3), rollout(3)
    assert torch.equal(a, b)  # resets included: each env continues its own stream
    assert not torch.equal(a, rollout(4))


@needs_envpool
def test_steps_agree_with_gymnasium_from_the_same_states() -> None:
    """64 envs, 450 steps (half balance, half random; limit 150): at every step gymnasium's
    CartPole put in envpool's state, given the same action, returns the same observation,
    reward and termination; every episode end gives a reset observation, and the next step
    applies the agent's action to it."""
    n, limit = 64, 150
    env = EnvPoolEnv("CartPole-v1", n, seed=7, max_episode_steps=limit)
    refs = [gym.make("CartPole-v1").unwrapped for _ in range(n)]
    for k, r in enumerate(refs):
        r.reset(seed=k)
    obs, _ = env.reset()
    rng = np.random.default_rng(0)
    ends = terminations = truncations = 0
    for _ in range(450):
        a = torch.from_numpy(rng.integers(0, 2, n))
        a[: n // 2] = balance(obs["frame"])[: n // 2]
        (t1, _), (nxt, _) = env.step(act(a))
        for k, r in enumerate(refs):
            r.state = obs["frame"][k].double().numpy().copy()
            r.steps_beyond_terminated = None
            o, rew, term, _, _ = r.step(int(a[k]))
            assert np.allclose(o, t1["frame"][k].numpy(), atol=1e-5), k
            assert rew == t1["reward"][k].item() and term == t1["terminated"][k].item(), k
        assert torch.equal(t1["truncated"], t1["env_step"] == limit)
        assert torch.equal(t1["done"], t1["terminated"] | t1["truncated"])
        assert torch.equal(t1["last_action"], a)
        done = t1["done"]
        if done.any():
            assert (nxt["frame"][done].abs() <= 0.05).all()
            assert nxt["initial_state"][done].all() and (nxt["env_step"][done] == 0).all()
            assert (nxt["reward"][done] == 0).all() and not nxt["done"][done].any()
            assert (nxt["last_action"][done] == 0).all()
        keep = ~done
        for key in KEYS:  # rows that go on: obs_next is obs_t1
            assert torch.equal(nxt[key][keep], t1[key][keep]), key
        ends += int(done.sum())
        terminations += int(t1["terminated"].sum())
        truncations += int(t1["truncated"].sum())
        obs = nxt
    assert terminations > 50 and truncations > 10 and ends < terminations + truncations + 1


@needs_envpool
def test_a_termination_at_the_time_limit_is_both_terminated_and_truncated() -> None:
    """envpool would report it as truncated only; EnvPoolEnv applies the limit as gymnasium."""
    env = EnvPoolEnv("CartPole-v1", 1, seed=0, max_episode_steps=10)
    free = EnvPoolEnv("CartPole-v1", 1, seed=0)
    env.reset()
    free.reset()
    for _ in range(10):
        (t1, _), _ = env.step(act([1]))
        (f1, _), _ = free.step(act([1]))
        assert torch.equal(t1["frame"], f1["frame"])
    # seed 0 with action 1 falls at step 10 exactly
    assert f1["terminated"].item() and not f1["truncated"].item()
    assert t1["terminated"].item() and t1["truncated"].item() and t1["env_step"].item() == 10
    assert env.max_episode_steps == 10 and free.max_episode_steps == 500


@needs_envpool
def test_episodic_flavour_steps_only_running_envs() -> None:
    env = EnvPoolEnv("CartPole-v1", 3, seed=0, auto_reset=False, max_episode_steps=6)
    _, running = env.reset()
    steps = 0
    while running.numel():
        before = running.tolist()
        (t1, was), (nxt, running) = env.step(act(torch.ones(len(before), dtype=torch.long)))
        steps += 1
        assert was.tolist() == before
        assert t1["env_step"].tolist() == [steps] * len(before)  # never stepped after the end
        assert running.tolist() == [k for k, d in zip(before, t1["done"].tolist()) if not d]
        assert torch.equal(nxt["frame"], t1["frame"][~t1["done"]])
    assert steps == 6  # the longest episode reached the limit
    with pytest.raises(BatcherStateError, match="no running env"):
        env.step(act(torch.zeros(0, dtype=torch.long)))
    obs, running = env.reset()
    assert running.tolist() == [0, 1, 2] and obs["initial_state"].all()
    (t1, _), _ = env.step(act([0, 0, 0]))
    assert t1["env_step"].tolist() == [1, 1, 1]


@needs_envpool
def test_errors_leave_the_env_usable_and_returned_tensors_never_change() -> None:
    env = EnvPoolEnv("CartPole-v1", 2, seed=0)
    with pytest.raises(BatcherStateError, match="before reset"):
        env.step(act([0, 0]))
    env.reset()
    (t1, _), _ = env.step(act([0, 1]))
    kept = {k: v.clone() for k, v in t1.items()}
    with pytest.raises(ActionError, match="env 1"):
        env.step(act([0, 2]))
    with pytest.raises(ShapeError, match="rows"):
        env.step(act([0]))
    with pytest.raises(DeviceContractError):
        env.step(DictTensor({"action": torch.zeros(2, dtype=torch.long, device="meta")}))
    with pytest.raises(KeyMismatchError, match="no reset options"):
        env.reset(DictTensor({"x": torch.zeros(2)}))
    (t2, _), _ = env.step(act([1, 1]))
    assert t2["env_step"].tolist() == [2, 2]  # the refused calls stepped no env
    for _ in range(30):
        env.step(act([1, 0]))
    for k, v in kept.items():
        assert torch.equal(t1[k], v), k  # nothing returned aliases envpool's later output


@needs_envpool
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"env": "CartPol-v1"}, "not an envpool task id.*CartPole-v1"),
        ({"env": "ALE/Pong-v5"}, "no 'ALE/' prefix"),
        ({"n_envs": 0}, "n_envs"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**31 - 2, "n_envs": 4}, "int32"),
        ({"batch_size": 2}, "synchronous"),
        ({"num_envs": 4}, "n_envs="),
        ({"env_type": "dm"}, "sets it itself"),
        ({"max_episode_steps": 0}, "max_episode_steps"),
        ({"no_such_option": 1}, "refused"),
    ],
)
def test_config_errors(kwargs: dict, match: str) -> None:
    args = {"env": "CartPole-v1", "n_envs": 2, **kwargs}
    with pytest.raises(ConfigError, match=match):
        EnvPoolEnv(**args)


@needs_envpool
def test_atari_frames_stay_uint8_and_info_keys() -> None:
    env = EnvPoolEnv("Pong-v5", 2, seed=0, num_threads=1, info_keys=("lives",))
    obs, _ = env.reset()
    assert obs["frame"].shape == (2, 4, 84, 84) and obs["frame"].dtype == torch.uint8
    assert obs["info/lives"].dtype == torch.float32
    (t1, _), _ = env.step(act([0, 1]))
    assert t1["frame"].dtype == torch.uint8 and t1["last_action"].dtype == torch.int64
    assert env.action_space == gym.spaces.Discrete(6)


@needs_envpool
def test_box_actions_and_dict_observations() -> None:
    pend = EnvPoolEnv("Pendulum-v1", 3, seed=0, max_episode_steps=4)
    pend.reset()
    for _ in range(4):
        (t1, _), (nxt, _) = pend.step(DictTensor({"action": torch.rand(3, 1) * 4 - 2}))
    assert t1["last_action"].shape == (3, 1) and t1["last_action"].dtype == torch.float32
    assert t1["truncated"].all() and (nxt["env_step"] == 0).all()
    assert (nxt["last_action"] == 0).all()  # Box(-2, 2)'s default action
    grid = EnvPoolEnv("MiniGrid-Empty-5x5-v0", 2, seed=0)
    obs, _ = grid.reset()
    specs = {k: (tuple(v.shape[1:]), v.dtype) for k, v in obs.items()}
    assert specs["image"] == ((7, 7, 3), torch.uint8) and specs["mission"] == ((96,), torch.uint8)
    assert specs["direction"] == ((), torch.int64)  # Discrete: envpool's int32 widened, exact
    assert {k: (tuple(s), d) for k, (s, d) in grid.observation_specs().items()} == specs
    (t1, _), _ = grid.step(act([2, 2]))  # 2: forward
    assert t1["direction"].dtype == torch.int64 and t1["image"].dtype == torch.uint8


@needs_envpool
@pytest.mark.parametrize("episodic_life", [True, False])
def test_atari_episode_ends_follow_envpools_rules(episodic_life: bool) -> None:
    """With episodic_life an episode ends at each life lost and the game goes on (envpool's own
    reset rule, which its explicit reset(env_id) would break); without it, at game over."""
    env = EnvPoolEnv("Breakout-v5", 1, seed=0, num_threads=1, episodic_life=episodic_life,
                     info_keys=("lives",))
    obs, _ = env.reset()
    assert obs["info/lives"].item() == 5
    gen = torch.Generator().manual_seed(0)
    ends = []
    for _ in range(3000):
        (t1, _), (obs, _) = env.step(act(torch.randint(0, 4, (1,), generator=gen)))
        if t1["done"].item():
            assert obs["initial_state"].item() and obs["env_step"].item() == 0
            assert t1["terminated"].item() and not t1["truncated"].item()
            ends.append((t1["info/lives"].item(), obs["info/lives"].item()))
            if len(ends) == 2:
                break
    if episodic_life:
        assert ends == [(4, 4), (3, 3)]  # one life less per episode, the game goes on
    else:
        assert ends == [(0, 5), (0, 5)]  # game over, then a new game


# ------------------------------------------------------------------ batchers
class RandomAgent(Agent):
    """Uniform random actions (from the batcher's own streams)."""

    def __init__(self, n_actions: int = 2) -> None:
        self.n_actions = n_actions

    def __call__(self, state, observation, agent_info):
        n = observation["frame"].shape[0]
        return DictTensor({"action": torch.randint(0, self.n_actions, (n,))}), state


class Balance(Agent):
    """Deterministic CartPole controller: the data depend on the env seeds only."""

    def __call__(self, state, observation, agent_info):
        return DictTensor({"action": balance(observation["frame"])}), state


def check_rows(steps, done_before: torch.Tensor | None = None) -> None:
    """Every row: consecutive steps of one env; after a done, env_step 0 and initial_state."""
    t_obs, t_next = steps["observation/env_step"], steps["_observation/env_step"]
    done = steps["_observation/done"]
    assert torch.equal(t_next, t_obs + 1)
    assert torch.equal(t_obs[:, 1:], torch.where(done[:, :-1], 0, t_next[:, :-1]))
    assert torch.equal(steps["observation/initial_state"][:, 1:], done[:, :-1])
    assert torch.equal(steps["observation/initial_state"], t_obs == 0)
    same = ~done[:, :-1]
    assert torch.equal(
        steps["observation/frame"][:, 1:][same], steps["_observation/frame"][:, :-1][same]
    )
    if done_before is not None:
        assert torch.equal(steps["observation/initial_state"][:, 0], done_before)


@needs_envpool
def test_serial_batcher_rows_are_consecutive_steps_of_one_env() -> None:
    env_args = {"env": "CartPole-v1", "n_envs": 16, "max_episode_steps": 20}
    with SerialBatcher(48, RandomAgent, {}, EnvPoolEnv, env_args, seeds=2) as b:
        assert type(b.env) is EnvPoolEnv  # a CPU env on the CPU: no DeviceEnv
        b.reset()
        b.execute()
        first, n_running = b.get()
        b.execute()
        second, _ = b.get()
    s1, s2 = first.trajectories, second.trajectories
    assert n_running == 16 and s1.full() and s1.n_timesteps() == 48
    check_rows(s1)
    check_rows(s2, done_before=s1["_observation/done"][:, -1])
    # the second segment continues the first: same env, next step
    t_last = s1["_observation/env_step"][:, -1]
    expected = torch.where(s1["_observation/done"][:, -1], 0, t_last)
    assert torch.equal(s2["observation/env_step"][:, 0], expected)
    assert s1["_observation/done"].sum() > 16  # many episode ends (random play, limit 20)
    assert s1["_observation/truncated"].any() and s1["_observation/terminated"].any()
    # env g of run seed 2 has the seed 2 * 2**20 + g
    obs, _ = EnvPoolEnv("CartPole-v1", 16, seed=2 * 2**20).reset()
    assert torch.equal(s1["observation/frame"][:, 0], obs["frame"])


@needs_envpool
def test_serial_batcher_episodic() -> None:
    env_args = {"env": "CartPole-v1", "n_envs": 8, "auto_reset": False}
    with SerialBatcher(600, RandomAgent, {}, EnvPoolEnv, env_args, seeds=0) as b:
        b.reset()
        b.execute()
        traj, n_running = b.get()
    assert n_running == 0
    steps = traj.trajectories
    lengths = steps.lengths
    done = steps["_observation/done"]
    assert done[torch.arange(8), lengths - 1].all() and int(done.sum()) == 8
    assert torch.equal(steps["_observation/env_step"][torch.arange(8), lengths - 1], lengths)


@needs_envpool
@pytest.mark.timeout(120)
def test_batcher_workers_equal_the_serial_batcher() -> None:
    """2 workers x 4 envs == one SerialBatcher of 8 envs (the class itself is create_env)."""
    env_args = {"env": "CartPole-v1", "max_episode_steps": 25, "num_threads": 1}
    with SerialBatcher(40, Balance, {}, EnvPoolEnv, {**env_args, "n_envs": 8}, seeds=4) as s:
        s.reset()
        s.execute()
        expected, _ = s.get()
    with Batcher(
        40, Balance, {}, EnvPoolEnv, {**env_args, "n_envs": 4}, n_processes=2, seeds=4
    ) as b:
        b.reset()
        b.execute()
        got, _ = b.get()
    assert got.trajectories.equal(expected.trajectories)
    check_rows(got.trajectories)
    assert got.trajectories["_observation/truncated"].any()


# ------------------------------------------------------------------ the benchmark
@needs_envpool
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("ale_py", "cv2")),
    reason="the Pong rows need ale-py and OpenCV (pip install -e '.[atari]')",
)
def test_envpool_atari_benchmark_quick(tmp_path) -> None:
    """benchmarks/envpool_atari.py runs and reports every row (no timing asserted)."""
    out = tmp_path / "envpool_atari.json"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "envpool_atari.py"), "--quick", "--json",
         str(out)],
        capture_output=True, text=True, timeout=170, cwd=root,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    assert set(data["cartpole"]["rows"]) == {"gym_serial", "gym_batcher", "ep_serial", "ep_batcher"}
    assert set(data["pong"]["rows"]) == {"pong_gym", "pong_envpool"}
    for row in data["pong"]["rows"].values():
        # 2 workers x 2 envs x T=16 steps, each transition two uint8 (4, 84, 84) frames and more
        assert row["batch_bytes"] > 2 * 2 * 16 * 2 * 4 * 84 * 84
        assert row["get_s"]["median"] > 0 and row["steps_per_s"]["median"] > 0
    assert {(r["num"], r["den"]) for r in data["cartpole"]["ratios"]} >= {
        ("ep_serial", "gym_serial"), ("ep_batcher", "gym_batcher")
    }
