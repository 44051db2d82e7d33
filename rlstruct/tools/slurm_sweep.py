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
    jobs = []
    for cmd, folder, name in sessions:
        executor.update_parameters(job_name=name)
        try:
            jobs.append(executor.submit(SlurmSession([*cmd, "--resume", "auto"], folder, env)))
        except Exception as err:  # noqa: BLE001 - sbatch refused it: name it, keep the others
            if isinstance(err, (FileNotFoundError,)):
                raise ConfigError(f"sweep --launcher slurm: {err}") from None
            jobs.append(err)
        if not quiet and not isinstance(jobs[-1], Exception):
            print(f"sweep: {name} is Slurm job {jobs[-1].job_id}", flush=True)
    end = None if timeout is None else time.monotonic() + timeout
    waiting = [j for j in jobs if not isinstance(j, Exception)]
    while waiting and (end is None or time.monotonic() < end):
        waiting = [j for j in waiting if not j.done()]
        if waiting:
            time.sleep(poll_s)
    results: list[tuple[int | None, str]] = []
    for job in jobs:
        if isinstance(job, Exception):
            results.append((None, f"not submitted: {job}"))
        elif job in waiting:
            job.cancel(check=False)
            results.append((None, f"Slurm job {job.job_id} timed out after {timeout:g} s"))
        else:
            try:
                results.append((int(job.result()), ""))
            except Exception as err:  # noqa: BLE001 - the session failed: its row says why
                results.append((None, f"Slurm job {job.job_id}: {type(err).__name__}: "
                                      f"{str(err)[-300:]}"))
    return results
