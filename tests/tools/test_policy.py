"""rlstruct/runs/policy.py: ``rlstruct.load_policy(run_dir).act(obs)`` on the checkpoint of
every algorithm (tiny runs trained in this process with a SerialBatcher; the pipelined ones,
learner groups in worker processes, slow), Atari frames, one observation and batches, greedy and
sampled actions, devices, a recurrent policy's memory, and the typed errors."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlstruct
from rlstruct import DictTensor
from rlstruct.agent import Agent
from rlstruct.errors import CheckpointError, ConfigError, NonFiniteError, ShapeError, SpaceError
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.policy import Policy, load_policy

#: name: (algorithm, env, frames, Config arguments); trained in this process, once per module.
RUNS = {
    "reinforce": ("reinforce", "CartPole-v1", 300, {}),
    "a2c": ("a2c", "CartPole-v1", 300, {}),
    "a2c-box": ("a2c", "Pendulum-v1", 300, {}),
    "a2c-recurrent": ("a2c", "CartPole-v1", 300, {"model": "mlp-gru"}),
    "ppo": ("ppo", "CartPole-v1", 300, {}),
    "ppo-box": ("ppo", "Pendulum-v1", 300, {}),
    "dqn": ("dqn", "CartPole-v1", 200, {"learning_starts": 64}),
    "trpo": ("trpo", "Pendulum-v1", 300, {}),
    "sac": ("sac", "Pendulum-v1", 200, {"learning_starts": 64}),
}


def train(name: str, folder: Path) -> Path:
    """The run folder of ``RUNS[name]``, trained in this process."""
    algo, env_id, frames, extra = RUNS[name]
    module = importlib.import_module(f"rlstruct.algos.{algo}")
    cfg = module.Config(env_id=env_id, max_frames=frames, eval_every=0, target_return=None,
                        runs_dir=str(folder / name), layout=LayoutConfig(n_processes=1, n_envs=2),
                        **extra)
    return Path(module.main(cfg)["run_dir"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs[name]``: the run folder of ``RUNS[name]``, trained at its first use."""
    folder, cache = tmp_path_factory.mktemp("policy_runs"), {}

    class Runs:
        def __getitem__(self, name: str) -> Path:
            if name not in cache:
                cache[name] = train(name, folder)
            return cache[name]

    return Runs()


def observations(env_id: str, n: int, seed: int = 0) -> np.ndarray:
    """``n`` observations of ``env_id`` ``(n, *shape)``: its reset observations of seeds
    ``seed .. seed + n - 1``."""
    env = gym.make(env_id)
    try:
        return np.stack([env.reset(seed=seed + k)[0] for k in range(n)])
    finally:
        env.close()


def check_acts(policy: Policy, obs: np.ndarray) -> None:
    """One observation and a batch ``(B, *shape)``: actions in the space, greedy ones
    reproducible and equal to the batch's rows, sampled ones varied."""
    space = policy.action_space
    one = policy.act(obs[0])
    assert space.contains(one)
    if isinstance(space, gym.spaces.Discrete):
        assert type(one) is int
    else:
        assert isinstance(one, np.ndarray) and one.shape == space.shape
    batch = policy.act(obs)
    assert isinstance(batch, np.ndarray) and batch.shape == (len(obs), *space.shape)
    assert all(space.contains(a if batch.ndim > 1 else int(a)) for a in batch)
    again = policy.act(obs)
    np.testing.assert_array_equal(again, batch)  # greedy: the same observation, the same action
    np.testing.assert_allclose(np.asarray(one), batch[0], rtol=1e-5, atol=1e-6)
    sampled = [policy.act(obs, deterministic=False) for _ in range(20)]
    assert all(s.shape == batch.shape for s in sampled)
    assert all(space.contains(a if s.ndim > 1 else int(a)) for s in sampled for a in s)
    assert any(not np.array_equal(s, sampled[0]) for s in sampled[1:]), "sampling never varied"


# ------------------------------------------------------------------------ every algorithm
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", ["reinforce", "a2c", "a2c-box", "ppo", "ppo-box", "dqn", "trpo",
                                  "sac"])
def test_the_policy_of_each_algorithms_run_acts_in_one_line(runs, name):
    policy = rlstruct.load_policy(runs[name], seed=0)
    assert not policy.recurrent and policy.device == torch.device("cpu")
    assert policy.checkpoint["algo"] == RUNS[name][0]
    check_acts(policy, observations(RUNS[name][1], 8))


def test_the_greedy_action_is_the_evaluation_agents_and_sampling_is_seeded(runs):
    run_dir = runs["ppo"]
    state = torch.load(run_dir / "checkpoints" / "latest.pt")
    obs = observations("CartPole-v1", 16)
    policy = load_policy(run_dir, seed=3)
    # The greedy action is the argmax of the trained model's logits.
    params, _ = policy.agent.model(torch.as_tensor(obs))
    np.testing.assert_array_equal(policy.act(obs), params.argmax(-1).numpy())
    assert policy.checkpoint["frames"] == state["frames"]
    first = [load_policy(run_dir, seed=3).act(obs, deterministic=False) for _ in range(2)]
    np.testing.assert_array_equal(*first)  # the same seed, the same draws


def test_dqn_samples_epsilon_greedy_with_the_runs_final_epsilon(runs):
    policy = load_policy(runs["dqn"], seed=0)
    obs = np.repeat(observations("CartPole-v1", 1), 2000, axis=0)
    greedy = policy.act(obs)
    assert (greedy == greedy[0]).all()
    explored = (policy.act(obs, deterministic=False) != greedy).mean()
    # eps_end = 0.05 of the rows play a uniform action: half of them differ from the greedy one.
    assert 0.01 < explored < 0.05


def test_the_best_checkpoint_and_inputs_the_env_does_not_give_exactly(runs):
    run_dir = runs["ppo"]
    policy = load_policy(run_dir, checkpoint="best")
    obs = observations("CartPole-v1", 4)
    expected = policy.act(obs)
    np.testing.assert_array_equal(policy.act(obs.astype(np.float64)), expected)
    np.testing.assert_array_equal(policy.act(torch.as_tensor(obs)), expected)
    assert policy.act(obs[0].tolist()) == expected[0]
    with pytest.raises(SpaceError, match="dtype complex128, expected float32"):
        policy.act(obs.astype(np.complex128))


# ------------------------------------------------------------------------------- devices
def test_the_policy_runs_on_the_device_asked_for(runs, device):
    policy = load_policy(runs["sac"], device=str(device), seed=0)
    assert policy.device.type == device.type
    assert all(p.device.type == device.type for p in policy.agent.model.parameters())
    check_acts(policy, observations("Pendulum-v1", 4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_the_machine_lacks_is_a_config_error(runs):
    with pytest.raises(ConfigError, match="CUDA is not available"):
        load_policy(runs["ppo"], device="cuda:0")


@pytest.mark.gpu
def test_a_cuda_policy_acts_on_numpy_and_cuda_observations(runs):
    policy = load_policy(runs["ppo-box"], device="cuda:0")
    obs = observations("Pendulum-v1", 4)
    on_cpu = load_policy(runs["ppo-box"]).act(obs)
    np.testing.assert_allclose(policy.act(obs), on_cpu, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(policy.act(torch.as_tensor(obs, device="cuda:0")), on_cpu,
                               rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------ recurrent
def test_a_recurrent_policy_remembers_until_reset(runs):
    policy = load_policy(runs["a2c-recurrent"])
    assert policy.recurrent
    obs = observations("CartPole-v1", 4)
    first = policy.act(obs)
    memory = policy.memory["h"].clone()
    policy.act(obs)
    assert not torch.equal(policy.memory["h"], memory)  # the memory moved on
    with pytest.raises(ShapeError, match=r"remembers 4 episode\(s\) and got 1 .*policy.reset"):
        policy.act(obs[0])
    policy.reset()
    np.testing.assert_array_equal(policy.act(obs), first)  # a fresh episode: the same start
    policy.reset()
    assert policy.act(obs[1]) == first[1]
    policy.reset()
    assert policy.act(obs, deterministic=False).shape == (4,)


def play(act, reset, seed: int, memory=None) -> tuple[list[int], list[torch.Tensor]]:
    """One CartPole episode of seed ``seed`` played with ``act``: its actions, and the memory
    after each (``memory()``), as a generator that yields after each step (to interleave)."""
    env = gym.make("CartPole-v1")
    try:
        reset()
        obs, _ = env.reset(seed=seed)
        actions, memories, done = [], [], False
        while not done:
            actions.append(act(obs))
            if memory is not None:
                memories.append(memory()["h"].clone())
            obs, _, terminated, truncated, _ = env.step(actions[-1])
            done = terminated or truncated
            yield actions, memories
    finally:
        env.close()


def alone(policy: Policy, seed: int) -> tuple[list[int], list[torch.Tensor]]:
    """The episode of seed ``seed`` played by ``policy`` alone."""
    *_, last = play(policy.act, policy.reset, seed, lambda: policy.memory)
    return last


def test_threads_sharing_a_recurrent_policy_each_play_their_episode_as_if_alone(runs):
    policy = load_policy(runs["a2c-recurrent"])
    expected = {seed: alone(policy, seed) for seed in (3, 4)}
    got, errors = {}, []
    turn = threading.Barrier(2, timeout=60)  # both threads act at each step, in turn

    def thread(seed: int) -> None:
        try:
            episode = play(policy.act, policy.reset, seed, lambda: policy.memory)
            for got[seed] in episode:
                turn.wait()
            turn.abort()  # the other thread plays on alone once this episode ended
        except threading.BrokenBarrierError:
            for got[seed] in episode:
                pass
        except Exception as err:  # noqa: BLE001 - raised again in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=thread, args=(seed,)) for seed in (3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for seed in (3, 4):
        actions, memories = got[seed]
        assert actions == expected[seed][0], seed
        assert all(torch.equal(a, b) for a, b in zip(memories, expected[seed][1], strict=True))


def test_sessions_of_one_policy_interleaved_in_one_thread_each_have_their_memory(runs):
    policy = load_policy(runs["a2c-recurrent"])
    expected = [alone(policy, seed)[0] for seed in (3, 4)]
    sessions = [policy.session() for _ in range(2)]
    live = {k: play(s.act, s.reset, seed) for k, (s, seed) in enumerate(zip(sessions, (3, 4)))}
    got: list[list[int]] = [[], []]
    while live:  # one step of each episode in turn
        for k in list(live):
            step = next(live[k], None)
            if step is None:
                del live[k]
            else:
                got[k] = step[0]
    assert got == expected


# --------------------------------------------------------------------------------- errors
def test_a_wrong_observation_shape_names_the_shape_expected(runs):
    policy = load_policy(runs["ppo"])
    for bad in (np.zeros(3, np.float32), np.zeros((2, 5), np.float32),
                np.zeros((2, 3, 4), np.float32), 1.0):
        with pytest.raises(ShapeError, match=r"expected \(4,\) \(one observation\) or "
                                             r"\(B, \*\(4,\)\) \(a batch\)"):
            policy.act(bad)


def test_nan_ragged_and_wrongly_typed_observations_are_typed_errors(runs):
    policy = load_policy(runs["ppo"])
    for bad in (np.array([0.0, np.nan, 0.0, 0.0]), np.array([[0.0] * 4, [np.inf, 0, 0, 0]])):
        with pytest.raises(NonFiniteError, match=r"observation holds (nan|inf) .*finite "
                                                 r"observations of the space Box"):
            policy.act(bad)
    with pytest.raises(ShapeError, match=r"observation is not an array of one shape .* "
                                         r"expected \(4,\) \(one observation\)"):
        policy.act([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0]])  # ragged rows
    for bad in ("left", ["a", "b", "c", "d"], [None] * 4, {"frame": [0.0] * 4}):
        with pytest.raises((SpaceError, ShapeError), match=r"expected .*observation space Box"):
            policy.act(bad)
    with pytest.raises(SpaceError, match=r"is list \['a', 'b', 'c', 'd'\] .* expected numbers "
                                         r"of dtype float32"):
        policy.act(["a", "b", "c", "d"])


def test_a_checkpoint_without_env_id_is_a_checkpoint_error_for_load_policy_and_evaluate(
        runs, tmp_path, capsys):
    from rlstruct.__main__ import main

    run_dir = tmp_path / "run"
    shutil.copytree(runs["ppo"], run_dir)
    path = run_dir / "checkpoints" / "latest.pt"
    state = torch.load(path)
    torch.save({**state, "config": {k: v for k, v in state["config"].items()
                                    if k != "env_id"}}, path)
    with pytest.raises(CheckpointError, match=r"latest.pt records env_id None: a run's "
                                              r"checkpoint holds its whole config"):
        load_policy(run_dir)
    assert main(["evaluate", str(run_dir), "--episodes", "1"]) == 1
    assert "rlstruct evaluate: error: " in capsys.readouterr().err
    torch.save({**state, "config": None}, path)
    with pytest.raises(CheckpointError, match=r"latest.pt records no config"):
        load_policy(run_dir)


def test_a_folder_that_is_not_a_run_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="is not a run folder"):
        load_policy(tmp_path)
    with pytest.raises(CheckpointError, match="is not a run folder"):
        load_policy(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="is not a run folder"):
        load_policy(tmp_path / "notes.txt")


def test_a_run_without_checkpoints_is_a_checkpoint_error(runs, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(runs["ppo"], run_dir)
    shutil.rmtree(run_dir / "checkpoints")
    with pytest.raises(CheckpointError, match=r"has no checkpoint latest.pt \(it holds none\)"):
        load_policy(run_dir)
    (run_dir / "checkpoints").mkdir()
    shutil.copy(runs["ppo"] / "checkpoints" / "latest.pt", run_dir / "checkpoints")
    with pytest.raises(CheckpointError, match=r"no checkpoint best.pt \(it holds \['latest.pt'\]"):
        load_policy(run_dir, checkpoint="best")
    with pytest.raises(ConfigError, match="checkpoint must be 'latest' or 'best', got 'last'"):
        load_policy(run_dir, checkpoint="last")
    (run_dir / "checkpoints" / "latest.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="damaged or not a checkpoint"):
        load_policy(run_dir)


def test_a_checkpoint_that_does_not_record_its_agent_is_a_checkpoint_error(runs, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(runs["ppo"], run_dir)
    path = run_dir / "checkpoints" / "latest.pt"
    state = torch.load(path)
    torch.save({**state, "agent": None}, path)
    with pytest.raises(CheckpointError, match="does not record the evaluation agent"):
        load_policy(run_dir)
    assert json.loads((run_dir / "config.json").read_text())  # still a run folder


# ------------------------------------------------------------------- any observation space
class _SumAgent(Agent):
    """Action ``pos.sum() + flag > 1`` (a Dict observation), or a random action."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(1, 1)  # something to move

    def __call__(self, state, observation, agent_info):
        greedy = (observation["pos"].sum(-1) + observation["flag"] > 1).long()
        if "greedy" not in agent_info:
            greedy = torch.randint(0, 2, greedy.shape)
        return DictTensor({"action": greedy}), state


def test_a_dict_observation_space_takes_dicts_of_leaves():
    space = gym.spaces.Dict({"pos": gym.spaces.Box(0, 1, (2,), np.float32),
                             "flag": gym.spaces.Discrete(2)})
    policy = Policy(_SumAgent(), space, gym.spaces.Discrete(2),
                    greedy_info=DictTensor({"greedy": torch.ones(1, dtype=torch.bool)}))
    assert policy.act({"pos": np.array([0.5, 0.25], np.float32), "flag": 1}) == 1
    assert policy.act({"pos": np.array([0.5, 0.25], np.float32), "flag": 0}) == 0
    batch = {"pos": np.full((3, 2), 0.75, np.float32), "flag": np.array([0, 1, 0])}
    np.testing.assert_array_equal(policy.act(batch), [1, 1, 1])
    with pytest.raises(ShapeError, match="the observation has no 'flag'"):
        policy.act({"pos": np.zeros(2, np.float32)})
    with pytest.raises(ShapeError, match=r"key 'pos' has shape \(3, 2\), but key 'flag' has "
                                         r"shape \(2,\): a batch has the same rows"):
        policy.act({"pos": np.zeros((3, 2), np.float32), "flag": np.zeros(2, np.int64)})


# ----------------------------------------------------- worker processes, learner groups, Atari
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["impala", "appo", "ppo --n-learners 2",
                                  "sac --n-learners 2 --env-id Pendulum-v1"])
def test_pipelined_and_learner_group_runs_give_their_policy(algo, tmp_path):
    algo, *extra = algo.split()
    frames = "600" if algo == "sac" else "2000"
    processes = "2" if algo in ("impala", "appo") else "1"
    done = subprocess.run(
        [sys.executable, "-m", "rlstruct", "train", algo, "--max-frames", frames, "--eval-every",
         "0", "--n-processes", processes, "--target-return", "None", *extra],
        cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    policy = load_policy(run_dir, seed=0)
    env_id = "Pendulum-v1" if algo == "sac" else "CartPole-v1"
    check_acts(policy, observations(env_id, 8))


@pytest.mark.timeout(300)
def test_an_atari_policy_acts_on_stacked_uint8_frames(tmp_path):
    pytest.importorskip("ale_py", reason="needs the atari extra: pip install -e '.[atari]'")
    pytest.importorskip("cv2", reason="needs the atari extra: pip install -e '.[atari]'")
    from rlstruct.algos import ppo
    from rlstruct.envs.atari import make_atari_gym_env

    cfg = ppo.Config(env_id="ALE/Pong-v5", env_backend="atari", model="cnn",
                     layout=LayoutConfig(learner_device="cpu", n_processes=1, n_envs=1),
                     n_timesteps=32, max_frames=64, n_epochs=1, minibatch_size=32,
                     target_return=None, eval_every=0, runs_dir=str(tmp_path))
    policy = load_policy(ppo.main(cfg)["run_dir"], seed=0)
    env = make_atari_gym_env("ALE/Pong-v5")
    try:
        frames = np.stack([env.reset(seed=0)[0], env.step(0)[0], env.step(1)[0]])
    finally:
        env.close()
    assert frames.shape == (3, 4, 84, 84) and frames.dtype == np.uint8
    check_acts(policy, frames)
    with pytest.raises(ShapeError, match=r"shape \(84, 84\), expected \(4, 84, 84\)"):
        policy.act(frames[0, 0])
