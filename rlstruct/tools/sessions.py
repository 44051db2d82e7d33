"""The sessions of a sweep (:mod:`rlstruct.tools.sweep`) as subprocesses of this machine.

A :class:`Job` is one session to run; :func:`run_sessions` runs them, at most ``max_parallel``
at once, each in its own process group (killed whole on timeout and on any error);
:func:`finish` reads a session's outcome from what its run wrote (:func:`session_outcome`, its
run folder found by :func:`find_run_dir`) into its :class:`SessionResult`.

How a sweep stops:

- **SIGTERM or Ctrl-C** to the sweep stops its running sessions as a scheduler stops a run:
  SIGTERM to each session's process group, so that each writes its final checkpoint and
  ``summary.json`` (status ``interrupted``), then SIGKILL to the groups still alive after
  :data:`STOP_GRACE_S`. A second signal while they stop (Ctrl-C twice) SIGKILLs them at once;
  the summary of the sweep is written either way, then the sweep ends with exit code 0 after
  SIGTERM, 130 after Ctrl-C (:class:`~rlstruct.parallel.startup.Terminated`).
- **The sweep killed** (SIGKILL, the OOM killer): on Linux each session is started with a
  parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGTERM)``), so it stops gracefully at once,
  with its final checkpoint, rather than train on as an orphan.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlstruct.parallel.startup import Terminated
from rlstruct.runs.folder import is_run_dir, read_run

__all__ = ["SessionResult", "Job", "run_sessions", "start", "kill", "finish", "find_run_dir",
           "session_outcome", "stop_all", "latched", "sigterm_raises", "signals_blocked", "poll",
           "STOP_GRACE_S"]

#: Seconds the sessions of a stopped sweep have to end gracefully (a run's stop: its learn
#: phase, up to 10 s, then its final checkpoint) before SIGKILL; within the 30 s after which
#: Slurm (``KillWait``) SIGKILLs a sweep that runs in a job.
STOP_GRACE_S = 25.0

_STOPS = (signal.SIGTERM, signal.SIGINT)
_PR_SET_PDEATHSIG = 1

_TRAIN_COLUMN = re.compile(r"^train_return_mean\d+$")
_BOX = "│─╭╮╰╯┃━┏┓┗┛|"


@dataclass
class SessionResult:
    """One session's outcome: a row of ``summary.csv``.

    Attributes:
        trial, session, seed: the indices and the seed.
        device: the learner device given (``"default"`` when no device flag was passed).
        overrides: the trial's overrides, as JSON.
        returncode: the process exit status (negative: killed by that signal; None: not run).
        status: how the run ended, from its ``summary.json``: ``solved``, ``budget``,
            ``failed``, ``interrupted`` (or ``ended``); "" when it wrote none.
        solved: ``status == "solved"``: the run's stop test fired on the target return (the
            evaluation did not veto it).
        frames_to_solve, time_to_solve: frames and seconds when it was solved (summary.json).
        frames, wall_time: at the end of the run (summary.json).
        final_train_return: the summary's ``train_return_mean<N>``; ``eval_return``: its last
            finished evaluation (nan: none).
        run_dir: the session's run folder ("" when none was made).
        error: "" for a good session, else why it failed and its last stderr lines.
    """

    trial: int
    session: int
    seed: int
    device: str
    overrides: str = "{}"
    returncode: int | None = None
    status: str = ""
    solved: bool = False
    frames_to_solve: float = math.nan
    time_to_solve: float = math.nan
    frames: float = math.nan
    wall_time: float = math.nan
    final_train_return: float = math.nan
    eval_return: float = math.nan
    run_dir: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        """True when the session exited with status 0."""
        return self.returncode == 0 and not self.error


@dataclass
class Job:
    """One session to run: its result (filled in as it runs and ends), its command line and its
    folder; the process, its start time (``time.monotonic``) and its open log files once
    started."""

    result: SessionResult
    cmd: list[str]
    folder: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    files: list[Any] = field(default_factory=list)


def run_sessions(jobs: list[Job], max_parallel: int, timeout: float | None, poll_s: float,
                 quiet: bool) -> None:
    """Runs ``jobs`` here, at most ``max_parallel`` at once, each with one thread
    (``OMP_NUM_THREADS=1``) and killed after ``timeout`` seconds; fills in their results.

    Raises:
        BaseException: whatever interrupted the loop (Ctrl-C, SIGTERM as
            :class:`~rlstruct.parallel.startup.Terminated`, an error), re-raised once every
            running session was stopped (:func:`stop_all`) and each result says it was
            interrupted or not run.
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    pending: list[Job] = list(jobs)
    running: list[Job] = []
    with sigterm_raises():
        try:
            _run(pending, running, max_parallel, timeout, poll_s, quiet, env)
        except BaseException:
            with latched() as received:  # a second signal: SIGKILL at once
                stop_all(running, STOP_GRACE_S, received)
            for job in pending:
                job.result.error = "not run: sweep interrupted"
            raise


def _run(pending: list[Job], running: list[Job], max_parallel: int, timeout: float | None,
         poll_s: float, quiet: bool, env: dict[str, str]) -> None:
    """The loop of :func:`run_sessions`: starts and polls the sessions until none is left."""
    while pending or running:
        while pending and len(running) < max_parallel:
            job = pending.pop(0)
            with signals_blocked():  # a signal now would leave a session untracked
                start(job, env)
                running.append(job)
            if not quiet:
                print(f"sweep: started trial {job.result.trial} session "
                      f"{job.result.session} (seed {job.result.seed}, "
                      f"{job.result.device})", flush=True)
        for job in list(running):
            code = poll(job, timeout)
            if code is None:
                continue
            running.remove(job)
            finish(job, code)
            if not quiet:
                status = "ok" if job.result.ok else f"FAILED: {job.result.error[:200]}"
                print(f"sweep: trial {job.result.trial} session {job.result.session} "
                      f"{status}", flush=True)
        if running:
            time.sleep(poll_s)


def stop_all(running: list[Job], grace: float, received: list[int] | None = None) -> None:
    """Stops the running sessions of an interrupted sweep and fills in their results: SIGTERM
    to every session's process group (each run writes its final checkpoint), SIGKILL to those
    still alive after ``grace`` seconds, or at once when ``received`` (the signals that came
    meanwhile) gets one."""
    received = [] if received is None else received
    for job in running:
        if job.proc is not None and job.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(job.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (not received and time.monotonic() < deadline
           and any(j.proc is not None and j.proc.poll() is None for j in running)):
        time.sleep(0.05)
    for job in running:
        if job.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(job.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                job.proc.wait(10.0)
        finish(job, job.proc.returncode if job.proc is not None else -1)
        job.result.error = "sweep interrupted; " + job.result.error
    running.clear()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread, as Ctrl-C raises
    KeyboardInterrupt (nothing is changed outside the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    old = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old if old is not None else signal.SIG_DFL)


@contextlib.contextmanager
def latched() -> Iterator[list[int]]:
    """A block that SIGTERM and SIGINT do not interrupt (the stop of the sessions, the sweep's
    summary): the list yielded gets each one that came (main thread only; elsewhere the list
    stays empty)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    old = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
           for sig in _STOPS}
    try:
        yield received
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """SIGTERM and SIGINT held back in the block (delivered after it), in this thread."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def poll(job: Job, timeout: float | None) -> int | None:
    """``job``'s exit status (-1: it never started), None while it runs; a session past
    ``timeout`` seconds is killed first (:func:`kill`) and its error says so.

    Args:
        job: a started session (:func:`start`).
        timeout: seconds it may run (None: no limit).
    """
    code = job.proc.poll() if job.proc is not None else -1
    if code is None and timeout is not None and time.monotonic() - job.started > timeout:
        kill(job)
        job.result.error = f"timed out after {timeout:g} s; "
        code = job.proc.returncode if job.proc is not None else -1
    return code


def start(job: Job, env: dict[str, str]) -> None:
    """Starts ``job``'s session in its own process group, its stdout and stderr to
    ``stdout.log`` and ``stderr.log`` in its folder (created); a session that cannot start gets
    the reason as its error."""
    job.folder.mkdir(parents=True, exist_ok=True)
    stdout = open(job.folder / "stdout.log", "wb")  # noqa: SIM115
    stderr = open(job.folder / "stderr.log", "wb")  # noqa: SIM115
    job.files = [stdout, stderr]
    job.started = time.monotonic()
    try:
        job.proc = subprocess.Popen(job.cmd, stdout=stdout, stderr=stderr,
                                    stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, preexec_fn=_child_setup())
    except OSError as err:
        job.result.error = f"could not start: {err}"


def _child_setup() -> Callable[[], None]:
    """What a session's process does between fork and exec: SIGTERM and SIGINT as they are by
    default and not blocked (the sweep holds them back while it starts a session), and on Linux
    SIGTERM when the sweep dies (``PR_SET_PDEATHSIG``; ended at once if it died already)."""
    parent = os.getpid()
    prctl = None
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            prctl = ctypes.CDLL(None, use_errno=True).prctl

    def setup() -> None:
        for sig in _STOPS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent:  # the sweep died before the line above
                os.kill(os.getpid(), signal.SIGTERM)

    return setup


def kill(job: Job, grace: float = 5.0) -> None:
    """SIGTERM the session's process group, then SIGKILL it after ``grace`` seconds."""
    proc = job.proc
    if proc is None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
    # The leader is gone; its workers (same group) must go too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def finish(job: Job, code: int) -> None:
    """Ends ``job`` with exit status ``code``: closes its logs, kills what is left of its process
    group, and fills its result from its run folder's ``summary.json`` and, on failure, from
    the last lines of its stderr."""
    for f in job.files:
        f.close()
    job.files = []
    if job.proc is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.proc.pid, signal.SIGKILL)  # stray workers of an exited leader
    result = job.result
    result.returncode = code
    try:
        run_dir = find_run_dir(job.folder)
    except FileNotFoundError as err:
        run_dir, result.error = None, result.error + f"{err}; "
    if run_dir is not None:
        result.run_dir = str(run_dir)
        for key, value in session_outcome(run_dir).items():
            setattr(result, key, value)
    if code != 0:
        tail = _tail(_read_text(job.folder / "stderr.log"))
        result.error += f"exit status {code}" + (f": {tail}" if tail else "")
    elif not result.status:
        result.error += ("exited with status 0 but wrote no summary.json"
                         + (f" in {run_dir}" if run_dir is not None else " (no run folder)"))


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _tail(text: str, lines: int = 5) -> str:
    """The last ``lines`` non-empty lines of ``text``, box-drawing borders (tyro's error
    panels) stripped, joined with `` | ``."""
    kept = [line.strip(" \t" + _BOX) for line in text.splitlines()]
    return " | ".join([line for line in kept if line][-lines:])


def find_run_dir(folder: str | Path) -> Path | None:
    """The one run directory in a session's folder (its ``--runs-dir``); None when the session
    made none (it failed before its run started).

    Raises:
        FileNotFoundError: more than one run directory: the folder is not one session's.
    """
    folder = Path(folder)
    runs = sorted(p for p in folder.iterdir() if p.is_dir() and is_run_dir(p)) \
        if folder.is_dir() else []
    if len(runs) > 1:
        raise FileNotFoundError(f"{folder} holds {len(runs)} run directories, not one "
                                f"({', '.join(p.name for p in runs)})")
    return runs[0] if runs else None


# ------------------------------------------------------------------------------ outcomes
def session_outcome(run_dir: str | Path) -> dict[str, Any]:
    """A run's outcome as its ``summary.json`` says, the run's own verdict (its stop test, with
    the evaluation's veto) rather than a recomputation from ``progress.csv``.

    Args:
        run_dir: the run folder.

    Returns:
        ``{"status", "solved", "frames_to_solve", "time_to_solve", "frames", "wall_time",
        "final_train_return", "eval_return"}``: ``status`` is ``""`` and the numbers nan when
        there is no ``summary.json`` (a run still going, or killed before it could write one);
        ``solved`` is ``status == "solved"``.

    Example:
        >>> import json, tempfile, pathlib
        >>> run = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (run / "summary.json").write_text(json.dumps({"status": "budget",
        ...     "frames": 3000, "wall_time": 5.0, "train_return_mean20": 480.0}))
        >>> out = session_outcome(run)
        >>> out["status"], out["solved"], out["frames"], out["final_train_return"]
        ('budget', False, 3000.0, 480.0)
    """
    summary = read_run(run_dir).summary
    status = str(summary.get("status") or "")
    column = next((key for key in summary if _TRAIN_COLUMN.match(key)), "train_return")
    return {"status": status, "solved": status == "solved",
            "frames_to_solve": _number(summary.get("frames_to_solve")),
            "time_to_solve": _number(summary.get("time_to_solve")),
            "frames": _number(summary.get("frames")),
            "wall_time": _number(summary.get("wall_time")),
            "final_train_return": _number(summary.get(column)),
            "eval_return": _number(summary.get("eval_return"))}


def _number(value: Any) -> float:
    """A summary entry as a float; nan for None, a missing entry or anything not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)
