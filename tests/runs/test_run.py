"""rlstruct.runs.run: RunConfig checks, and a Run's set-up, stop test, outputs, summary and
teardown.

The loops below train nothing: a fixed agent on ``rlstruct/Repeat-v0`` (10-step episodes,
reward 1 per repeated symbol) in one process (``n_processes=1``), so every number is known.
Evaluation is replaced by a fake evaluator to check the wiring row by row; the real one (a worker
process) is tested in tests/runs/test_evaluation.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from support.algo_runs import check_run_dir, evaluated_rows, read_rows

import rlstruct.runs.run as run_module
from rlstruct import Agent, DictTensor
from rlstruct.envs import GymEnvInf
from rlstruct.errors import BatcherStateError, CheckpointError, ConfigError
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.logger import git_commit
from rlstruct.runs.resolve import resolve
from rlstruct.runs.run import Run, RunConfig, env_dims, env_spaces

REPEAT = "rlstruct/Repeat-v0"


class Repeater(Agent):
    """Repeats the observed symbol (return 10 per episode) unless ``wrong``: then 0."""

    def __init__(self, model: torch.nn.Module, wrong: bool = False) -> None:
        self.model, self.wrong = model, wrong

    def __call__(self, state, observation, agent_info):
        action = observation["frame"].argmax(-1)
        return DictTensor({"action": 1 - action if self.wrong else action}), state


@dataclass
class Cfg(RunConfig):
    """A test config."""

    wrong: bool = False
    """play the wrong symbol"""


def config(tmp_path: Path, **kw) -> Cfg:
    kw.setdefault("layout", LayoutConfig(learner_device="cpu", n_processes=1, n_envs=2))
    kw.setdefault("eval_every", 0)
    kw.setdefault("env_id", REPEAT)
    kw.setdefault("progress_every_s", 0.0)  # a row every iteration (the tests count them)
    return Cfg(n_timesteps=5, runs_dir=str(tmp_path / "runs"), **kw)


def train(cfg: Cfg, fail_at: int | None = None, error: type[BaseException] = KeyboardInterrupt):
    """A loop as the algorithms write it; ``fail_at`` raises ``error`` in that iteration."""
    with Run("test", cfg) as run:
        model = run.model(torch.nn.Linear, 2, 2)
        batcher = run.training_batcher(Repeater, {"model": model, "wrong": cfg.wrong},
                                       GymEnvInf, cfg.n_timesteps)
        run.evaluator(Repeater, {"model": model, "wrong": cfg.wrong})
        run.learner(Repeater(model))
        run.checkpoint_state(model=model)
        for traj in run.segments(batcher):
            assert traj.n_elems() == 2 and traj.trajectories.n_timesteps() == 5
            if run.iteration == fail_at:
                raise error
            with torch.no_grad():  # "learning": the bias counts the iterations
                model.bias += 1.0
            batcher.update(model.state_dict())
            batcher.execute()
            run.end_iteration(model.state_dict(), loss=float(run.iteration + 1))
    return run


@pytest.fixture(autouse=True)
def _outside_any_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


# ----------------------------------------------------------------------------- RunConfig
def test_run_config_lists_every_bad_field():
    with pytest.raises(ConfigError) as info:
        resolve(RunConfig(target_window=0, eval_every=-1, max_grad_norm=-1.0, n_threads=0))
    message = str(info.value)
    for name in ("target_window", "eval_every", "max_grad_norm", "n_threads"):
        assert name in message


def test_env_dims_and_discrete_actions_only():
    assert env_dims("CartPole-v1") == (4, 2)
    assert env_dims(REPEAT) == (2, 2)
    with pytest.raises(ConfigError, match="Pendulum-v1 has actions Box"):
        env_dims("Pendulum-v1")


def test_the_run_describes_box_action_spaces_on_both_backends(tmp_path):
    for backend in ("gymnasium", "torch"):
        shape, space = env_spaces("Pendulum-v1", backend)
        assert shape == (3,) and isinstance(space, gym.spaces.Box) and space.shape == (1,)
        assert float(space.high[0]) == 2.0
    with pytest.raises(ConfigError, match="no torch-native version of 'Hopper-v5'"):
        env_spaces("Hopper-v5", "torch")
    cfg = Cfg(env_id="Pendulum-v1", env_backend="torch", runs_dir=str(tmp_path / "runs"),
              eval_every=0, layout=LayoutConfig(learner_device="cpu", n_processes=1, n_envs=2))
    with Run("dqn", cfg) as run:
        assert isinstance(run.action_space, gym.spaces.Box) and run.obs_dim == 3
        with pytest.raises(ConfigError, match="dqn needs Discrete actions; Pendulum-v1 has Box"):
            _ = run.n_actions


# ----------------------------------------------------------------------------- the stop test
def test_solved_run_stops_at_the_target_and_every_output_agrees(tmp_path, capsys):
    run = train(config(tmp_path, target_return=10.0, target_window=4))
    s = run.summary
    # 2 envs x 5 steps per segment: 2 episodes of 10 steps every second segment (20 frames).
    assert s["stopped_by"] == "target_return" and s["solved"]
    assert s["frames"] == s["frames_to_solve"] == 40 and s["episodes"] == 4
    assert s["train_return_mean4"] == 10.0 and 0 < s["time_to_solve"] <= s["wall_time"]
    rows = check_run_dir(Path(s["run_dir"]), window=4)
    assert float(rows[-1]["train_return_mean4"]) == s["train_return_mean4"]
    assert int(rows[-1]["frames"]) == s["frames"]
    out = capsys.readouterr().out
    assert "test: solved after 40 frames" in out and "train_return_mean4 10.00" in out
    assert f"outputs in {s['run_dir']}" in out


def test_rows_come_at_most_every_progress_every_s_and_at_checkpoints_and_the_end(tmp_path):
    """SAC ends an iteration per frame: rows at most every progress_every_s seconds (here an
    hour: only the first iteration's, each checkpoint's and the run's end), each counting the
    frames of the iterations it skipped."""
    run = train(config(tmp_path, max_frames=100, checkpoint_every=4, progress_every_s=3600.0))
    assert run.summary["frames"] == 100 and run.iteration == 9  # the 10th segment stops it
    rows = check_run_dir(Path(run.summary["run_dir"]))
    assert [int(r["iteration"]) for r in rows] == [1, 4, 8, 9]
    assert [int(r["frames"]) for r in rows] == [10, 40, 80, 100]
    # the end row carries the metrics of the last iteration, which wrote no row of its own
    assert [r["loss"] for r in rows] == ["1.0", "4.0", "8.0", "9.0"]


@pytest.mark.parametrize("every", [-1.0, math.nan])
def test_a_negative_progress_interval_is_refused(tmp_path, every):
    with pytest.raises(ConfigError, match="progress_every_s must be >= 0"):
        train(config(tmp_path, progress_every_s=every))
    assert not (tmp_path / "runs").exists()


def test_frame_budget_stop_and_the_window_names_the_column(tmp_path):
    run = train(config(tmp_path, wrong=True, max_frames=30, target_return=5.0))
    s = run.summary
    assert s["stopped_by"] == "max_frames" and not s["solved"] and s["frames"] == 30
    assert s["frames_to_solve"] is None and s["time_to_solve"] is None
    assert s["train_return_mean20"] == 0.0 and math.isnan(s["eval_return"])
    rows = check_run_dir(Path(s["run_dir"]))
    assert [int(r["iteration"]) for r in rows] == [1, 2, 2]  # the last row: where it stopped
    assert [r["loss"] for r in rows] == ["1.0", "2.0", "nan"]


def test_time_budget_stop(tmp_path):
    run = train(config(tmp_path, time_budget=1e-9))
    assert run.summary["stopped_by"] == "time_budget" and run.summary["frames"] == 10


def test_no_target_runs_to_the_frame_budget(tmp_path):
    run = train(config(tmp_path, target_return=None, max_frames=40))
    assert run.summary["stopped_by"] == "max_frames" and run.summary["frames"] == 40


def test_checkpoints_hold_the_registered_state_and_the_whole_config(tmp_path):
    run = train(config(tmp_path, target_return=None, max_frames=40, checkpoint_every=1))
    ckpt = torch.load(run.logger.dir / "checkpoints" / "latest.pt")
    assert {"model", "config", "frames", "iteration", "rng", "wall_time", "agent"} <= set(ckpt)
    assert ckpt["frames"] == 40 and ckpt["iteration"] == 3
    assert ckpt["config"]["layout"]["n_envs"] == 2 and ckpt["config"]["wrong"] is False
    meta = json.loads((run.logger.dir / "config.json").read_text())
    assert meta["config"] == ckpt["config"] and meta["algo"] == "test"


def test_config_json_records_the_commit_of_the_code_not_of_the_working_directory(tmp_path):
    run = train(config(tmp_path, max_frames=10))
    meta = json.loads((run.logger.dir / "config.json").read_text())
    assert run_module.code_dir(run.cfg) == Path(__file__).resolve().parent
    assert meta["git_commit"] == git_commit(Path(__file__).resolve().parent)


# ----------------------------------------------------------------------------- failures
def test_ctrl_c_keeps_the_last_row_and_checkpoint(tmp_path, capsys):
    cfg = config(tmp_path, target_return=None, max_frames=1000)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, fail_at=2)
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = read_rows(run_dir / "progress.csv")
    assert [int(r["frames"]) for r in rows] == [10, 20, 30]
    assert torch.load(run_dir / "checkpoints" / "latest.pt")["frames"] == 30
    assert "stopped by interrupted after 30 frames" in capsys.readouterr().out
    assert (run_dir / "returns.png").is_file()


def test_a_stop_before_the_first_iteration_leaves_no_checkpoint(tmp_path):
    """The algorithm registers its learner's state after the batchers start: a checkpoint
    written before the first iteration ends could lack it, and could not be resumed
    (a Slurm job warned during Pong's start-up). ``--resume auto`` then starts afresh."""
    from rlstruct.runs.resolve import newest_checkpointed_run

    with pytest.raises(KeyboardInterrupt):
        train(config(tmp_path, target_return=None, max_frames=1000), fail_at=0)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert not (run_dir / "checkpoints" / "latest.pt").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["checkpoint"] is None
    assert newest_checkpointed_run(tmp_path / "runs") is None


def test_other_errors_propagate_and_close_everything(tmp_path, capsys):
    with pytest.raises(ZeroDivisionError):
        train(config(tmp_path, target_return=None), fail_at=1, error=ZeroDivisionError)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "returns.png").is_file()  # the logger closed (and plotted)
    assert not (run_dir / "checkpoints").exists()
    assert "outputs in" not in capsys.readouterr().out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("ZeroDivisionError")


@pytest.mark.parametrize(("kw", "status"), [
    ({"target_return": 10.0, "target_window": 4}, "solved"),
    ({"target_return": None, "max_frames": 20}, "budget"),
])
def test_summary_json_says_how_the_run_ended(tmp_path, kw, status):
    run = train(config(tmp_path, **kw))
    saved = json.loads((run.logger.dir / "summary.json").read_text())
    assert saved["status"] == run.summary["status"] == status
    assert saved["frames"] == run.summary["frames"] and saved["resumes"] == 0


def test_ctrl_c_status_is_interrupted(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        train(config(tmp_path, target_return=None, max_frames=1000), fail_at=1)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"


def test_out_of_time_stops_the_run_before_it_collects_again(tmp_path):
    cfg = config(tmp_path, target_return=None, time_budget=0.3)
    with Run("test", cfg) as run:
        batcher = run.training_batcher(Repeater, {"model": torch.nn.Linear(2, 2)}, GymEnvInf, 5)
        for _ in run.segments(batcher):
            checks = 0
            while not run.out_of_time():  # a learn phase far longer than the budget
                checks += 1
            batcher.execute()
            run.end_iteration({})
    assert run.summary["stopped_by"] == "time_budget" and run.iteration == 1
    assert checks > 0 and run.frames == 10  # the segment started after it was not collected


def test_the_loop_must_start_the_next_segment(tmp_path):
    with Run("test", config(tmp_path)) as run:
        batcher = run.training_batcher(Repeater, {"model": torch.nn.Linear(2, 2)}, GymEnvInf, 5)
        with pytest.raises(BatcherStateError, match="execute"):
            for _ in run.segments(batcher):
                pass  # no execute(): the next get() is refused


# ----------------------------------------------------------------------------- evaluation rows
class FakeEvaluator:
    """Finishes an evaluation two polls after it started, with the iteration it started at."""

    def __init__(self, create_agent, agent_args, env_id, n_envs, **kw) -> None:
        self.kw, self.started, self.pending = kw, [], None

    def start(self, weights) -> bool:
        if self.pending is not None:
            return False
        self.started.append(weights)
        self.pending = [2, float(weights["iteration"])]
        return True

    def poll(self) -> float | None:
        if self.pending is None:
            return None
        self.pending[0] -= 1
        if self.pending[0]:
            return None
        result, self.pending = self.pending[1], None
        return result

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_eval_return_is_written_only_on_the_rows_where_an_evaluation_finished(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(run_module, "Evaluator", FakeEvaluator)
    cfg = config(tmp_path, target_return=None, max_frames=100, eval_every=3)
    with Run("test", cfg) as run:
        batcher = run.training_batcher(Repeater, {"model": torch.nn.Linear(2, 2)}, GymEnvInf, 5)
        evaluator = run.evaluator(Repeater, {"model": torch.nn.Linear(2, 2)})
        for _ in run.segments(batcher):
            batcher.execute()
            run.end_iteration({"iteration": run.iteration + 1})
    assert evaluator.kw["seed"] == 1000 and evaluator.kw["device"] == torch.device("cpu")
    rows = read_rows(run.logger.dir / "progress.csv")
    # Started at iterations 3, 6 and 9; each result arrives two iterations later.
    assert [int(r["iteration"]) for r in evaluated_rows(rows)] == [5, 8]
    assert [float(r["eval_return"]) for r in evaluated_rows(rows)] == [3.0, 6.0]
    assert len(rows) == 10 and run.summary["eval_return"] == 6.0


def test_a_lucky_training_window_does_not_solve_a_run_whose_evaluation_disagrees(
    tmp_path, monkeypatch
):
    # Every training episode returns 10 (the target; 2 episodes an iteration, so the window of
    # 12 fills at iteration 6), but the evaluations (the iteration they started at, 2 iterations
    # later: 3.0 at 5, 6.0 at 8, ...) stay below it until the one started at iteration 12.
    monkeypatch.setattr(run_module, "Evaluator", FakeEvaluator)
    cfg = config(tmp_path, target_return=10.0, target_window=12, max_frames=400, eval_every=3)
    with Run("test", cfg) as run:
        batcher = run.training_batcher(Repeater, {"model": torch.nn.Linear(2, 2)}, GymEnvInf, 5)
        run.evaluator(Repeater, {"model": torch.nn.Linear(2, 2)})
        for _ in run.segments(batcher):
            batcher.execute()
            run.end_iteration({"iteration": run.iteration + 1})
    s = run.summary
    assert s["solved"] and s["stopped_by"] == "target_return"
    assert s["eval_return"] >= 10.0  # the evaluation agreed when the run stopped
    # The training return alone would have stopped it at iteration 6 (60 frames).
    assert s["frames_to_solve"] >= 14 * 10 and not run.evaluation_disagrees()


# ----------------------------------------------------------------------------- resume
def test_resume_continues_counters_weights_rng_and_the_files(tmp_path):
    first = train(config(tmp_path, target_return=None, max_frames=40))
    run_dir = first.logger.dir
    saved = torch.load(run_dir / "checkpoints" / "latest.pt")
    assert saved["frames"] == 40 and saved["iteration"] == 3
    bias_before = saved["model"]["bias"].clone()
    torch.manual_seed(123)  # the resumed run restores the saved RNG state instead
    second = train(config(tmp_path, target_return=None, max_frames=80, resume=str(run_dir)))
    s = second.summary
    assert s["run_dir"] == str(run_dir) and s["resumes"] == 1
    assert s["frames"] == 80 and s["iterations"] == 6 and s["status"] == "budget"
    rows = read_rows(run_dir / "progress.csv")  # the last row of each session: where it stopped
    assert [int(r["frames"]) for r in rows] == [10, 20, 30, 40, 50, 60, 70, 80]
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3, 3, 4, 5, 6, 6]
    times = [float(r["wall_time"]) for r in rows]
    assert times == sorted(times)  # the clock goes on
    after = torch.load(run_dir / "checkpoints" / "latest.pt")
    assert torch.equal(after["model"]["bias"], bias_before + 3.0)  # learning carried on
    assert len(read_rows(run_dir / "episodes.csv")) == s["episodes"] == 8
    meta = json.loads((run_dir / "config.json").read_text())
    assert [r["frames"] for r in meta["resumes"]] == [40]
    assert len(list((tmp_path / "runs").iterdir())) == 1  # no second folder


def test_resume_drops_rows_written_after_the_checkpoint(tmp_path):
    first = train(config(tmp_path, target_return=None, max_frames=50, checkpoint_every=2))
    run_dir = first.logger.dir
    ckpt = run_dir / "checkpoints" / "latest.pt"
    state = torch.load(ckpt)
    state["frames"], state["iteration"] = 20, 2  # as if killed after the checkpoint at 20
    torch.save(state, ckpt)
    train(config(tmp_path, target_return=None, max_frames=30, resume=str(run_dir),
                 checkpoint_every=2))
    rows = read_rows(run_dir / "progress.csv")
    assert [int(r["frames"]) for r in rows] == [10, 20, 30]  # 30, 40, 50 were dropped
    assert [int(r["frames_at_record"]) for r in read_rows(run_dir / "episodes.csv")] == [20, 20]


def test_resume_refuses_a_changed_model_or_env_and_a_missing_checkpoint(tmp_path):
    first = train(config(tmp_path, target_return=None, max_frames=20))
    with pytest.raises(ConfigError) as info:
        resolve(config(tmp_path, resume=str(first.logger.dir), hidden=32, gamma=0.5,
                       max_frames=99), "test")
    message = str(info.value)
    assert "hidden is 32 here but 64" in message and "gamma is 0.5 here but 0.99" in message
    assert "max_frames" not in message  # budgets may change
    with pytest.raises(ConfigError, match=r"holds no checkpoints/latest\.pt"):
        resolve(config(tmp_path, resume=str(tmp_path)), "test")


def test_resume_names_a_state_that_does_not_load(tmp_path):
    # e.g. an optimizer's state from another layout (FlatAdam's one flat parameter, or not)
    first = train(config(tmp_path, target_return=None, max_frames=20))
    ckpt = first.logger.dir / "checkpoints" / "latest.pt"
    state = torch.load(ckpt)
    state["model"]["bias"] = torch.zeros(3)
    torch.save(state, ckpt)
    with pytest.raises(CheckpointError, match=r"(?s)state of 'model' .* does not fit this run's "
                                              r"Linear.*size mismatch"):
        train(config(tmp_path, target_return=None, max_frames=40, resume=str(first.logger.dir)))


def test_evaluate_rebuilds_the_policy_from_the_checkpoint_alone(tmp_path, capsys):
    from rlstruct.__main__ import main

    run = train(config(tmp_path, target_return=None, max_frames=20))
    ckpt = torch.load(run.logger.dir / "checkpoints" / "latest.pt")
    assert ckpt["constructors"]["model"] == {"class": "torch.nn.modules.linear:Linear",
                                             "args": [2, 2], "kwargs": {}}
    assert ckpt["agent"]["class"] == "test_run:Repeater"
    assert main(["evaluate", str(run.logger.dir), "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert "3 greedy episodes, return 10.00 ± 0.00" in out and "latest.pt at 20 frames" in out
    wrong = train(config(tmp_path, target_return=None, max_frames=20, wrong=True))
    assert main(["evaluate", str(wrong.logger.dir), "--checkpoint", "latest"]) == 0
    assert "return 0.00 ± 0.00" in capsys.readouterr().out


class Left(Agent):
    """Always pushes left (CartPole-v1 falls in about 9 steps)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self, state, observation, agent_info):
        return DictTensor({"action": torch.zeros(observation.n_elems(), dtype=torch.long)}), state


def test_evaluate_video_where_the_env_renders_and_a_message_where_not(tmp_path, capsys):
    from rlstruct.__main__ import main

    run = train(config(tmp_path, target_return=None, max_frames=10))
    assert main(["evaluate", str(run.logger.dir), "--episodes", "1", "--video",
                 str(tmp_path / "v1")]) == 0
    out = capsys.readouterr().out
    assert "evaluating without a video" in out and "return 10.00" in out
    assert not list(tmp_path.glob("v1/*.mp4"))
    pytest.importorskip("moviepy", reason="--video needs moviepy")
    pytest.importorskip("pygame", reason="CartPole renders with pygame")
    cfg = config(tmp_path, env_id="CartPole-v1", target_return=None, max_frames=10)
    with Run("test", cfg) as cartpole:
        model = cartpole.model(torch.nn.Linear, 4, 2)
        batcher = cartpole.training_batcher(Left, {"model": model}, GymEnvInf, 5)
        cartpole.evaluator(Left, {"model": model})
        cartpole.checkpoint_state(model=model)
        for _ in cartpole.segments(batcher):
            cartpole.publish(batcher, model.state_dict())
            cartpole.end_iteration(model.state_dict())
    assert main(["evaluate", str(cartpole.logger.dir), "--episodes", "2", "--video",
                 str(tmp_path / "v2")]) == 0
    (video,) = (tmp_path / "v2").glob("*.mp4")
    assert f"video: {video}" in capsys.readouterr().out and video.stat().st_size > 1000


def test_no_evaluator_without_eval_every_and_a_loop_that_ends_on_its_own(tmp_path):
    with Run("test", config(tmp_path)) as run:
        assert run.evaluator(Repeater, {"model": torch.nn.Linear(2, 2)}) is None
    assert run.summary["stopped_by"] == "loop_end" and run.summary["frames"] == 0
    assert len(read_rows(run.logger.dir / "progress.csv")) == 1  # the row where it stopped


@pytest.mark.slow
def test_the_layouts_restart_budget_reaches_the_training_batcher(tmp_path):
    layout = LayoutConfig(learner_device="cpu", n_processes=2, n_envs=1, max_restarts=3)
    with Run("test", config(tmp_path, layout=layout, target_return=None)) as run:
        batcher = run.training_batcher(Repeater, {"model": torch.nn.Linear(2, 2)}, GymEnvInf, 5)
        assert batcher.restart is not None and batcher.restart.max_restarts == 3
        assert batcher.pipeline == 1
