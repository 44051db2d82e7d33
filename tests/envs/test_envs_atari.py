"""Tests of the Atari factory (rlstruct/envs/atari.py): gymnasium's Atari preprocessing behind a
GymEnvInf, uint8 frames from the env to the batch, seeds, batchers.

Skipped without ale-py and OpenCV (``pip install -e '.[atari]'``), except the test of the
ImportError's message. About 20 s on 2 busy cores.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from rlstruct import DictTensor
from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.envs import GymEnv, GymEnvInf
from rlstruct.envs.atari import make_atari_env
from rlstruct.errors import ConfigError

HAVE_ATARI = all(importlib.util.find_spec(m) is not None for m in ("ale_py", "cv2"))
needs_atari = pytest.mark.skipif(
    not HAVE_ATARI, reason="ale-py or OpenCV is not installed (pip install -e '.[atari]')"
)
FRAME = (4, 84, 84)


def act(values: torch.Tensor | list[int]) -> DictTensor:
    return DictTensor({"action": torch.as_tensor(values, dtype=torch.long)})


class RandomAgent(Agent):
    """Uniform random Atari actions (from the batcher's own streams)."""

    def __call__(self, state, observation, agent_info):
        frame = observation["frame"]
        assert frame.dtype == torch.uint8  # never float on the way to the agent
        return DictTensor({"action": torch.randint(0, 6, (frame.shape[0],))}), state


def test_missing_ale_py_raises_an_import_error_naming_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ale_py", None)  # "import ale_py" now fails
    with pytest.raises(ImportError, match=r"pip install -e '\.\[atari\]'"):
        make_atari_env("ALE/Pong-v5", 1)


@needs_atari
def test_shapes_dtypes_and_time_limit() -> None:
    env = make_atari_env("ALE/Pong-v5", 2, seed=0, max_episode_steps=5, info_keys=("lives",))
    assert isinstance(env, GymEnvInf)
    assert env.observation_space.shape == FRAME and env.action_space.n == 6
    obs, _ = env.reset()
    assert obs["frame"].shape == (2, *FRAME) and obs["frame"].dtype == torch.uint8
    assert obs["reward"].dtype == torch.float32 and obs["last_action"].dtype == torch.int64
    # FrameStackObservation pads the stack with the reset frame
    assert torch.equal(obs["frame"][:, 0], obs["frame"][:, 3])
    for t in range(1, 6):
        (t1, _), (nxt, _) = env.step(act([t % 6, 0]))
        assert t1["frame"].dtype == nxt["frame"].dtype == torch.uint8
        assert t1["frame"].shape == (2, *FRAME)
    # max_episode_steps counts agent steps: truncated at the 5th, then a new episode
    assert t1["truncated"].all() and not t1["terminated"].any()
    assert nxt["initial_state"].all() and (nxt["env_step"] == 0).all()
    assert torch.equal(nxt["frame"][:, 0], nxt["frame"][:, 3])
    assert not torch.equal(t1["frame"][:, 3], t1["frame"][:, 2])  # the stack moves
    episodic = make_atari_env("ALE/Pong-v5", 1, seed=0, auto_reset=False, frame_stack=2,
                              screen_size=64)
    assert isinstance(episodic, GymEnv) and episodic.observation_space.shape == (2, 64, 64)


@needs_atari
def test_seeds_same_seed_same_frames_and_env_k_gets_seed_plus_k() -> None:
    def frames(seed: int, n: int) -> torch.Tensor:
        env = make_atari_env("ALE/Pong-v5", n, seed=seed)
        obs, _ = env.reset()
        out = [obs["frame"]]
        for t in range(40):  # the same action for every env at each step
            (t1, _), (obs, _) = env.step(act([(t * 7) % 6] * n))
            out.append(t1["frame"])
        return torch.stack(out, 1)  # (n, 41, 4, 84, 84)

    a = frames(5, 2)
    assert torch.equal(a, frames(5, 2))
    assert torch.equal(a[1], frames(6, 1)[0])  # env 1 of seed 5 is seeded 6
    assert not torch.equal(a[0], a[1])  # no-ops and sticky actions differ between seeds


@needs_atari
def test_serial_batcher_collects_uint8_pong() -> None:
    with SerialBatcher(24, RandomAgent, {}, make_atari_env, {"n_envs": 2}, seeds=1) as b:
        b.reset()
        b.execute()
        traj, n_running = b.get()
        assert b.buffer.bytes_per_transition() > 2 * 4 * 84 * 84
    steps = traj.trajectories
    assert n_running == 2 and steps.full() and steps.n_timesteps() == 24
    for key in ("observation/frame", "_observation/frame"):
        assert steps[key].dtype == torch.uint8 and steps[key].shape == (2, 24, *FRAME)
    # consecutive steps of one env: the next observation is the next step's observation
    assert torch.equal(steps["observation/frame"][:, 1:], steps["_observation/frame"][:, :-1])
    assert torch.equal(steps["observation/env_step"][0], torch.arange(24))
    assert steps["observation/frame"].float().std() > 0  # real pixels, not a blank buffer


@needs_atari
@pytest.mark.timeout(120)
def test_batcher_two_workers_equal_the_serial_batcher() -> None:
    env_args = {"env": "ALE/Pong-v5", "n_envs": 1}
    with Batcher(8, RandomAgent, {}, make_atari_env, env_args, n_processes=2, seeds=3) as b:
        b.reset()
        b.execute()
        got, _ = b.get()
    steps = got.trajectories
    assert steps["observation/frame"].dtype == torch.uint8
    assert steps["observation/frame"].shape == (2, 8, *FRAME) and steps.full()
    # worker p's env is global env p: seeded 3 * 2**20 + p, as in a SerialBatcher
    env = make_atari_env("ALE/Pong-v5", 2, seed=3 * 2**20)
    obs, _ = env.reset()
    assert torch.equal(steps["observation/frame"][:, 0], obs["frame"])


@needs_atari
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"env": "ALE/Pongg-v5"}, "not a registered gymnasium id.*Pong"),
        ({"env": "CartPole-v1"}, "not an ALE env"),
        ({"frame_skip": 0}, "frame_skip"),
        ({"frame_stack": 0}, "frame_stack"),
        ({"noop_max": -1}, "noop_max"),
        ({"max_episode_steps": 0}, "max_episode_steps"),
        ({"repeat_action_probability": 1.5}, "repeat_action_probability"),
        ({"n_envs": 0}, "n_envs"),
    ],
)
def test_config_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_atari_env(**kwargs)


@needs_atari
def test_the_ale_banner_prints_at_most_once(capfd, monkeypatch) -> None:
    """Issue 38: a run printed ALE's banner three times, once per process that made an Atari
    env (the main process, and each worker). The main process shows it at most once; a worker
    process silences ALE before its first emulator starts."""
    import multiprocessing

    import ale_py

    from rlstruct.envs import atari

    capfd.readouterr()
    for _ in range(2):
        atari.make_atari_gym_env("ALE/Pong-v5").close()
    assert capfd.readouterr().err.count("Arcade Learning Environment") <= 1
    events: list[object] = []
    set_mode, make = ale_py.ALEInterface.setLoggerMode, atari.gym.make
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())  # as in a worker
    monkeypatch.setattr(ale_py.ALEInterface, "setLoggerMode",
                        staticmethod(lambda mode: (events.append(mode), set_mode(mode))[1]))
    monkeypatch.setattr(atari.gym, "make", lambda *a, **k: (events.append("make"),
                                                            make(*a, **k))[1])
    atari.make_atari_gym_env("ALE/Pong-v5").close()
    assert events[:2] == [ale_py.LoggerMode.Error, "make"], events
