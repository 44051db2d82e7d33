"""A run's bad inputs and broken envs, each named by a typed error, before the run folder
exists where the config tells: a hung env under a short time budget (named long before the
300 s timeout), the run folder removed mid-run, an evaluation env that raises (named as the
evaluation's), and a failed start that leaves no folder behind (issue 38, items 11, 12, 14, 16).

The toy envs are in tests/support/toy_envs.py (``--env-module support.toy_envs``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.agents import DeterministicAgent

from rlstruct import DictTensor
from rlstruct.algos import ppo
from rlstruct.batchers.deadlines import (
    ADAPTIVE_FLOOR_S,
    PAUSE_GAP_S,
    UNTIL_MIN_WAIT_S,
    Deadlines,
)
from rlstruct.envs import GymEnvInf
from rlstruct.errors import ActionError, ConfigError, RunFolderError, WorkerError
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import resolve
from rlstruct.runs.run import Run, RunConfig

REPO = Path(__file__).resolve().parents[2]
TOYS = ("support.toy_envs",)


def loop(cfg: RunConfig, remove_at: int | None = None) -> Run:
    """A loop as the algorithms write it, with a fixed agent; ``remove_at``: the iteration
    at which the run folder is deleted under it."""
    with Run("test", cfg) as run:
        batcher = run.training_batcher(DeterministicAgent, {"n_actions": 2}, GymEnvInf,
                                       cfg.n_timesteps)
        run.evaluator(DeterministicAgent, {"n_actions": 2})
        for _traj in run.segments(batcher):
            if run.iteration == remove_at:
                shutil.rmtree(run.logger.dir)
            batcher.execute()
            run.end_iteration(None)
    return run


def small(tmp_path: Path, **kw) -> RunConfig:
    kw.setdefault("layout", LayoutConfig(n_processes=1, n_envs=2))
    kw.setdefault("eval_every", 0)
    return RunConfig(n_timesteps=8, runs_dir=str(tmp_path / "runs"), target_return=None,
                     max_frames=10_000, **kw)


# ------------------------------------------------------------------ item 12: hung envs
def test_the_silence_limit_follows_the_segments_and_ends_with_the_budget():
    fixed = Deadlines(timeout=300.0, adaptive=False, until=None, n_workers=2)
    fixed.delivered(0, released=0.0, now=1.0)
    assert fixed.limit() == 300.0 and fixed.at(5.0) == 305.0
    auto = Deadlines(timeout=300.0, adaptive=True, until=None, n_workers=2)
    assert auto.limit() == 300.0  # nothing measured: the timeout
    auto.delivered(0, released=10.0, now=12.0)
    assert auto.limit() == ADAPTIVE_FLOOR_S  # 10 x 2 s is below the floor
    auto.delivered(1, released=10.0, now=19.0)  # worker 1 was silent 9 s
    auto.delivered(0, released=11.0, now=14.0)  # since its own last delivery: 2 s
    assert auto.longest_silence == 9.0 and auto.limit() == 90.0
    auto.delivered(1, released=20.0, now=60.0)
    assert auto.limit() == 300.0  # at most the timeout
    bounded = Deadlines(timeout=300.0, adaptive=True, until=100.0, n_workers=1)
    assert bounded.at(50.0) == 100.0  # the budget's end comes first
    assert bounded.at(98.0) == 98.0 + UNTIL_MIN_WAIT_S  # a late wait still gets a few seconds
    assert Deadlines.problems("yes", float("nan")) == [
        "adaptive_timeout must be a bool, got 'yes'",
        "deadline must be a time.monotonic() value or None, got nan"]


def test_a_pause_of_the_pools_own_process_moves_every_limit_on_and_is_no_silence():
    d = Deadlines(timeout=30.0, adaptive=True, until=100.0, n_workers=1)
    d.looked(10.0, 11.0)  # a second between two looks: no pause
    d.looked(20.0, 20.0 + PAUSE_GAP_S)  # exactly the gap: no pause either
    assert d.at(5.0) == 35.0 and d.paused(0.0) == 0.0
    d.looked(40.0, 640.0)  # stopped for 10 minutes (SIGSTOP, a suspended job)
    assert d.paused(0.0) == 600.0 and d.paused(50.0, 60.0) == 10.0 and d.paused(640.0) == 0.0
    assert d.at(30.0) == 660.0  # heard from at 30: 30 s of limit, 600 s of pause
    assert d.at(90.0) == 90.0 + 550.0 + UNTIL_MIN_WAIT_S  # the budget's end moved on too
    assert d.at(700.0) == 700.0 + UNTIL_MIN_WAIT_S  # a wait that starts after it: no shift
    d.delivered(0, released=30.0, now=650.0)  # silent 20 s of the 620 s between
    assert d.longest_silence == 20.0
    d.close()


def test_the_pause_watch_runs_from_the_first_wait_to_close_and_counts_a_pause_under_way():
    def watches() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "rlstruct-pause-watch"]

    before = len(watches())
    d = Deadlines(timeout=30.0, adaptive=False, until=None, n_workers=1)
    assert len(watches()) == before  # no wait yet: no thread
    now = time.monotonic()
    assert d.at(now) == pytest.approx(now + 30.0, abs=1.0) and len(watches()) == before + 1
    d._last_tick = now - 100.0  # as if the process was continued after 100 s, the watch asleep
    assert d.paused(now - 200.0) == pytest.approx(100.0, abs=1.0)
    d.close()
    assert len(watches()) == before and d.paused(now - 200.0) == 0.0  # closed: no watch
    d.at(now)
    assert len(watches()) == before  # a closed pool's deadlines start no thread again


def test_a_worker_timeout_that_is_not_a_positive_number_is_a_config_error():
    with pytest.raises(ConfigError, match=r"worker_timeout must be a finite number of seconds "
                                          r"> 0 \(None: derived from the segments\), got -1"):
        resolve(RunConfig(worker_timeout=-1.0))


def test_the_run_hands_its_worker_timeout_and_budget_to_the_training_batcher(tmp_path):
    for timeout, expected in ((None, (300.0, True)), (7.5, (7.5, False))):
        cfg = small(tmp_path, worker_timeout=timeout, time_budget=40.0)
        with Run("test", cfg) as run:
            waits = run.worker_waits()  # what training_batcher hands to make_batcher
            assert (waits["timeout"], waits["adaptive_timeout"]) == expected
            assert waits["deadline"] == pytest.approx(run.start + 40.0 + 10.0)
            run.stopped_by = "loop_end"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_an_env_that_hangs_is_named_soon_after_a_short_time_budget_not_after_300_s(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "-m", "rlstruct", "train", "ppo", "--env-id", "HangingStep-v0",
            "--env-module", TOYS[0], "--time-budget", "3", "--n-processes", "2", "--n-envs",
            "1", "--n-timesteps", "16", "--eval-every", "0", "--target-return", "None",
            "--runs-dir", str(tmp_path / "runs")]
    start = time.monotonic()
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    elapsed = time.monotonic() - start
    assert proc.returncode != 0, err
    assert "WorkerTimeoutError: workers [0, 1] did not answer execute within the run's " \
           "deadline, its time budget plus a grace" in err, err[-3000:]
    assert elapsed < 90, elapsed  # the budget (3 s) plus its grace, not the 300 s timeout


# --------------------------------------------------------- item 14: the folder, evaluation
def test_a_run_folder_removed_mid_run_is_a_run_folder_error(tmp_path):
    with pytest.raises(RunFolderError, match=r"the run folder .* was removed while the run "
                                             r"was going on") as info:
        loop(small(tmp_path, checkpoint_every=1), remove_at=2)
    assert isinstance(info.value, FileNotFoundError)


@pytest.mark.slow
def test_an_evaluation_env_that_raises_is_named_as_the_evaluations(tmp_path):
    cfg = small(tmp_path, env_id="EvalRaises-v0", env_module=TOYS, eval_every=1,
                eval_envs=2, time_budget=60.0)
    with pytest.raises(WorkerError, match=r"^evaluation of EvalRaises-v0, episode 0 \(the "
                                          r"evaluation's own env and worker, not a training "
                                          r"one\): worker 0, env 0"):
        loop(cfg)
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"].startswith("WorkerError: evaluation of EvalRaises-v0"), summary


# ------------------------------------------------------------ item 16: no empty folders
BAD_STARTS = {
    "a Dict observation of a MultiDiscrete leaf": dict(env_id="MultiDiscreteDictObs-v0",
                                                       env_module=TOYS),
    "an env whose close raises": dict(env_id="CloseRaises-v0", env_module=TOYS),
    "an unknown env id": dict(env_id="CartPole-v9"),
    "a bad layout": dict(layout=LayoutConfig(n_envs=0, pipeline=0)),
    "a device the machine lacks": dict(layout=LayoutConfig(batcher_device="cuda:7")),
    "a bad worker timeout": dict(worker_timeout=0.0),
}


@pytest.mark.parametrize("kw", BAD_STARTS.values(), ids=BAD_STARTS.keys())
def test_a_start_the_config_refuses_leaves_no_run_folder(kw, tmp_path):
    with pytest.raises(ConfigError):
        ppo.main(ppo.Config(runs_dir=str(tmp_path / "runs"), **kw))
    assert not (tmp_path / "runs").exists()


class OutOfSpace(DeterministicAgent):
    """Plays action 7 in a 2-action space: an ActionError in the first segment."""

    def __call__(self, state, observation, agent_info):
        step, state = super().__call__(state, observation, agent_info)
        return DictTensor({"action": step["action"] + 7}), state


def test_a_start_that_fails_with_a_typed_error_before_its_first_iteration_leaves_no_folder(
        tmp_path):
    cfg = small(tmp_path)  # the run folder exists when the first segment fails
    with pytest.raises(ActionError, match="action 7 is outside"), Run("test", cfg) as run:
        batcher = run.training_batcher(OutOfSpace, {"n_actions": 2}, GymEnvInf, 8)
        for _traj in run.segments(batcher):
            pass
    assert not (tmp_path / "runs").exists()


def test_a_worker_that_fails_before_the_first_iteration_keeps_the_folder_and_its_summary(
        tmp_path):
    # A failed worker (a crash, a hang) is a record a Slurm job or a sweep reads: not removed.
    with pytest.raises(WorkerError, match="worker 1 died"), Run("test", small(tmp_path)) as run:
        raise WorkerError("worker 1 died", worker=1)
    summary = json.loads((run.logger.dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "worker 1 died" in json.dumps(summary)
