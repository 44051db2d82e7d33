"""A run from the command line: config checks before anything starts (exit code 2), custom envs
from a module of the user's, SIGTERM, and ``python -m rlstruct --help``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from support.algo_runs import evaluated_rows, read_rows

from rlstruct.errors import ConfigError
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import Resolved, resolve
from rlstruct.runs.run import RunConfig

CORRIDOR = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np

    class Corridor(gym.Env):
        observation_space = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.x = 0
            return np.eye(4, dtype=np.float32)[0], {}

        def step(self, action):
            self.x = min(max(self.x + (1 if action == 1 else -1), 0), 3)
            return np.eye(4, dtype=np.float32)[self.x], float(self.x == 3), self.x == 3, False, {}

    gym.register("TmpCorridor-v0", entry_point=Corridor, max_episode_steps=20)
''')


def python(args: list[str], cwd: Path, extra_path: Path | None = None, timeout: float = 120):
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


# ----------------------------------------------------------------------------- config checks
def test_every_config_problem_is_listed_at_once_before_any_folder(tmp_path):
    with pytest.raises(ConfigError) as info:
        resolve(RunConfig(env_id="CartPole-v2", lr=-0.001, time_budget=-5,
                          runs_dir=str(tmp_path / "r"), layout=LayoutConfig(n_envs=0, pipeline=0)))
    message = str(info.value)
    assert message.startswith("5 problem(s) in the config")
    for text in ("lr must be a finite number > 0, got -0.001", "time_budget must be > 0",
                 "n_envs must be >= 1, got 0", "pipeline must be >= 1",
                 "env_id 'CartPole-v2' is not registered", "did you mean 'CartPole-v1'"):
        assert text in message
    assert not (tmp_path / "r").exists()


def test_an_algorithms_own_problems_are_listed_with_the_shared_ones():
    from rlstruct.algos import impala, ppo

    with pytest.raises(ConfigError) as info:
        resolve(ppo.Config(lr=0.0, n_epochs=0))
    assert "2 problem(s)" in str(info.value) and "n_epochs >= 1" in str(info.value)
    with pytest.raises(ConfigError, match=r"(?s)2 problem\(s\).*gamma.*--pipeline >= 2"):
        resolve(impala.Config(gamma=2.0, layout=LayoutConfig(pipeline=1)))


def test_env_modules_and_backends_are_checked_too():
    with pytest.raises(ConfigError, match=r"env_module 'no_such_pkg\.envs' cannot be imported"):
        resolve(RunConfig(env_module=("no_such_pkg.envs",)))
    with pytest.raises(ConfigError, match="its module cannot be imported"):
        resolve(RunConfig(env_id="no_such_pkg.envs:Thing-v0"))
    with pytest.raises(ConfigError, match="no torch-native version"):
        resolve(RunConfig(env_id="Taxi-v3", env_backend="torch"))


@pytest.mark.slow
def test_the_command_line_exits_with_2_and_creates_nothing(tmp_path):
    done = python(["-m", "rlstruct.algos.ppo", "--env-id", "Cartpole-v1", "--n-envs", "0", "--lr",
                   "-0.001", "--time-budget", "-5"], cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    for text in ("4 problem(s)", "lr must be", "time_budget", "n_envs", "'CartPole-v1'"):
        assert text in done.stderr
    assert list(tmp_path.iterdir()) == []  # no runs/ folder


# ----------------------------------------------------------------------------- custom envs
@pytest.mark.slow
@pytest.mark.parametrize("form", ["--env-module", "module:Id"])
def test_a_custom_env_trains_and_evaluates_from_the_command_line(tmp_path, form):
    (tmp_path / "tmp_corridor.py").write_text(CORRIDOR)
    flags = ["--env-module", "tmp_corridor", "--env-id", "TmpCorridor-v0"]
    if form == "module:Id":
        flags = ["--env-id", "tmp_corridor:TmpCorridor-v0"]
    done = python(["-m", "rlstruct.algos.ppo", *flags, "--target-return", "None", "--max-frames",
                   "30000", "--eval-every", "1", "--n-epochs", "2", "--n-processes", "2"],
                  cwd=tmp_path, extra_path=tmp_path, timeout=150)
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "budget" and summary["frames"] >= 30000
    evaluated = evaluated_rows(read_rows(run_dir / "progress.csv"))
    assert evaluated, "no evaluation finished: the evaluation worker could not build the env"
    assert 0.0 <= float(evaluated[-1]["eval_return"]) <= 1.0


# ----------------------------------------------------------------------------- SIGTERM
@pytest.mark.slow
def test_sigterm_ends_the_run_like_ctrl_c(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlstruct.algos.ppo", "--target-return", "None", "--max-frames",
         "100000000", "--time-budget", "120", "--checkpoint-every", "1000"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not list(tmp_path.glob("runs/*/progress.csv")):
            assert time.monotonic() < deadline and proc.poll() is None, "no progress row"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        for child in psutil.Process().children(recursive=True):
            if child.pid == proc.pid or proc.pid in [p.pid for p in child.parents()]:
                child.kill()
        proc.kill()
        proc.wait(10)
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "SIGTERM" in summary["error"], err
    assert "stopped by interrupted" in out and took < 30
    # A graceful stop: exit code 0 (Slurm: COMPLETED), one line, no traceback.
    assert proc.returncode == 0 and "Traceback" not in err, err
    rows = read_rows(run_dir / "progress.csv")
    assert int(rows[-1]["frames"]) == summary["frames"]
    import torch

    assert torch.load(run_dir / "checkpoints" / "latest.pt")["frames"] == summary["frames"]


# ----------------------------------------------------------------------------- --help
COMMANDS = ("train", "evaluate", "plot", "export", "sweep", "tune")


def help_of(argv: list[str], capsys) -> str:
    from rlstruct.__main__ import main

    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def test_help_lists_every_command(capsys):
    out = help_of([], capsys)
    assert out.startswith("usage: rlstruct ")
    for command in COMMANDS:
        assert f"• {command} " in out


def test_train_help_lists_every_algorithm(capsys):
    from rlstruct.__main__ import ALGOS

    out = help_of(["train"], capsys)
    assert out.startswith("usage: rlstruct train ")
    for algo in ALGOS:
        assert f"• {algo} " in out
    assert "rlstruct/algos/" not in out  # the commands, not the files


def test_algos_lists_every_algorithm_file():
    from rlstruct.__main__ import ALGOS

    folder = Path(__file__).resolve().parents[2] / "rlstruct" / "algos"
    files = {p.stem for p in folder.glob("*.py") if "\ndef main(" in p.read_text()}
    assert set(ALGOS) == files


def test_train_algo_help_is_the_algorithms_own(capsys):
    from rlstruct.algos import ppo
    from rlstruct.runs.resolve import parse

    out = help_of(["train", "ppo"], capsys)
    with pytest.raises(SystemExit):  # what python -m rlstruct.algos.ppo --help prints
        parse(ppo.Config, args=["--help"], prog="python -m rlstruct.algos.ppo")
    own = capsys.readouterr().out
    assert out.startswith("usage: rlstruct train ppo [-h] [OPTIONS]")
    assert own.startswith("usage: python -m rlstruct.algos.ppo [-h] [OPTIONS]")
    assert out.splitlines()[1:] == own.splitlines()[1:]
    assert "--clip-coef" in out and "--n-processes" in out and "rlstruct/algos/ppo.py" not in out
    assert "presets (--preset NAME" in out and "  atari: " in out


@pytest.mark.parametrize("command", ["evaluate", "plot", "export", "sweep", "tune"])
def test_each_commands_help_names_the_command(command, capsys):
    out = help_of([command], capsys)
    assert out.startswith(f"usage: rlstruct {command} ")
    assert "python -m rlstruct " not in out and ".py" not in out


@pytest.mark.parametrize("argv, message", [
    ([], "Expected one of {train, evaluate, plot, export, sweep, tune}"),
    (["bogus"], "Unrecognized options: bogus"),
    (["train"], "Expected one of {reinforce, a2c, ppo"),
    (["train", "nope"], "Unrecognized options: nope"),
    (["train", "ppo", "--no-such-flag"], "rlstruct train ppo --help"),
    (["train", "ppo", "--lr", "-1"], "lr must be a finite number > 0"),
    (["evaluate"], "rlstruct evaluate"),
    (["evaluate", ".", "--episodes", "0"], "rlstruct evaluate: error: --episodes must be >= 1"),
    (["plot"], "rlstruct plot: error: give at least one PATH"),
    (["export", ".", "--format", "tflite"], "rlstruct export"),
    (["sweep", "ppo", "--trials", "[1]"], "rlstruct sweep: error: --trials must be a JSON list"),
    (["sweep", "nope"], "rlstruct sweep: error: sweep: no algorithm 'nope'"),
    (["tune", "--algo", "a:b", "--vary-batch", "--batch-size", "8"], "exclude each other"),
])
def test_usage_errors_exit_with_2_and_one_message(argv, message, capsys, tmp_path,
                                                   monkeypatch):
    from rlstruct.__main__ import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        code = main(argv)
        raise SystemExit(code)  # tune reports its usage errors as a returned 2
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert "python -m rlstruct" not in err
    assert list(tmp_path.iterdir()) == []  # nothing was written


def test_importing_the_command_line_and_its_help_import_no_algorithm_nor_torch():
    """``rlstruct --help`` took 4-5 s on a loaded machine: it imported the eight algorithms and
    had tyro parse every Config, and ``import rlstruct`` imported torch and gymnasium (issue
    38); it shows the commands without them (the package's names load at first use)."""
    heavy = "sorted(m for m in sys.modules if m.startswith(('rlstruct.algos.', 'torch', 'gym')))"
    code = ("import contextlib, io, sys, rlstruct.__main__ as cli\n"
            f"print({heavy})\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out, "
            "contextlib.suppress(SystemExit):\n    cli.main(['--help'])\n"
            f"print({heavy})\n"
            "print('help lists train:', '• train ' in out.getvalue())\n"
            "import rlstruct\n"
            "print(rlstruct.DictTensor.__module__, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "[]", "help lists train: True",
                                        "rlstruct.dicttensor True"], done.stdout


def test_train_runs_the_algorithms_main_with_its_config(monkeypatch):
    from rlstruct.__main__ import main
    from rlstruct.algos import a2c, ppo

    seen = []
    monkeypatch.setattr(ppo, "main", seen.append)
    monkeypatch.setattr(a2c, "main", lambda cfg: pytest.fail("the wrong algorithm ran"))
    assert main(["train", "ppo", "--seed", "7", "--n-epochs", "3", "--n-envs", "4"]) == 0
    (resolved,) = seen  # resolved once by the command line, handed to main as it is
    assert type(resolved) is Resolved and type(resolved.cfg) is ppo.Config
    cfg = resolved.cfg
    assert (cfg.seed, cfg.n_epochs, cfg.layout.n_envs) == (7, 3, 4)


@pytest.mark.slow
def test_the_console_script_and_python_m_rlstruct_train_ppo(tmp_path):
    script = Path(sys.executable).with_name("rlstruct")
    if not script.is_file():
        pytest.skip(f"no console script {script}: pip install -e . installs it")
    listed = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0 and all(f"• {c} " in listed.stdout for c in COMMANDS)
    flags = ["--seed", "1", "--max-frames", "600", "--n-processes", "1", "--eval-every", "0",
             "--target-return", "None"]
    for i, command in enumerate([[str(script)], [sys.executable, "-m", "rlstruct"]]):
        cwd = tmp_path / str(i)
        cwd.mkdir()
        done = subprocess.run([*command, "train", "ppo", *flags], cwd=cwd, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        (run_dir,) = (cwd / "runs").iterdir()
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["algo"] == "ppo" and summary["status"] == "budget"
        assert json.loads((run_dir / "config.json").read_text())["config"]["seed"] == 1


# ----------------------------------------------------------------------------- resume
@pytest.mark.slow
def test_ppo_resumed_after_its_time_budget_carries_on_learning(tmp_path):
    import torch

    flags = ["-m", "rlstruct.algos.ppo", "--target-return", "None", "--eval-every", "0",
             "--n-processes", "1"]
    # A frame cap no machine reaches in 12 s, so the first run ends on its time budget.
    first = python([*flags, "--max-frames", "3000000", "--time-budget", "12"], cwd=tmp_path,
                   timeout=150)
    assert first.returncode == 0, first.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    before = json.loads((run_dir / "summary.json").read_text())
    assert before["status"] == "budget" and before["stopped_by"] == "time_budget"
    steps_before = torch.load(run_dir / "checkpoints" / "latest.pt")["optimizer"]["state"][0]
    goal = before["frames"] + 10_000  # the resumed run may change its budgets
    second = python([*flags, "--max-frames", str(goal), "--time-budget", "60", "--resume",
                     str(run_dir)], cwd=tmp_path, timeout=150)
    assert second.returncode == 0, second.stderr
    after = json.loads((run_dir / "summary.json").read_text())
    assert after["resumes"] == 1 and after["frames"] >= goal > before["frames"]
    rows = read_rows(run_dir / "progress.csv")
    frames = [int(r["frames"]) for r in rows]
    assert frames == sorted(frames) and before["frames"] in frames
    resumed = [r for r in rows if int(r["frames"]) > before["frames"]]
    # The lr schedule goes on from the frame count: lr = lr0 (1 - frames / max_frames).
    first_lr = float(resumed[0]["lr"])
    assert first_lr < float(rows[frames.index(before["frames"]) - 1]["lr"])
    steps_after = torch.load(run_dir / "checkpoints" / "latest.pt")["optimizer"]["state"][0]
    assert int(steps_after["step"]) > int(steps_before["step"])  # Adam's state went on
    episodes = read_rows(run_dir / "episodes.csv")
    early = [float(e["return"]) for e in episodes[:20]]
    resumed_eps = [float(e["return"]) for e in episodes
                   if int(e["frames_at_record"]) > before["frames"]][:20]
    # The policy after the resume is the trained one, not a fresh random one (~20 per episode).
    assert sum(resumed_eps) / 20 > 2 * sum(early) / 20


@pytest.mark.slow
def test_the_custom_env_example_runs(tmp_path):
    example = Path(__file__).resolve().parents[2] / "examples" / "corridor.py"
    done = python([str(example)], cwd=tmp_path, timeout=150)
    assert done.returncode == 0, done.stderr
    assert "status solved" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)  # past its run's own 240 s: a loaded machine once took over 120 s
def test_a_custom_env_module_reaches_ray_actors(tmp_path):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    (tmp_path / "tmp_corridor.py").write_text(CORRIDOR)
    done = python(["-m", "rlstruct.algos.ppo", "--env-module", "tmp_corridor", "--env-id",
                   "TmpCorridor-v0", "--backend", "ray", "--n-processes", "2", "--eval-every",
                   "0", "--target-return", "None", "--max-frames", "3000"],
                  cwd=tmp_path, extra_path=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "budget"


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("algo", ["reinforce", "a2c", "ppo", "dqn", "impala", "appo", "trpo",
                                  "sac", "ppo --n-learners 2", "sac --n-learners 2"])
def test_every_algorithms_checkpoint_is_evaluated_from_the_command_line(algo, tmp_path):
    # The model is rebuilt from the checkpoint alone: its recorded constructor must be
    # importable (a class of `python -m rlstruct.algos.x` lives in __main__) and take plain
    # values. A learner group's checkpoint holds rank 0's model under the same name, rebuilt
    # the same way (SAC's: the actor's part of its learner nets).
    algo, *extra = algo.split()
    frames = "600" if algo == "sac" else "2000"
    processes = "2" if algo in ("impala", "appo") else "1"  # pipelined: worker processes
    trained = python(["-m", "rlstruct", "train", algo, "--max-frames", frames, "--eval-every", "0",
                      "--n-processes", processes, "--target-return", "None", *extra],
                     cwd=tmp_path, timeout=150)
    assert trained.returncode == 0, trained.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    done = python(["-m", "rlstruct", "evaluate", str(run_dir), "--episodes", "2"], cwd=tmp_path,
                  timeout=60)
    assert done.returncode == 0, done.stderr
    assert "2 greedy episodes, return" in done.stdout


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_evaluate_on_a_device_the_machine_lacks_is_a_usage_error(tmp_path, capsys):
    from rlstruct.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["evaluate", str(tmp_path), "--device", "cuda"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "rlstruct evaluate: error: --device: device 'cuda': CUDA is not available" in err
