"""Tests of VectorEnvAdapter (rlstruct/envs/vector.py): a user's gymnasium VectorEnv as a VecEnv.

The reference is rlstruct's own vectorisation: ``GymEnvInf`` over the same env id, seed and
time limit. A gymnasium ``SyncVectorEnv`` of the same envs, in each of gymnasium's three
auto-reset modes, behind the adapter, must give the same observations, rewards, terminated and
truncated flags and final observations, bit for bit, over many episode ends (CartPole with a
12-step limit ends by both termination and truncation under random actions), directly and through
a SerialBatcher and a one-worker Batcher. A vector env whose mode cannot be told apart is refused
when the adapter is built, before any reset or step.
"""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from support.toy_envs import DictObs, TupleObs
from support.vector_envs import LIMIT, cartpole_vector_env

from rlstruct import DictTensor
from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.envs import GymEnvInf, VectorEnvAdapter
from rlstruct.errors import (
    AutoresetModeError,
    BatcherStateError,
    ConfigError,
    KeyMismatchError,
)

REPO = Path(__file__).resolve().parents[2]
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


cartpole = cartpole_vector_env  # the user's factory: make(mode, num_envs) -> SyncVectorEnv


def reference(n_envs: int, seed: int) -> GymEnvInf:
    return GymEnvInf("CartPole-v1", n_envs=n_envs, seed=seed,
                     make_kwargs={"max_episode_steps": LIMIT})


def act(a: np.ndarray) -> DictTensor:
    return DictTensor({"action": torch.from_numpy(a)})


def assert_same(got: DictTensor, expected: DictTensor, where: str) -> None:
    assert sorted(got.keys()) == sorted(expected.keys()), where
    for key in sorted(expected.keys()):
        x, y = got[key], expected[key]
        assert x.dtype == y.dtype and torch.equal(x, y), f"{where}: {key} {x} != {y}"


def lockstep(env: VectorEnvAdapter, ref: GymEnvInf, n: int, steps: int,
             seed: int) -> list[DictTensor]:
    """Steps ``env`` and ``ref`` with the same random actions for ``steps`` steps, asserting
    equal ``obs_t1`` and ``obs_next`` (and all ``n`` envs running) at each; returns the
    ``obs_t1`` of every step."""
    rng, answers = np.random.default_rng(seed), []
    for t in range(steps):
        a = act(rng.integers(0, 2, n))
        (t1, was), (nxt, still) = env.step(a)
        (ref_t1, _), (ref_nxt, _) = ref.step(a)
        assert_same(t1, ref_t1, f"obs_t1 of step {t}")
        assert_same(nxt, ref_nxt, f"obs_next of step {t}")
        assert was.tolist() == still.tolist() == list(range(n))
        answers.append(t1)
    return answers


class RandomAgent(Agent):
    def __call__(self, state: DictTensor, observation: DictTensor, agent_info: DictTensor):
        n = observation["frame"].shape[0]
        return DictTensor({"action": torch.randint(2, (n,))}), state


# ------------------------------------------------------------------ the VecEnv itself
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_steps_equal_gym_env_inf_bit_for_bit(mode: AutoresetMode) -> None:
    n, seed = 5, 7
    env = VectorEnvAdapter(functools.partial(cartpole, mode), n_envs=n, seed=seed)
    ref = reference(n, seed)
    assert env.autoreset_mode == mode and env.n_envs() == n
    assert env.observation_specs() == ref.observation_specs()
    obs, running = env.reset()
    expected, ref_running = ref.reset()
    assert_same(obs, expected, "reset")
    assert torch.equal(running, ref_running)
    answers = lockstep(env, ref, n, 100, seed=0)
    terminated = sum(int(t1["terminated"].sum()) for t1 in answers)
    truncated = sum(int(t1["truncated"].sum()) for t1 in answers)
    assert terminated >= 5 and truncated >= 5  # both ways to end, many times
    # a later reset continues each env's own random stream, as GymEnvInf's does
    assert_same(env.reset()[0], ref.reset()[0], "second reset")
    env.close()
    env.close()  # idempotent


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_no_phantom_step_and_true_final_observations(mode: AutoresetMode) -> None:
    """Each agent step is one env step: ``env_step`` counts 1, 2, ... up to the end, and the
    final observation of an episode is the one its last action led to (not the reset one)."""
    n = 3
    env = VectorEnvAdapter(functools.partial(cartpole, mode), n_envs=n, seed=1)
    probe = [gym.make("CartPole-v1", max_episode_steps=LIMIT) for _ in range(n)]
    obs, _ = env.reset()
    for k, e in enumerate(probe):
        assert np.array_equal(e.reset(seed=1 + k)[0], obs["frame"][k].numpy())
    for _ in range(3 * LIMIT):
        a = np.ones(n, np.int64)  # always push right: terminations come fast
        (t1, _), (nxt, _) = env.step(act(a))
        for k, e in enumerate(probe):
            o, _, term, trunc, _ = e.step(1)
            assert np.array_equal(t1["frame"][k].numpy(), o)
            assert (t1["terminated"][k].item(), t1["truncated"][k].item()) == (term, trunc)
            if term or trunc:
                assert np.array_equal(nxt["frame"][k].numpy(), e.reset()[0])
                assert nxt["initial_state"][k] and nxt["env_step"][k] == 0
        assert torch.equal(t1["env_step"], obs["env_step"] + 1)
        obs = nxt


def limited(cls: type) -> gym.Env:
    return gym.wrappers.TimeLimit(cls(), LIMIT)


@pytest.mark.parametrize("cls", [DictObs, TupleObs])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP],
                         ids=lambda m: m.name)
def test_dict_and_tuple_observations_equal_gym_env_inf(cls: type, mode: AutoresetMode) -> None:
    """A Dict or Tuple observation: batched as gymnasium batches them (a dict or tuple of
    arrays); SAME_STEP's final observations are one dict or tuple per ended env."""
    n, seed = 3, 5
    factories = [functools.partial(limited, cls)] * n
    env = VectorEnvAdapter(
        lambda num_envs: gym.vector.SyncVectorEnv(factories, autoreset_mode=mode), n_envs=n,
        seed=seed,
    )
    ref = GymEnvInf(factories, seed=seed)
    assert_same(env.reset()[0], ref.reset()[0], "reset")
    answers = lockstep(env, ref, n, 40, seed=1)
    assert sum(int(t1["done"].sum()) for t1 in answers) >= 4
    assert "frame" not in answers[-1]  # one key per leaf


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("vector_env_example",
                                                  REPO / "examples" / "vector_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_batched_simulator_with_batched_final_observations() -> None:
    """examples/vector_env.py's Particles: a VectorEnv of its own (no sub-envs), SAME_STEP with
    ``info["final_obs"]`` as one batched array: each terminated row's final observation is
    outside [-1, 1] (not the reset one), each next row starts anew."""
    example = _example()
    env = VectorEnvAdapter(example.Particles, n_envs=16, seed=0)
    obs, _ = env.reset()
    terminated = 0
    for _ in range(60):
        (t1, _), (nxt, _) = env.step(act(np.full(16, 2, np.int64)))  # push right: leave fast
        term = t1["terminated"]
        assert torch.all(t1["frame"][term][:, 0] > 1)
        assert torch.all(nxt["frame"][term][:, 0].abs() <= 0.1)
        assert torch.equal(nxt["initial_state"], t1["done"])
        assert torch.equal(t1["env_step"], obs["env_step"] + 1)
        terminated += int(term.sum())
        obs = nxt
    assert terminated >= 16


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_example_runs() -> None:
    done = subprocess.run([sys.executable, str(REPO / "examples" / "vector_env.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    assert "same batch: True" in done.stdout and "autoreset_mode=SAME_STEP" in done.stdout


def async_cartpole(mode: str, shared_memory: bool, num_envs: int) -> gym.vector.AsyncVectorEnv:
    make = functools.partial(gym.make, "CartPole-v1", max_episode_steps=LIMIT)
    return gym.vector.AsyncVectorEnv([make] * num_envs, autoreset_mode=mode,
                                     shared_memory=shared_memory)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_an_async_vector_env_equals_gym_env_inf(mode: str) -> None:
    """gymnasium's AsyncVectorEnv (its envs in worker processes, shared memory) behind the
    adapter; in NEXT_STEP mode without shared memory it is refused (gymnasium 1.4 keeps a
    pending auto-reset through reset_mask there: an action would be dropped)."""
    n = 2
    env = VectorEnvAdapter(functools.partial(async_cartpole, mode, True), n_envs=n, seed=4)
    ref = reference(n, 4)
    try:
        assert_same(env.reset()[0], ref.reset()[0], "reset")
        answers = lockstep(env, ref, n, 40, seed=2)
        assert sum(int(t1["done"].sum()) for t1 in answers) >= 3
    finally:
        env.close()
    if mode == "NextStep":
        with pytest.raises(ConfigError, match="shared_memory=True"):
            VectorEnvAdapter(functools.partial(async_cartpole, mode, False), n_envs=n)


def test_partial_reset_honoured_or_refused() -> None:
    """gymnasium's CartPoleVectorEnv (NEXT_STEP) resets all its envs whatever reset_mask says:
    the adapter refuses it at the first episode end instead of losing episodes silently."""
    make = functools.partial(gym.make_vec, "CartPole-v1", vectorization_mode="vector_entry_point")
    env = VectorEnvAdapter(make, n_envs=4, seed=0)
    assert env.autoreset_mode == AutoresetMode.NEXT_STEP
    env.reset()
    with pytest.raises(BatcherStateError, match="reset_mask"):
        for _ in range(200):
            env.step(act(np.ones(4, np.int64)))
    with pytest.raises(BatcherStateError, match="reset"):  # the failed step asks for a reset
        env.step(act(np.ones(4, np.int64)))


def test_a_gymnasium_id_and_make_kwargs() -> None:
    env = VectorEnvAdapter(
        "CartPole-v1", n_envs=3, seed=2,
        make_kwargs={"vectorization_mode": "sync", "vector_kwargs": {"autoreset_mode": "SameStep"}},
    )
    assert env.autoreset_mode == AutoresetMode.SAME_STEP
    assert_same(env.reset()[0], GymEnvInf("CartPole-v1", n_envs=3, seed=2).reset()[0], "reset")


# ------------------------------------------------------------------ refusals
class _Plain(gym.vector.VectorEnv):
    """A minimal vector env whose metadata the tests set; it counts its resets and steps."""

    def __init__(self, metadata: dict[str, Any], num_envs: int = 2) -> None:
        self.metadata = metadata
        self.num_envs = num_envs
        self.single_observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.calls = 0

    def reset(self, *, seed: Any = None, options: Any = None):
        self.calls += 1
        return np.zeros((self.num_envs, 3), np.float32), {}

    def step(self, actions: Any):
        self.calls += 1
        z = np.zeros(self.num_envs, bool)
        return np.zeros((self.num_envs, 3), np.float32), np.zeros(self.num_envs), z, z, {}


@pytest.mark.parametrize(
    "metadata, match",
    [
        ({}, r"no metadata\['autoreset_mode'\]"),
        ({"render_modes": []}, r"no metadata\['autoreset_mode'\]"),
        ({"autoreset_mode": "Sometimes"}, r"'Sometimes', which rlstruct does not know"),
        ({"autoreset_mode": 3}, r"= 3, which rlstruct does not know"),
    ],
)
def test_a_mode_that_cannot_be_told_apart_is_refused_at_construction(
    metadata: dict[str, Any], match: str
) -> None:
    made: list[_Plain] = []

    def make(num_envs: int) -> _Plain:
        made.append(_Plain(metadata, num_envs))
        return made[-1]

    with pytest.raises(AutoresetModeError, match=match) as info:
        VectorEnvAdapter(make, n_envs=2)
    assert isinstance(info.value, ConfigError)
    assert "NEXT_STEP" in str(info.value) and "'SameStep'" in str(info.value)  # what is expected
    assert info.value.mode == metadata.get("autoreset_mode")
    assert made[0].calls == 0  # refused before any reset or step


@pytest.mark.parametrize("mode", ["NextStep", AutoresetMode.SAME_STEP, "Disabled"])
def test_known_modes_given_as_members_or_values(mode: Any) -> None:
    env = VectorEnvAdapter(lambda num_envs: _Plain({"autoreset_mode": mode}, num_envs), n_envs=2)
    assert env.autoreset_mode == AutoresetMode(mode)


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"expected a gymnasium\.vector\.VectorEnv"):
        VectorEnvAdapter(lambda num_envs: gym.make("CartPole-v1"), n_envs=1)
    with pytest.raises(ConfigError, match=r"make_env\(num_envs=3\) returned 2 envs"):
        VectorEnvAdapter(lambda num_envs: _Plain({"autoreset_mode": "NextStep"}, 2), n_envs=3)
    with pytest.raises(ConfigError, match="n_envs must be an int >= 1"):
        VectorEnvAdapter(functools.partial(cartpole, "NextStep"), n_envs=0)
    env = VectorEnvAdapter(functools.partial(cartpole, "NextStep"), n_envs=2)
    with pytest.raises(KeyMismatchError, match="env_info=None"):
        env.reset(DictTensor({"x": torch.zeros(2)}))


# ------------------------------------------------------------------ through the batchers
def _collect(batcher_class: type, create_env: Any, env_args: dict[str, Any], **kw: Any) -> Any:
    with batcher_class(n_timesteps=30, create_agent=RandomAgent, agent_args={},
                       create_env=create_env, env_args=env_args, seeds=3, **kw) as b:
        b.reset()
        b.execute()
        first, _ = b.get()
        b.execute()
        second, _ = b.get()
    return first, second


def _reference_batches() -> Any:
    args = {"env": "CartPole-v1", "n_envs": 4, "make_kwargs": {"max_episode_steps": LIMIT}}
    return _collect(SerialBatcher, GymEnvInf, args)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_serial_batcher_trajectories_equal_the_gym_env_inf_route(mode: AutoresetMode) -> None:
    args = {"make_env": functools.partial(cartpole, mode.value), "n_envs": 4}
    got = _collect(SerialBatcher, VectorEnvAdapter, args)
    for g, e in zip(got, _reference_batches()):
        assert g.trajectories.equal(e.trajectories) and g.info.equal(e.info)
    steps = got[0].trajectories
    assert steps["_observation/terminated"].any() and steps["_observation/truncated"].any()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP],
                         ids=lambda m: m.name)
def test_batcher_worker_trajectories_equal_the_gym_env_inf_route(mode: AutoresetMode) -> None:
    """The worker process builds its own vector env from the (pickled) factory."""
    args = {"make_env": functools.partial(cartpole, mode.value), "n_envs": 4}
    got = _collect(Batcher, VectorEnvAdapter, args, n_processes=1)
    for g, e in zip(got, _reference_batches()):
        assert g.trajectories.equal(e.trajectories) and g.info.equal(e.info)


# ------------------------------------------------------ rlstruct train --env-backend vector
def _no_mode(num_envs: int) -> _Plain:
    return _Plain({}, num_envs)


@pytest.mark.filterwarnings("ignore:.*missing AutoresetMode metadata")  # gymnasium's own
def test_the_vector_backend_is_checked_before_the_run_starts(tmp_path: Path) -> None:
    from rlstruct.runs.resolve import resolve
    from rlstruct.runs.run import RunConfig

    runs = str(tmp_path / "runs")
    with pytest.raises(ConfigError, match="without a vector_entry_point"):
        resolve(RunConfig(env_id="FrozenLake-v1", env_backend="vector", runs_dir=runs))
    if "rlstruct-test/NoAutoresetMode-v0" not in gym.registry:
        gym.register("rlstruct-test/NoAutoresetMode-v0",
                     entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                     vector_entry_point=_no_mode)
    with pytest.raises(ConfigError, match=r"no metadata\['autoreset_mode'\]"):
        resolve(RunConfig(env_id="rlstruct-test/NoAutoresetMode-v0", env_backend="vector",
                          runs_dir=runs))
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_rlstruct_train_on_a_registered_vector_env(tmp_path: Path) -> None:
    """examples/vector_env.py registers Particles-v0 with a vector_entry_point: PPO trains on
    it with --env-backend vector (one Particles batch per worker) and evaluates gymnasium.make's
    single Particle."""
    import json
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO / "examples"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "rlstruct.algos.ppo", "--env-module", "vector_env", "--env-id",
         "Particles-v0", "--env-backend", "vector", "--max-frames", "3000", "--target-return",
         "None", "--eval-every", "1", "--n-processes", "2", "--n-envs", "4"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=220,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 3000
    assert json.loads((run_dir / "config.json").read_text())["config"]["env_backend"] == "vector"
