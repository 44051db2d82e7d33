"""``--env-backend envpool``: a run's Atari envs stepped by envpool (rlstruct/envs/envpool_args.py,
rlstruct/runs/training_env.py, rlstruct/envs/registry.py).

The id mapping and the checks run everywhere; what steps envpool skips without it (``pip install
-e '.[envpool]'``; CI does not install it: its wheel pulls ~600 MB of MuJoCo assets). The game
test plays one Pong episode with the same actions on both backends, without random no-ops and
sticky actions: the frames, rewards and the episode's end must be the same.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlstruct import DictTensor
from rlstruct.envs import envpool_args
from rlstruct.envs.envpool_args import atari_envpool_kwargs, atari_twin
from rlstruct.envs.registry import env_id_problems
from rlstruct.errors import ConfigError
from rlstruct.runs.training_env import envpool_threads

HAVE_ENVPOOL = importlib.util.find_spec("envpool") is not None
HAVE_ALE = importlib.util.find_spec("ale_py") is not None and importlib.util.find_spec("cv2")
needs_envpool = pytest.mark.skipif(
    not HAVE_ENVPOOL, reason="envpool is not installed (pip install -e '.[envpool]')")


def test_ale_ids_map_to_envpool_tasks_with_their_sticky_actions() -> None:
    assert atari_twin("PongNoFrameskip-v4") == ("Pong-v5", 0.0)
    assert atari_twin("ALE/Breakout-v5") == ("Breakout-v5", 0.25)
    assert atari_twin("CartPole-v1") is None and atari_twin("Pong-v5") is None
    task, kwargs = atari_envpool_kwargs("ALE/Pong-v5", frame_stack=1)
    assert task == "Pong-v5"
    assert kwargs["repeat_action_probability"] == 0.25 and kwargs["stack_num"] == 1
    assert kwargs["use_fire_reset"] is False and kwargs["episodic_life"] is False
    assert kwargs["reward_clip"] is False and kwargs["noop_max"] == 30


def test_a_non_ale_id_is_refused_with_what_the_backend_takes() -> None:
    with pytest.raises(ConfigError, match=r"plays ALE ids .*not 'CartPole-v1'"):
        atari_envpool_kwargs("CartPole-v1")
    (problem,) = env_id_problems("CartPole-v1", "envpool")
    assert problem.startswith("--env-backend envpool:") and "EnvPoolEnv" in problem


def test_missing_envpool_is_a_problem_that_says_how_to_install_it(monkeypatch) -> None:
    def absent() -> None:
        raise ImportError("EnvPoolEnv needs envpool: pip install -e '.[envpool]'")

    monkeypatch.setattr(envpool_args, "import_envpool", absent)
    (problem,) = env_id_problems("PongNoFrameskip-v4", "envpool")
    assert "--env-backend envpool" in problem and "pip install" in problem


def test_noop_max_zero_is_refused_before_envpool_is_touched() -> None:
    from rlstruct.envs.envpool import EnvPoolEnv

    # envpool 1.2.5 dies of a segmentation fault at noop_max=0; the check needs no envpool
    with pytest.raises(ConfigError, match=r"noop_max=0.*segmentation fault"):
        EnvPoolEnv("Pong-v5", 1, noop_max=0)
    with pytest.raises(ConfigError, match="noop_max=True"):
        EnvPoolEnv("Pong-v5", 1, noop_max=True)


def test_each_worker_gets_its_share_of_the_cores() -> None:
    assert envpool_threads(2, cores=2) == 1
    assert envpool_threads(4, cores=16) == 4
    assert envpool_threads(3, cores=2) == 1
    assert envpool_threads(1, cores=16) == 16
    assert envpool_threads(0, cores=16) == 1  # one worker per core


def _episode(env, actions: np.ndarray) -> tuple[list[np.ndarray], list[float], int]:
    """Frames (reset's first), rewards and the step at which the first episode ends."""
    obs, _ = env.reset()
    frames, rewards = [obs["frame"][0].numpy().copy()], []
    for t, a in enumerate(actions):
        (obs_t1, _), _ = env.step(DictTensor({"action": torch.tensor([int(a)])}))
        frames.append(obs_t1["frame"][0].numpy().copy())
        rewards.append(float(obs_t1["reward"][0]))
        if bool(obs_t1["done"][0]):
            return frames, rewards, t
    raise AssertionError("the episode did not end")


@needs_envpool
@pytest.mark.skipif(not HAVE_ALE, reason="ale-py and OpenCV are not installed ('.[atari]')")
@pytest.mark.parametrize(("env_id", "n_actions", "steps"),
                         [("PongNoFrameskip-v4", 6, 500), ("BreakoutNoFrameskip-v4", 4, 100)])
def test_envpool_plays_the_atari_backends_game(env_id: str, n_actions: int, steps: int) -> None:
    from rlstruct.envs.atari import make_atari_env
    from rlstruct.envs.envpool import EnvPoolEnv

    task, kwargs = atari_envpool_kwargs(env_id)
    kwargs["noop_max"] = 1  # no random no-ops: both start from ALE's own first frame
    actions = np.random.default_rng(0).integers(n_actions, size=4000)
    ale = make_atari_env(env_id, 1, seed=0, auto_reset=False, noop_max=1)
    pool = EnvPoolEnv(task, 1, seed=0, auto_reset=False, num_threads=1, **kwargs)
    try:
        frames_a, rewards_a, end_a = _episode(ale, actions)
        frames_p, rewards_p, end_p = _episode(pool, actions)
    finally:
        ale.close()
        pool.close()
    assert end_a == end_p and end_a > steps  # a whole game
    assert rewards_a == rewards_p
    # every frame but the final one (envpool's ALE build draws the last screen apart)
    same = [np.array_equal(a, p) for a, p in zip(frames_a[:-1], frames_p[:-1], strict=True)]
    assert all(same), f"frames differ at steps {[i for i, s in enumerate(same) if not s][:5]}"


@needs_envpool
def test_a_run_trains_on_envpool_and_records_it(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "rlstruct", "train", "a2c", "--preset", "atari",
           "--env-backend", "envpool", "--n-processes", "2", "--n-envs", "2",
           "--max-frames", "400", "--progress-every-s", "0", "--runs-dir", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (run,) = tmp_path.iterdir()
    config = json.loads((run / "config.json").read_text())
    assert config["config"]["env_backend"] == "envpool"
    rows = (run / "progress.csv").read_text().splitlines()
    assert len(rows) >= 2 and int(rows[-1].split(",")[0]) >= 400
    if HAVE_ALE:  # rlstruct evaluate plays the run's game with ale-py
        cmd = [sys.executable, "-m", "rlstruct", "evaluate", str(run), "--episodes", "1"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        assert "1 greedy episodes, return -" in out.stdout


def test_a_non_ale_id_stops_the_run_before_its_folder(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "rlstruct", "train", "ppo", "--env-id", "CartPole-v1",
           "--env-backend", "envpool", "--runs-dir", str(tmp_path / "runs")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "--env-backend envpool" in out.stderr + out.stdout
    assert not (tmp_path / "runs").exists()
