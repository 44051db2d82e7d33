"""The algorithms' typed configs and their command lines (tyro).

- every field of every config has a docstring: it is the ``--help`` text of its flag;
- flags parse into the typed dataclass, the nested layout keeps its short flag names, and a
  misspelt flag, a bad value or a bad combination exits with code 2 and says why;
- the whole config (nested layout included) goes into config.json and comes back equal;
- ``python -m rlstruct.algos.<name> --help`` and ``rlstruct train <name> --help`` work from any
  folder once rlstruct is installed, and name the command, not the file.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys

import pytest
import tyro
from support.docstrings import field_docs

from rlstruct.algos import a2c, appo, dqn, impala, ppo, reinforce, sac, trpo
from rlstruct.errors import ConfigError
from rlstruct.runs.config import config_to_dict
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import parse, resolve
from rlstruct.runs.run import RunConfig

ALGOS = {"ppo": ppo, "a2c": a2c, "dqn": dqn, "reinforce": reinforce, "impala": impala,
         "trpo": trpo, "sac": sac, "appo": appo}


@pytest.mark.parametrize("cls", [LayoutConfig, RunConfig, *(m.Config for m in ALGOS.values())])
def test_every_field_has_a_docstring(cls):
    docs = field_docs(cls)  # what the API reference and --help show for each field
    missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
    assert not missing, f"{cls.__qualname__}: fields without a docstring (no --help): {missing}"


@pytest.mark.parametrize("name", ALGOS)
def test_no_flags_give_the_defaults_and_every_flag_is_in_the_help(name, capsys):
    cls = ALGOS[name].Config
    assert tyro.cli(cls, args=[]) == cls()
    with pytest.raises(SystemExit) as info:
        tyro.cli(cls, args=["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for field in dataclasses.fields(cls):
        if field.name != "layout":
            assert f"--{field.name.replace('_', '-')}" in text
    for field in dataclasses.fields(LayoutConfig):  # nested, without a "layout." prefix
        assert f"--{field.name.replace('_', '-')}" in text
    assert "--layout." not in text and "(default: " in text
    assert "Adam learning rate" in text and "0: no clipping" in text


def test_flags_parse_into_the_typed_config():
    cfg = tyro.cli(ppo.Config, args=[
        "--target-return", "None", "--lr", "3e-4", "--no-anneal-lr", "--adv-norm", "batch",
        "--n-processes", "1", "--learner-device", "cpu", "--check-devices", "--seed", "3",
    ])
    assert cfg.target_return is None and cfg.lr == 3e-4 and cfg.anneal_lr is False
    assert cfg.adv_norm == "batch" and cfg.seed == 3
    assert cfg.layout == LayoutConfig(learner_device="cpu", n_processes=1, check_devices=True)
    assert tyro.cli(a2c.Config, args=["--model", "mlp-gru"]).model == "mlp-gru"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lrr", "1"], "--lrr"),
        (["--n-epochs", "two"], "--n-epochs"),
        (["--adv-norm", "sometimes"], "sometimes"),
        (["--minibatch-size", "0"], "minibatch_size >= 1"),
        (["--target-window", "0"], "target_window must be >= 1"),
    ],
)
def test_bad_command_lines_exit_2_and_say_why(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        parse(ppo.Config, args=args)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_appo_config_lists_every_problem_and_its_command_line_exits_2(capsys):
    with pytest.raises(ConfigError) as err:
        resolve(appo.Config(layout=LayoutConfig(pipeline=1), queue=-1, clip_coef=1.5, c_bar=0.0))
    for message in ("queue must be >= 0 (0: no learner thread), got -1", "c_bar must be > 0",
                    "clip_coef must be in (0, 1), got 1.5", "need --pipeline >= 2, got 1"):
        assert message in str(err.value)
    with pytest.raises(SystemExit) as info:
        parse(appo.Config, args=["--queue", "-1"])
    assert info.value.code == 2 and "queue" in capsys.readouterr().err


@pytest.mark.parametrize("name", ALGOS)
def test_the_whole_config_is_saved_and_comes_back_equal(name):
    cls = ALGOS[name].Config
    layout = dataclasses.replace(cls().layout, n_envs=3, eval_device="cuda:1")
    cfg = cls(seed=5, layout=layout)
    saved = json.loads(json.dumps(config_to_dict(cfg)))
    assert saved["layout"]["n_envs"] == 3 and saved["seed"] == 5
    assert cls(**{**saved, "layout": LayoutConfig(**saved["layout"])}) == cfg


def test_the_algorithms_share_the_defaults_of_the_run_config():
    for name, module in ALGOS.items():
        cfg = module.Config()
        # SAC collects its 4 envs in the learner's process: beside a gradient step per frame,
        # collection costs little and workers would mostly add their start-up; 4 envs end
        # episodes often enough for the 20-episode stop test (16 end them in waves of 16).
        # APPO learns 10 epochs on 2 x 16 envs: half PPO's gradient steps per frame, in about
        # as many frames, and cheaper frames (docs/algorithms.md, "Where APPO's time goes").
        layout = (LayoutConfig(n_processes=1, n_envs=4) if name == "sac"
                  else LayoutConfig(pipeline=2, n_envs=16) if name == "appo"
                  else LayoutConfig(pipeline=2 if name == "impala" else 1))  # async
        assert cfg.layout == layout
        assert cfg.target_window == 20
        # The CartPole algorithms stop at 475; TRPO's and SAC's defaults are Pendulum's.
        target = {"trpo": -250.0, "sac": -200.0}.get(name, 475.0)
        pendulum = name in ("trpo", "sac")
        assert cfg.target_return == target and (cfg.env_id == "Pendulum-v1") == pendulum


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ALGOS)
def test_help_from_any_folder(name, tmp_path):
    """``python -m rlstruct.algos.NAME --help`` from another folder (a subprocess per algorithm);
    ``rlstruct train NAME --help`` prints the same lines under its own usage line (in-process,
    ``test_train_help_is_the_algorithms_own``; as a subprocess from another folder:
    tests/tools/test_run_cli.py's console-script test)."""
    prog = f"python -m rlstruct.algos.{name}"
    done = subprocess.run([sys.executable, "-m", f"rlstruct.algos.{name}", "--help"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {prog} [-h]") and "--learner-device" in done.stdout
    assert inspect.getdoc(ALGOS[name].Config).split("\n")[0][:40] in done.stdout
    assert ".py" not in done.stdout.split("\n", 1)[0]


@pytest.mark.parametrize("name", ALGOS)
def test_train_help_is_the_algorithms_own(name, capsys):
    from rlstruct.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["train", name, "--help"])
    assert info.value.code == 0
    train = capsys.readouterr().out
    with pytest.raises(SystemExit):
        parse(ALGOS[name].Config, args=["--help"], prog=f"python -m rlstruct.algos.{name}")
    own = capsys.readouterr().out
    assert train.startswith(f"usage: rlstruct train {name} [-h]")
    assert train.splitlines()[1:] == own.splitlines()[1:]
    assert inspect.getdoc(ALGOS[name].Config).split("\n")[0][:40] in train


@pytest.mark.parametrize("name", ["dqn", "reinforce", "appo"])
def test_an_algorithm_without_learner_ranks_refuses_them(name, monkeypatch):
    """DQN, REINFORCE and APPO learn in one process: --n-learners, --learner-devices, the Ray
    learner backend and torchrun are refused with the algorithm's name, never ignored."""
    config, layout = ALGOS[name].Config, LayoutConfig
    for fields in ({"n_learners": 2}, {"learner_devices": "cpu"}):
        with pytest.raises(ConfigError, match=f"{name} learns in one process"):
            resolve(config(layout=layout(**fields)))
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it on every rank
    with pytest.raises(ConfigError, match=r"torchrun \(WORLD_SIZE=2\)"):
        resolve(config())
    monkeypatch.delenv("WORLD_SIZE")
    resolve(config())  # the default layout has one learner
    resolve(ppo.Config(layout=layout(n_learners=2)))  # an algorithm with learner ranks takes them
