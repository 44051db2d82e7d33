"""rlstruct/runs/presets.py and the algorithms' presets (rlstruct/algos/presets.py): every preset
builds a valid config, ``--preset`` on the command line gives its values as defaults that any
flag overrides, per-env values, errors, the help, and the record in config.json."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import ClassVar

import pytest

from rlstruct.algos import a2c, appo, dqn, impala, ppo, reinforce, sac, trpo
from rlstruct.errors import ConfigError
from rlstruct.runs.presets import preset_in_args
from rlstruct.runs.resolve import parse, resolve

ALGOS = [a2c, appo, dqn, impala, ppo, reinforce, sac, trpo]
PRESETS = [(m, name, env) for m in ALGOS for name, p in m.Config.presets.items()
           for env in [None, *p.per_env]]


def test_the_issue_s_presets_exist():
    assert {a.__name__.rsplit(".", 1)[1]: sorted(a.Config.presets) for a in ALGOS
            if a.Config.presets} == {"ppo": ["atari", "atari-fast", "atari-lstm", "mujoco"],
                                     "appo": ["atari"], "dqn": ["atari"], "impala": ["atari"],
                                     "sac": ["mujoco"], "trpo": ["mujoco"], "a2c": ["atari"]}


@pytest.mark.parametrize(("algo", "name", "env"), PRESETS,
                         ids=[f"{m.__name__.rsplit('.', 1)[1]}-{n}-{e}" for m, n, e in PRESETS])
def test_every_preset_builds_a_config_without_problems(algo, name, env):
    overrides = {} if env is None else {"env_id": env}
    cfg = algo.Config.from_preset(name, **overrides)
    assert cfg.preset == name and cfg.problems() == []
    preset = algo.Config.presets[name]
    for key, value in {**preset.values_for(cfg.env_id), **overrides}.items():
        holder = cfg if hasattr(cfg, key) else cfg.layout
        assert getattr(holder, key) == value, key


#: Wall seconds a frame costs, measured on the 2-core development machine (docs/algorithms.md):
#: SAC on Hopper-v5 20 ms of CPU a frame on one core; PPO on HalfCheetah-v5 1M frames in about
#: 850 s; PPO on ALE/Pong-v5 about 650 agent steps/s.
MEASURED_S_PER_FRAME = [(sac, "mujoco", "Hopper-v5", 0.020), (ppo, "mujoco", None, 850 / 1e6),
                        (ppo, "atari", None, 1 / 650)]


@pytest.mark.parametrize(("algo", "name", "env", "cost"), MEASURED_S_PER_FRAME)
def test_a_preset_s_time_budget_leaves_room_for_its_frames(algo, name, env, cost):
    # The budget guards a run; the frames stop it. With twice the measured cost a frame (a busy
    # machine) the preset's frames still fit: a 2-hour SAC budget once stopped 300k-frame runs.
    cfg = algo.Config.from_preset(name, **({} if env is None else {"env_id": env}))
    assert cfg.time_budget >= 2 * cost * cfg.max_frames, (cfg.time_budget, cfg.max_frames)


def test_the_big_batch_preset_changes_the_batch_and_nothing_else_that_learns():
    # ``atari-fast`` claims ``atari``'s settings; it once annealed its learning rate over 2M
    # steps instead of 10M (max_frames sets the schedule), and two seeds of three stalled.
    fast, atari = (ppo.Config.from_preset(name) for name in ("atari-fast", "atari"))
    differ = {f.name for f in dataclasses.fields(fast) if getattr(fast, f.name) !=
              getattr(atari, f.name)}
    assert differ == {"preset", "env_id", "n_timesteps", "layout"}
    assert (fast.layout.n_processes * fast.layout.n_envs, fast.minibatch_size) == (60, 256)


def test_overrides_win_and_per_env_values_refine_the_preset():
    cheetah = ppo.Config.from_preset("mujoco")
    hopper = ppo.Config.from_preset("mujoco", env_id="Hopper-v5", seed=4)
    assert (cheetah.env_id, cheetah.n_epochs, cheetah.gamma) == ("HalfCheetah-v5", 20, 0.98)
    assert (hopper.n_epochs, hopper.gamma, hopper.seed, hopper.hidden) == (10, 0.995, 4, 64)
    assert ppo.Config.from_preset("atari", n_epochs=8).n_epochs == 8


def test_unknown_presets_and_fields_raise_config_errors():
    with pytest.raises(ConfigError,
                       match=r"no preset 'pong'; its presets: atari, atari-fast, atari-lstm, "):
        ppo.Config.from_preset("pong")
    with pytest.raises(ConfigError, match="its presets: none"):
        reinforce.Config.from_preset("atari")
    bad = dataclasses.replace(ppo.Config.presets["atari"], values={"n_epoch": 3})
    with pytest.raises(ConfigError, match=r"sets \['n_epoch'\], which are not fields"):
        _build_with(bad)
    with pytest.raises(ConfigError, match="preset 'nope' is not one of the algorithm's"):
        resolve(ppo.Config(preset="nope"))


def _build_with(preset):
    class Config(ppo.Config):
        presets: ClassVar[dict] = {"x": preset}
    return Config.from_preset("x")


def test_preset_in_args_reads_both_spellings_and_refuses_a_missing_name():
    assert preset_in_args(["--seed", "1", "--preset", "atari"]) == "atari"
    assert preset_in_args(["--preset=mujoco", "--n-epochs", "3"]) == "mujoco"
    assert preset_in_args(["--preset", "None"]) is None and preset_in_args([]) is None
    with pytest.raises(ConfigError, match="--preset needs a name"):
        preset_in_args(["--preset", "--seed", "1"])


def test_the_command_line_applies_a_preset_and_every_flag_overrides_it():
    pytest.importorskip("mujoco", reason="needs the mujoco extra: pip install -e '.[mujoco]'")
    cfg = parse(ppo.Config, ["--preset", "mujoco", "--env-id", "Hopper-v5", "--n-epochs", "7"]).cfg
    assert (cfg.preset, cfg.env_id, cfg.n_epochs, cfg.gamma) == ("mujoco", "Hopper-v5", 7, 0.995)
    before = parse(ppo.Config, ["--lr", "1e-4", "--preset", "mujoco"]).cfg
    assert before.lr == 1e-4 and before.n_epochs == 20  # a flag before --preset wins too
    sac_cfg = parse(sac.Config, ["--preset", "mujoco", "--batch-size", "64"]).cfg
    assert (sac_cfg.env_id, sac_cfg.batch_size, sac_cfg.hidden) == ("Hopper-v5", 64, 256)


@pytest.mark.parametrize(("args", "message"), [
    (["--preset", "pong"], "no preset 'pong'; its presets: atari, atari-fast, atari-lstm, mujoco"),
    (["--preset"], "--preset needs a name"),
])
def test_bad_presets_exit_2_with_one_message(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        parse(ppo.Config, args=args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_help_lists_each_preset(capsys):
    with pytest.raises(SystemExit) as info:
        parse(ppo.Config, args=["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "presets (--preset NAME" in out
    for name, preset in ppo.Config.presets.items():
        assert f"{name}: {preset.about[:40]}" in " ".join(out.split())


@pytest.mark.slow  # a worker process
def test_config_json_records_the_preset(tmp_path: Path):
    cfg = ppo.Config.from_preset("mujoco", env_id="Pendulum-v1", max_frames=512,
                                 n_epochs=1, runs_dir=str(tmp_path))
    summary = ppo.main(cfg)
    recorded = json.loads((Path(summary["run_dir"]) / "config.json").read_text())["config"]
    assert recorded["preset"] == "mujoco" and recorded["normalize_reward"] is True
    assert recorded["hidden"] == 256 and recorded["activation"] == "relu"
