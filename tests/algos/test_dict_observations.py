"""Dict observations end to end (issue 42, item 2): every algorithm trains on
``rlstruct/Dict-v0`` (SAC on ``rlstruct/DictBox-v0``) from the command line through a
multi-input model, writes a complete run folder, and ``load_policy`` acts on Dict
observations; a Dict leaf no model takes is refused before the run folder exists."""

from __future__ import annotations

import numpy as np
import pytest
from support.algo_runs import check_run_dir, run_algo

import rlstruct
from rlstruct.algos import ppo
from rlstruct.envs.debug import DICT_BOX_ID, DICT_ID, DictEnv
from rlstruct.errors import ConfigError

# name -> its own arguments: a few iterations each, an unreachable target (no early stop).
ALGOS = {
    "reinforce": ["--n-timesteps", "16"],
    "a2c": [],
    "ppo": [],
    "ppo-lstm": ["--model", "mlp-lstm"],
    "dqn": ["--learning-starts", "256", "--max-frames", "768"],
    "impala": [],
    "appo": [],
    "trpo": [],
    "sac": ["--learning-starts", "128", "--max-frames", "384"],
}


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("name", list(ALGOS))
def test_every_algorithm_trains_on_a_dict_observation_and_its_policy_acts_on_one(name, tmp_path):
    algo = name.split("-")[0]
    env_id = DICT_BOX_ID if algo == "sac" else DICT_ID
    args = ["--env-id", env_id, "--max-frames", "1536", "--target-return", "100",
            "--n-envs", "4", "--runs-dir", str(tmp_path / "runs"), *ALGOS[name]]
    run_dir, out = run_algo(algo, args, tmp_path, timeout=180)
    assert "stopped by max_frames" in out
    check_run_dir(run_dir)
    policy = rlstruct.load_policy(run_dir)
    env = DictEnv(box_action=algo == "sac")
    obs, _ = env.reset(seed=0)
    action = policy.act(obs)
    assert env.action_space.contains(action if algo == "sac" else int(action))
    batch = {k: np.stack([v, v, v]) for k, v in obs.items()}
    policy.reset()  # a recurrent policy: another batch size, a fresh memory
    actions = policy.act(batch)
    assert len(actions) == 3


def test_a_dict_leaf_no_model_takes_is_refused_before_the_run_folder(tmp_path):
    runs = tmp_path / "runs"
    cfg = ppo.Config(env_id="MultiDiscreteDictObs-v0", env_module=("support.toy_envs",),
                     runs_dir=str(runs))
    with pytest.raises(ConfigError) as info:
        ppo.main(cfg)
    message = str(info.value)
    assert "ppo cannot train on MultiDiscreteDictObs-v0: observation key 'code'" in message
    assert "MultiDiscrete" in message and not runs.exists()


def test_a_cnn_model_on_a_dict_observation_is_refused_before_the_run_folder(tmp_path):
    runs = tmp_path / "runs"
    with pytest.raises(ConfigError, match=r"--model cnn reads one image array.*--model mlp"):
        ppo.main(ppo.Config(env_id=DICT_ID, model="cnn", runs_dir=str(runs)))
    assert not runs.exists()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_ppo_learns_the_dict_env_whose_reward_needs_both_keys(tmp_path):
    # A policy blind to the image or to the vector earns 4 per episode of 8; PPO's multi-input
    # model reaches 7 (of 8) in about 3.5k frames.
    args = ["--env-id", DICT_ID, "--max-frames", "12288", "--target-return", "7.0",
            "--runs-dir", str(tmp_path / "runs")]
    _, out = run_algo("ppo", args, tmp_path, timeout=180)
    assert "ppo: solved after" in out
