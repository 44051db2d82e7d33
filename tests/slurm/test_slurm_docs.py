"""Every Slurm script of the docs, read from the Markdown and submitted to a real Slurm of two
nodes (issue 29): scaled down by the variables the scripts read (``FRAMES``, ``TIME_BUDGET``,
...) and by ``sbatch`` options that fit two 2-core nodes without GPUs. Each test checks the
job's final state in ``scontrol show job`` and the run's ``summary.json``."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from conftest import REPO

from rlstruct.runs.lock import LOCK_NAME

NEEDS_RAY = "the script starts a Ray cluster: pip install -e '.[ray]'"
NEEDS_ATARI = "the script trains on Pong: pip install -e '.[atari]'"

CLUSTERS = "guide-clusters.md"
#: A small run: enough frames for a few iterations, a time budget as a backstop.
SMALL = {"FRAMES": "3000", "TIME_BUDGET": "90"}


@pytest.mark.timeout(400)
def test_one_node_many_cores(doc_job):
    job = doc_job(CLUSTERS, "ppo-node", **SMALL)
    job.submit("--nodes=1", "--cpus-per-task=2", "--time=3")
    job.completed(job.wait(180))
    summary = job.summary()
    assert summary["status"] == "budget" and summary["frames"] >= 3000


@pytest.mark.timeout(400)
def test_several_nodes_a_ray_cluster_with_actors_on_both_nodes(doc_job):
    """Token authentication on (Ray 2.60): without ``RAY_AUTH_MODE=token`` the second node and
    the driver fail with InvalidAuthToken."""
    pytest.importorskip("ray", reason=NEEDS_RAY)
    job = doc_job(CLUSTERS, "ppo-ray", **SMALL)
    job.submit("--nodes=2", "--cpus-per-task=2", "--time=4")
    job.completed(job.wait(240))
    summary = job.summary()
    assert summary["status"] == "budget"
    assert summary["ray_nodes"] == 2, summary  # 3 actors: 1 CPU on the head, 2 on the other
    assert (Path(job.env["HOME"]) / ".ray" / "auth_token").is_file()


@pytest.mark.timeout(400)
def test_hetjob_learner_ranks_on_one_component_rollouts_on_the_other(doc_job):
    pytest.importorskip("ray", reason=NEEDS_RAY)
    job = doc_job(CLUSTERS, "ppo-hetjob", **SMALL)
    job.submit("--time=4", "--nodes=1", "--cpus-per-task=1", "--gpus-per-node=0", ":",
               "--nodes=1", "--cpus-per-task=2")
    job.completed(job.wait(240))
    summary = job.summary()
    assert summary["status"] == "budget"
    assert summary["launch"] == {"launcher": "rlstruct", "world_size": 2,
                                 "learner_backend": "ray"}
    # the rollout actors ask for `rollout`, which only the second component's node offers
    assert summary["ray_nodes"] == 1, summary


@pytest.mark.timeout(400)
def test_torchrun_under_srun_across_two_nodes(doc_job):
    job = doc_job(CLUSTERS, "ppo-torchrun", **SMALL)
    job.submit("--nodes=2", "--cpus-per-task=2", "--gpus-per-node=0", "--time=3")
    job.completed(job.wait(180))
    summary = job.summary()
    assert summary["status"] == "budget"
    assert summary["launch"] == {"launcher": "torchrun", "world_size": 2}


@pytest.mark.timeout(400)
def test_a_custom_env_from_the_users_module(doc_job):
    job = doc_job(CLUSTERS, "ppo-custom-env", ENV_DIR=str(REPO / "examples"), **SMALL)
    job.submit("--nodes=1", "--cpus-per-task=2", "--time=3")
    job.completed(job.wait(180))
    summary = job.summary()
    assert summary["status"] in ("budget", "solved") and summary["frames"] > 0
    config = json.loads((Path(summary["run_dir"]) / "config.json").read_text())
    assert config["config"]["env_id"] == "Corridor-v0"


# ------------------------------------------------------------------------ requeue
def _wait_for(what: str, test, deadline_s: float, job) -> object:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        found = test()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {deadline_s:g} s\n--- job output ---\n"
                         f"{job.output[-4000:]}")


def _rows(run: Path) -> int:
    path = run / "progress.csv"
    return max(0, len(path.read_text().splitlines()) - 1) if path.is_file() else 0


@pytest.mark.timeout(400)
def test_requeue_recipe_killed_before_a_checkpoint_then_requeued_resumes(doc_job, slurm):
    """Session 1 killed with SIGKILL before its first checkpoint (a node lost): the requeued
    session 2 starts fresh. Session 2 requeued by ``scontrol requeue`` (a preemption) once it
    logged a row: the SIGTERM from Slurm writes its checkpoint, session 3 resumes it and the job
    ends COMPLETED."""
    pytest.importorskip("ale_py", reason=NEEDS_ATARI)
    pytest.importorskip("cv2", reason=NEEDS_ATARI)
    job = doc_job(CLUSTERS, "ppo-pong", FRAMES="1000000", TIME_BUDGET="45")
    job.submit("--cpus-per-task=2", "--time=5")
    lock = _wait_for("run folder lock", lambda: [p / LOCK_NAME for p in job.run_dirs()
                                                 if (p / LOCK_NAME).is_file()], 90, job)[0]
    first = lock.parent
    holder = _wait_for("lock holder", lambda: re.match(r"pid (\d+)", lock.read_text()), 30, job)
    os.kill(int(holder.group(1)), signal.SIGKILL)  # the run's process, as a lost node would
    fields = job.wait(60)
    assert fields["JobState"] == "FAILED", fields  # the script's exit status: the run's, 137
    assert not (first / "checkpoints" / "latest.pt").exists(), "killed too late for this test"
    slurm.command("scontrol", "requeue", str(job.job_id))
    job.wait(60, states={"RUNNING"}, release=True)
    second = _wait_for("fresh run with a row", lambda: [
        p for p in job.run_dirs() if p != first and _rows(p) >= 1], 120, job)[0]
    slurm.command("scontrol", "requeue", str(job.job_id))
    fields = job.wait(240, release=True)
    job.completed(fields)
    assert int(fields["Restarts"]) >= 2
    assert not (first / "summary.json").exists()
    summary = json.loads((second / "summary.json").read_text())
    assert summary["status"] == "budget" and summary["resumes"] == 1, summary
    assert job.run_dirs() == sorted([first, second])


@pytest.mark.timeout(700)
def test_requeue_recipe_at_the_time_limit(doc_job, slurm):
    """A job that reaches its ``--time`` limit: ``--signal=B:USR1@45`` on a 3-minute job warns
    the script 135-165 s in (Slurm checks about every 30 s), well after the run's first
    iteration even on a loaded machine (a warning during start-up leaves no checkpoint, and the
    next session would start afresh: with the suite in two workers beside other jobs, a 2-minute
    job warned 75-105 s in once caught a run at 18 steps/s before its first iteration); the trap
    passes SIGTERM to the run, waits for its checkpoint and requeues the job, and the next
    session resumes the run to the end of its budget (its time limit is raised when the test
    releases it, so that it is not warned in turn)."""
    pytest.importorskip("ale_py", reason=NEEDS_ATARI)
    pytest.importorskip("cv2", reason=NEEDS_ATARI)
    budget = 190  # past the latest warning, so that the first session is stopped by it
    job = doc_job(CLUSTERS, "ppo-pong", FRAMES="1000000", TIME_BUDGET=str(budget))
    job.submit("--cpus-per-task=2", "--time=3", "--signal=B:USR1@45")
    job.wait(60, states={"RUNNING"})
    fields = job.wait(260, states={"PENDING"})
    assert fields["Restarts"] == "1", fields  # requeued by the script's trap
    # released once Slurm holds it (Reason=BeginTime) and the first session has left its node:
    # a release before that races with the end of that session in slurmctld
    slurm.command("scontrol", "update", f"JobId={job.job_id}", "TimeLimit=6")  # no 2nd warning
    fields = job.wait(240, release=True)
    job.completed(fields)
    summary = job.summary()
    assert summary["status"] == "budget" and summary["resumes"] == 1, summary
    assert summary["wall_time"] >= budget
