"""How ``sweep --launcher slurm`` waits on its jobs where Slurm keeps no accounting
(:func:`rlstruct.tools.slurm_sweep.wait_for_jobs`): submitit learns a job's end from ``sacct``,
so a job that failed before submitit's code ran in it would be waited on to the timeout."""

from __future__ import annotations

import itertools
from pathlib import Path

from rlstruct.tools.slurm_sweep import wait_for_jobs


class FakeJob:
    """A submitit job as far as the wait sees it: an id, ``done()`` and ``stderr()``."""

    ids = itertools.count(100)

    def __init__(self, done_after: int | None = None, stderr: str = "") -> None:
        self.job_id = str(next(self.ids))
        self.polls, self.done_after, self._stderr = 0, done_after, stderr

    def done(self) -> bool:
        self.polls += 1
        return self.done_after is not None and self.polls > self.done_after

    def stderr(self) -> str:
        return self._stderr


def _sessions(tmp_path: Path, n: int) -> list[tuple[list[str], Path, str]]:
    return [(["run", str(i)], tmp_path / f"s{i}", f"t0s{i}") for i in range(n)]


def test_a_job_that_failed_before_its_session_started_is_submitted_once_more(tmp_path):
    sessions = _sessions(tmp_path, 2)
    first, fine = FakeJob(stderr="srun: error: Zero Bytes were transmitted or received"), \
        FakeJob(done_after=2)
    jobs: list = [first, fine]
    again = FakeJob(done_after=1)
    submitted = []

    def submit(cmd, folder, name):
        submitted.append(name)
        return again

    def states(ids):  # the failed job is gone from the queue at once; the others are running
        return {i: "RUNNING" for i in ids if i != first.job_id}

    lost = wait_for_jobs(jobs, sessions, submit, timeout=30, poll_s=0, quiet=True,
                         states=states)
    assert lost == {} and submitted == ["t0s0"] and jobs == [again, fine]


def test_a_job_whose_session_ran_and_left_no_result_is_an_error_naming_its_log(tmp_path):
    sessions = _sessions(tmp_path, 1)
    sessions[0][1].mkdir()
    (sessions[0][1] / "stdout.log").write_text("session on n1\n")  # the session started
    job = FakeJob(stderr="line 1\nKilled\n")

    def submit(cmd, folder, name):
        raise AssertionError("a session that started is never submitted again")

    lost = wait_for_jobs([job], sessions, submit, timeout=30, poll_s=0, quiet=True,
                         states=lambda ids: {i: "FAILED" for i in ids})
    assert list(lost) == [job.job_id]
    assert "ended (FAILED) without a result" in lost[job.job_id] and "Killed" in lost[job.job_id]


def test_a_job_that_fails_again_after_its_resubmission_is_an_error(tmp_path):
    sessions = _sessions(tmp_path, 1)
    jobs: list = [FakeJob()]
    second = FakeJob(stderr="srun: error: Zero Bytes")
    lost = wait_for_jobs(jobs, sessions, lambda *a: second, timeout=30, poll_s=0, quiet=True,
                         states=lambda ids: {})
    assert jobs == [second] and list(lost) == [second.job_id]
    assert "ended (gone) without a result" in lost[second.job_id]


def test_a_queue_that_cannot_be_read_concludes_nothing_and_the_timeout_holds(tmp_path):
    sessions = _sessions(tmp_path, 1)
    job = FakeJob()
    lost = wait_for_jobs([job], sessions, lambda *a: FakeJob(), timeout=0.3, poll_s=0.01,
                         quiet=True, states=lambda ids: None)
    assert lost == {} and job.polls > 3  # waited to the timeout; run_on_slurm cancels it


def test_a_job_gone_for_fewer_polls_than_polls_gone_is_still_waited_on(tmp_path):
    sessions = _sessions(tmp_path, 1)
    job = FakeJob(done_after=2)  # its result lands while squeue no longer lists it
    lost = wait_for_jobs([job], sessions, lambda *a: FakeJob(), timeout=30, poll_s=0,
                         quiet=True, states=lambda ids: {}, polls_gone=3)
    assert lost == {}
