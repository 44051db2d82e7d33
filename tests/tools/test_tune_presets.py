"""``rlstruct tune --preset NAME --env-backend B`` (rlstruct/algos/tuning.py): the tuner measures a
preset's own model on the envs its runs train on (the Nature CNN on Atari frames, from ale-py or
envpool), so that a layout for an Atari preset, or the faster of two env backends, is measured
rather than guessed. Skipped without the atari extra (ale-py and OpenCV); the envpool case
without envpool.
"""

from __future__ import annotations

import importlib.util
import json
from typing import get_args, get_type_hints

import pytest
import torch
from support.tune_helpers import learn_on_one_batch

from rlstruct.algos import a2c, tuning
from rlstruct.errors import ConfigError
from rlstruct.runs.config import RunConfig
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.layout_file import (
    ENV_BACKENDS,
    TunedLayout,
    apply_layout,
    read_layout,
    write_layout,
)
from rlstruct.tools.tune import main

HAVE_ATARI = bool(importlib.util.find_spec("ale_py") and importlib.util.find_spec("cv2"))
needs_atari = pytest.mark.skipif(not HAVE_ATARI, reason="the atari extra is not installed "
                                 "(pip install -e '.[atari]')")
needs_envpool = pytest.mark.skipif(importlib.util.find_spec("envpool") is None,
                                   reason="envpool is not installed (pip install -e '.[envpool]')")


@needs_atari
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("algo", "batch"), [("a2c", 16 * 5), ("impala", 8 * 80)])
def test_a_preset_is_measured_with_its_model_on_its_envs(algo, batch):
    setup = getattr(tuning, algo)(preset="atari")
    assert setup.env_id == "PongNoFrameskip-v4" and setup.batch_size == batch
    assert setup.env_args["frame_stack"] == 4 and "n_envs" not in setup.env_args
    assert any(w.dim() == 4 for w in setup.weights.values())  # the Nature CNN's convolutions
    traj, trained = learn_on_one_batch(setup, n_timesteps=5)
    assert traj.lengths.tolist() == [5, 5]
    assert traj.trajectories["observation/frame"].dtype == torch.uint8
    assert trained


@needs_envpool
def test_the_envpool_backend_is_measured_with_one_thread_a_worker():
    from rlstruct.envs.envpool import EnvPoolEnv

    setup = tuning.ppo(preset="atari", env_backend="envpool", env_id="PongNoFrameskip-v4")
    assert setup.create_env is EnvPoolEnv
    assert setup.env_args["env"] == "Pong-v5" and setup.env_args["num_threads"] == 1
    assert setup.env_args["use_fire_reset"] is False


def test_a_backend_that_cannot_play_the_id_is_refused_before_anything_is_built(capsys):
    with pytest.raises(ConfigError, match="--env-backend envpool"):
        tuning.ppo(env_backend="envpool")  # CartPole-v1: not an ALE id
    with pytest.raises(ConfigError, match="preset 'pong'"):
        tuning.ppo(preset="pong")
    assert main(["--algo", "rlstruct.algos.tuning:ppo", "--env-backend", "envpool",
                 "--budget", "1"]) == 2
    assert "--env-backend envpool" in capsys.readouterr().err


@needs_atari
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_rlstruct_tune_writes_a_layout_for_an_atari_preset(tmp_path, capsys):
    out = tmp_path / "tune.json"
    code = main(["--algo", "rlstruct.algos.tuning:a2c", "--preset", "atari", "--processes",
                 "1,2", "--n-envs", "4,8", "--n-threads", "1", "--pipeline", "1",
                 "--devices", "none", "--budget", "20", "--probe-s", "1", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    tuned = read_layout(out)
    assert tuned.layout.n_processes * tuned.layout.n_envs * tuned.n_timesteps == 80  # kept
    assert tuned.tuned["steps_per_s"] > 0 and tuned.tuned["learner"] == "algorithm"
    assert tuned.env_backend == "atari"  # measured there: --layout FILE trains there
    cfg = a2c.Config.from_preset("atari", env_backend="gymnasium", env_id="CartPole-v1")
    apply_layout(cfg, out)
    assert cfg.env_backend == "atari" and cfg.n_timesteps == tuned.n_timesteps


def test_a_layout_file_carries_its_env_backend(tmp_path):
    pick = TunedLayout(LayoutConfig(n_processes=2, n_envs=4), 16, {}, 2, "envpool")
    assert read_layout(write_layout(tmp_path / "t.json", pick)) == pick
    plain = TunedLayout(LayoutConfig(), 8)
    written = write_layout(tmp_path / "p.json", plain)
    assert "env_backend" not in json.loads(written.read_text())
    cfg = a2c.Config(env_backend="atari")
    apply_layout(cfg, written)  # a file without a backend leaves the run's
    assert cfg.env_backend == "atari"
    (tmp_path / "bad.json").write_text(json.dumps({"env_backend": "ale"}))
    with pytest.raises(ConfigError, match=r"env_backend must be one of .*'ale'"):
        read_layout(tmp_path / "bad.json")


def test_a_layout_file_takes_the_backends_a_run_takes():
    hints = get_type_hints(RunConfig)
    assert set(get_args(hints["env_backend"])) == set(ENV_BACKENDS)
