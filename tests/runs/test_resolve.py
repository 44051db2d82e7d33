"""rlstruct.runs.resolve: building a config reads nothing; the one step that looks outside names
every mistake a user can make on the command line before any folder, process or thread exists
(issue 27, section 1), and a command line with one exits 2 with one message and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import pytest
import torch

from rlstruct.algos import a2c, appo, dqn, impala, ppo, reinforce, sac, trpo
from rlstruct.errors import ConfigError
from rlstruct.runs.config import RunConfig
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import Resolved, observation_problems, resolve


def test_building_a_config_reads_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")  # read by resolve only
    cfg = dqn.Config(env_id="NoSuch-v0", layout_file=str(tmp_path / "missing.json"),
                     env_module=["no_such_module"], resume=str(tmp_path / "nothing"))
    assert cfg.env_module == ("no_such_module",)  # normalised, nothing read
    with pytest.raises(ConfigError) as info:
        resolve(cfg)
    message = str(info.value)
    for text in ("missing.json", "no_such_module", "WORLD_SIZE=4", "holds no checkpoints"):
        assert text in message


@pytest.mark.parametrize(("module", "env_id", "takes"), [
    (dqn, "Pendulum-v1", "Discrete"), (appo, "Pendulum-v1", "Discrete"),
    (reinforce, "Pendulum-v1", "Discrete"), (impala, "Pendulum-v1", "Discrete"),
    (sac, "CartPole-v1", "Box")])
def test_an_action_space_the_algorithm_cannot_take_is_named(module, env_id, takes):
    name = module.__name__.rsplit(".", 1)[-1]
    with pytest.raises(ConfigError) as info:
        resolve(module.Config(env_id=env_id))
    message = str(info.value)
    assert f"{name} cannot train on {env_id}: its action space is" in message
    assert f"{name} takes {takes} action spaces" in message


ALGOS = [reinforce, a2c, ppo, dqn, impala, appo, trpo, sac]


@pytest.mark.parametrize("env_id", ["DictObs-v0", "TupleObs-v0"])
@pytest.mark.parametrize("module", [m for m in ALGOS if m is not sac],  # SAC: Box actions
                         ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_dict_and_tuple_observation_spaces_resolve_to_the_multi_input_features(module, env_id):
    resolved = resolve(module.Config(env_id=env_id, env_module=("support.toy_envs",)))
    keys = ["pos", "vel"] if env_id == "DictObs-v0" else ["0", "1"]
    assert list(resolved.obs_spec) == keys  # the feature keys, each a (2,) vector
    assert resolved.obs_shape == (4,)


@pytest.mark.parametrize("space", [
    gym.spaces.Text(8), gym.spaces.Graph(gym.spaces.Box(0, 1, (2,)), None),
    gym.spaces.Sequence(gym.spaces.Discrete(2)), gym.spaces.Discrete(3),
    gym.spaces.Box(0, 1, ())], ids=lambda s: type(s).__name__ + str(s.shape))
def test_every_observation_space_outside_those_the_algorithm_takes_is_named(space):
    cfg = ppo.Config(env_id="Toy-v0")
    (problem,) = observation_problems(cfg, space)
    assert f"ppo cannot train on Toy-v0: its observation space is {space}" in problem
    assert observation_problems(cfg, gym.spaces.Box(0, 1, (3, 2))) == []
    assert observation_problems(cfg, gym.spaces.MultiDiscrete([2, 3])) == []
    assert observation_problems(cfg, gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (3,))})) == []


def test_an_env_whose_close_raises_is_named_as_a_close_error_not_as_one_that_cannot_be_made():
    with pytest.raises(ConfigError) as info:
        resolve(ppo.Config(env_id="CloseRaises-v0", env_module=("support.toy_envs",)))
    message = str(info.value)
    assert ("env_id 'CloseRaises-v0' was made, but its close() raised RuntimeError: the "
            "simulator's licence server is gone") in message
    assert "cannot be made" not in message


@pytest.mark.parametrize("module", [ppo, a2c, trpo])
def test_algorithms_that_take_both_kinds_of_action_space_resolve_on_both(module):
    for env_id in ("CartPole-v1", "Pendulum-v1"):
        assert isinstance(resolve(module.Config(env_id=env_id)), Resolved)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("field", ["batcher_device", "learner_device", "eval_device"])
def test_a_cuda_device_on_a_machine_without_one_is_named(field):
    with pytest.raises(ConfigError, match=rf"{field}: device 'cuda:0': CUDA is not available "
                                          r"on this machine \(available: cpu\)"):
        resolve(ppo.Config(layout=LayoutConfig(**{field: "cuda:0"})))


def test_learner_ranks_that_cannot_split_the_batch_are_refused():
    layout = LayoutConfig(n_learners=2, n_processes=3, n_envs=3)
    with pytest.raises(ConfigError, match=r"2 learner ranks cannot split a batch of 9 rows"):
        resolve(ppo.Config(layout=layout))
    assert isinstance(resolve(ppo.Config(layout=LayoutConfig(n_learners=2, n_processes=2,
                                                               n_envs=3))), Resolved)


def test_a_replay_buffer_beyond_memory_names_buffer_size_and_the_bytes():
    with pytest.raises(ConfigError, match=r"buffer_size 1,000,000,000,000 needs about .* GiB "
                                          r".* GiB available: lower --buffer-size"):
        resolve(sac.Config(env_id="Pendulum-v1", buffer_size=10**12))


def test_resolve_applies_the_layout_file_once_to_a_copy(tmp_path):
    layout = tmp_path / "tune.json"
    layout.write_text(json.dumps({"n_processes": 1, "n_envs": 3, "n_timesteps": 7}))
    cfg = RunConfig(layout_file=str(layout))
    assert cfg.layout.n_envs != 3  # building applies nothing
    resolved = resolve(cfg)
    assert resolved.cfg.layout.n_envs == 3 and resolved.cfg.n_timesteps == 7
    assert cfg.layout.n_envs != 3 and cfg.n_timesteps != 7  # the config given is left as it was
    layout.unlink()
    assert resolve(resolved) is resolved  # resolved once: the file is not read again


MISTAKES = [
    (["dqn", "--env-id", "Pendulum-v1"], "dqn cannot train on Pendulum-v1"),
    (["sac", "--env-id", "CartPole-v1"], "sac takes Box action spaces"),
    (["ppo", "--batcher-device", "cuda:0"], "CUDA is not available"),
    (["ppo", "--learner-device", "cuda"], "learner_device: device 'cuda'"),
    (["ppo", "--n-learners", "2", "--n-processes", "3", "--n-envs", "3"],
     "cannot split a batch of 9 rows"),
    (["sac", "--env-id", "Pendulum-v1", "--buffer-size", "1000000000000"], "lower --buffer-size"),
]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA cases need a machine without it")
@pytest.mark.parametrize(("args", "message"), MISTAKES, ids=[" ".join(a[:3]) for a, _ in MISTAKES])
def test_a_command_line_mistake_exits_2_with_one_message_and_no_folder(args, message, tmp_path):
    algo, *flags = args
    done = subprocess.run([sys.executable, "-m", f"rlstruct.algos.{algo}", *flags],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1
    assert list(tmp_path.iterdir()) == []  # no runs/ folder


@pytest.mark.slow
def test_a_config_error_while_the_run_sets_up_exits_2_and_leaves_no_folder(tmp_path):
    # REINFORCE collects synchronously: --pipeline 2 is refused when the training batcher is
    # built (after the run folder exists); the folder goes, the message stays one line.
    done = subprocess.run([sys.executable, "-m", "rlstruct", "train", "reinforce", "--pipeline",
                           "2"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "rlstruct train reinforce: error:" in done.stderr and "--pipeline 2" in done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # no run folder, no empty runs/


def test_a_ray_cluster_that_cannot_be_joined_is_one_message_that_says_what_to_do():
    from rlstruct.parallel.ray_cluster import RaySession

    class Unjoinable:
        @staticmethod
        def is_initialized():
            return False

        @staticmethod
        def init(address):
            raise ConnectionError("InvalidAuthToken: the token does not match")

    with pytest.raises(ConfigError) as info:
        RaySession(Unjoinable, lambda: None).acquire("10.1.2.3:6379", 1)
    message = str(info.value)
    assert message.startswith("cannot join the Ray cluster at 10.1.2.3:6379 (ConnectionError:")
    assert "export RAY_AUTH_MODE=token" in message
