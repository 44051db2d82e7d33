"""The sessions of a sweep as Slurm jobs: ``rlstruct sweep --launcher slurm``, through submitit.

Each session is one Slurm job (the ``slurm`` extra: ``pip install -e '.[slurm]'``), submitted with
submitit's ``SlurmExecutor``: ``--cpus-per-task`` is the sweep's ``cores_per_session``, and with
``gpus`` each job asks for that many GPUs (``--gpus-per-task``). Slurm rotates the GPUs: each job
sees the ones it was given in ``CUDA_VISIBLE_DEVICES`` and learns on ``cuda:0`` of them (the learner
device ``auto``); on CPU-only nodes nothing touches CUDA. The job runs the session's
command (``python -m rlstruct.algos.ALGO ... --resume auto``) as a child process:

- submitit warns the job ``signal_delay_s`` before its time limit with USR2 (and on a
  preemption); :meth:`SlurmSession.checkpoint` then sends SIGTERM to the run, waits for its final
  checkpoint and hands submitit the same session to requeue; the next session of the job resumes
  the run (``--resume auto``: the run of its folder with the newest checkpoint, or a fresh one);
- the run ignores USR2 (Slurm may signal every process of the job); a SIGTERM from Slurm (a
  preemption that requeues, ``scontrol requeue``) reaches the run itself, and the job waits to
  be requeued rather than report an unfinished session.

The outcome of a session is its run's ``summary.json``, as for local sessions.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlstruct.errors import ConfigError, install_hint

__all__ = ["SlurmSession", "run_on_slurm", "require_submitit"]


class SlurmSession:
    """One session's command, run inside its Slurm job (a submitit ``Checkpointable``).

    Args:
        cmd: the session's command line (its ``--runs-dir`` is the session's folder).
        folder: the session's folder (``stdout.log`` and ``stderr.log`` go there).
        env: environment variables set for the command.
        stop_s: seconds the run gets to write its final checkpoint after SIGTERM.
    """

    def __init__(self, cmd: Sequence[str], folder: str | Path, env: dict[str, str],
                 stop_s: float = 60.0) -> None:
        self.cmd, self.folder, self.env, self.stop_s = list(cmd), Path(folder), env, stop_s
        self._proc: subprocess.Popen[bytes] | None = None

    def __call__(self) -> int:
        """Runs the command to its end; returns its exit status.

        Raises:
            RuntimeError: the run was interrupted (SIGTERM from Slurm) and the job was not
                requeued within ``stop_s``.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        with open(self.folder / "stdout.log", "ab") as out, \
                open(self.folder / "stderr.log", "ab") as err:
            out.write(f"session on {os.uname().nodename}, CUDA_VISIBLE_DEVICES="
                      f"{gpus!r}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                self.cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env}, preexec_fn=_ignore_usr2)
            code = self._proc.wait()
        if _status(self.folder) == "interrupted":  # Slurm's SIGTERM: a requeue is coming
            time.sleep(self.stop_s)
            raise RuntimeError(f"the run in {self.folder} was interrupted and the job was "
                               "not requeued")
        return code

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook before it requeues the job: SIGTERM to the run, whose final
        checkpoint the next session resumes; returns the same session to run again."""
        import submitit

        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_s)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._proc = None
        return submitit.helpers.DelayedSubmission(self)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_proc": None}


def _ignore_usr2() -> None:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def _status(folder: Path) -> str:
    import json

    for summary in folder.glob("*/summary.json"):
        with contextlib.suppress(OSError, ValueError):
            return str(json.loads(summary.read_text()).get("status", ""))
    return ""


def require_submitit() -> Any:
    """submitit, which ``--launcher slurm`` needs (the ``slurm`` extra).

    Raises:
        ConfigError: submitit is not installed (checked before the sweep makes its folder).
    """
    try:
        import submitit
    except ImportError:
        raise ConfigError("sweep --launcher slurm needs submitit (the 'slurm' extra), which is "
                          "not installed: " + install_hint("slurm")) from None
    return submitit


def run_on_slurm(sessions: Sequence[tuple[list[str], Path, str]], out: Path, cores: int,
                 gpus: int, time_min: int, partition: str | None, timeout: float | None,
                 poll_s: float = 2.0, quiet: bool = False) -> list[tuple[int | None, str]]:
    """Submits one Slurm job per session and waits for them all.

    Args:
        sessions: ``(command, folder, name)`` of each session.
        out: the sweep folder (submitit's files go to ``out/slurm``).
        cores: ``--cpus-per-task`` of each job.
        gpus: ``--gpus-per-task`` of each job (0: none asked).
        time_min: ``--time`` of each job, in minutes (each requeue gets as much again).
        partition: the Slurm partition (None: the default one).
        timeout: seconds to wait for all jobs (None: no limit); the jobs still running then
            are cancelled.
        poll_s: how often the jobs are polled.
        quiet: print nothing.

    Returns:
        Per session, ``(exit status, error)``: the status is None when the job gave none.

    Raises:
        ConfigError: submitit is not installed, or ``sbatch`` is not on this machine.
    """
    submitit = require_submitit()
    executor = submitit.SlurmExecutor(folder=out / "slurm" / "%j")
    params: dict[str, Any] = {"time": time_min, "cpus_per_task": cores, "ntasks_per_node": 1,
                              "nodes": 1, "signal_delay_s": 60}
    if gpus:
        params["gpus_per_task"] = gpus
    if partition:
        params["partition"] = partition
    executor.update_parameters(**params)
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    def submit(cmd: list[str], folder: Path, name: str) -> Any:
        executor.update_parameters(job_name=name)
        try:
            return executor.submit(SlurmSession([*cmd, "--resume", "auto"], folder, env))
        except FileNotFoundError as err:
            raise ConfigError(f"sweep --launcher slurm: {err}") from None
        except Exception as err:  # noqa: BLE001 - sbatch refused it: name it, keep the others
            return err

    jobs = []
    for cmd, folder, name in sessions:
        jobs.append(submit(cmd, folder, name))
        if not quiet and not isinstance(jobs[-1], Exception):
            print(f"sweep: {name} is Slurm job {jobs[-1].job_id}", flush=True)
    lost = wait_for_jobs(jobs, sessions, submit, timeout, poll_s, quiet)
    results: list[tuple[int | None, str]] = []
    for job in jobs:
        if isinstance(job, Exception):
            results.append((None, f"not submitted: {job}"))
        elif job.job_id in lost:
            results.append((None, lost[job.job_id]))
        elif not job.done():
            job.cancel(check=False)
            results.append((None, f"Slurm job {job.job_id} timed out after {timeout:g} s"))
        else:
            try:
                results.append((int(job.result()), ""))
            except Exception as err:  # noqa: BLE001 - the session failed: its row says why
                results.append((None, f"Slurm job {job.job_id}: {type(err).__name__}: "
                                      f"{str(err)[-300:]}"))
    return results


# Slurm's job states once a job has left for good (squeue keeps an ended job for MinJobAge).
ENDED = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                   "OUT_OF_MEMORY", "TIMEOUT"})


def queue_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """The Slurm state of each of ``job_ids`` that ``squeue`` still knows; None when squeue
    cannot answer (then nothing is concluded from it)."""
    try:
        done = subprocess.run(["squeue", "-h", "-o", "%i %T", "-j", ",".join(job_ids)],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:  # every id gone: "Invalid job id specified"
        return {} if "invalid job id" in done.stderr.lower() else None
    return dict(line.split(maxsplit=1) for line in done.stdout.splitlines() if " " in line)


def wait_for_jobs(jobs: list[Any], sessions: Sequence[tuple[list[str], Path, str]],
                  submit: Any, timeout: float | None, poll_s: float, quiet: bool,
                  states: Any = queue_states, polls_gone: int = 3) -> dict[str, str]:
    """Waits until every job has a result, has left Slurm's queue without one, or ``timeout``.

    submitit learns a job's end from ``sacct``; where Slurm keeps no accounting (a small cluster,
    the local one of the tests) a job that fails before submitit's own code runs in it (``srun``
    refused by the node) would be waited on to the end. Here a job that ``squeue`` shows ended, or
    no longer lists, for ``polls_gone`` polls in a row without a result has ended: when its
    session never started (no ``stdout.log`` in its folder) it is submitted once more, in place
    in ``jobs``; otherwise its session is an error.

    Args:
        jobs: submitit jobs (or the exception their submission raised), one per session.
        sessions: ``(command, folder, name)`` of each session.
        submit: ``submit(command, folder, name)`` -> a new job (or the exception).
        timeout: seconds to wait in all (None: no limit).
        poll_s: seconds between polls.
        quiet: print nothing.
        states: ``states(job_ids)`` -> ``{job_id: state}`` of the jobs still known, or None.
        polls_gone: polls a job must be gone in a row before it counts as ended.

    Returns:
        ``{job_id: error}`` of the jobs that ended without a result.
    """
    end = None if timeout is None else time.monotonic() + timeout
    waiting = {i for i, j in enumerate(jobs) if not isinstance(j, Exception)}
    gone: dict[int, int] = {}
    retried: set[int] = set()
    lost: dict[str, str] = {}
    while waiting and (end is None or time.monotonic() < end):
        waiting = {i for i in waiting if not jobs[i].done()}
        known = states([jobs[i].job_id for i in sorted(waiting)]) if waiting else {}
        for i in sorted(waiting):
            state = None if known is None else known.get(jobs[i].job_id, "gone")
            if state is None or state not in ENDED | {"gone"}:
                gone.pop(i, None)
                continue
            gone[i] = gone.get(i, 0) + 1
            if gone[i] < polls_gone:  # done() was asked at the top of this poll
                continue
            waiting.discard(i)
            gone.pop(i)
            cmd, folder, name = sessions[i]
            old = jobs[i].job_id
            if i not in retried and not (Path(folder) / "stdout.log").exists():
                retried.add(i)
                jobs[i] = submit(cmd, folder, name)
                if isinstance(jobs[i], Exception):
                    continue
                waiting.add(i)
                if not quiet:
                    print(f"sweep: {name}'s Slurm job {old} ended ({state}) before its session "
                          f"started; submitted again as job {jobs[i].job_id}", flush=True)
            else:
                lost[old] = (f"Slurm job {old} ended ({state}) without a result; its log: "
                             f"{_log_tail(jobs[i])}")
        if waiting:
            time.sleep(poll_s)
    return lost


def _log_tail(job: Any) -> str:
    """The last lines of a submitit job's stderr (``""`` when there is none)."""
    with contextlib.suppress(Exception):  # a log that cannot be read only shortens the message
        return " | ".join((job.stderr() or "").strip().splitlines()[-3:])[-300:]
    return ""
