"""Sessions and trials: one algorithm over several seeds and config variants, in parallel.

``python -m rlstruct sweep ALGO [options] -- [algorithm flags]`` runs ``python -m algos.ALGO``
once per (trial, seed) pair as a subprocess. A *trial* is one config variant (a dict of
overrides, e.g. ``{"lr": 3e-4}``); a *session* is one seed of a trial. Layout of ``--out``::

    OUT/
      summary.csv                  one row per session (see SUMMARY_COLUMNS)
      trial0.png                   mean train return vs frames across the sessions of trial 0
                                   (over the longest session; mean and min-max band over the
                                   sessions still running), moving average (--ma-window)
      trial0/session0/             --runs-dir of the session: its run folder, stdout.log,
                                   stderr.log
      ...

At most ``max_parallel`` sessions run at once (default: usable cores // ``cores_per_session``);
each gets ``--n-threads 1`` and ``OMP_NUM_THREADS=1`` so sessions do not oversubscribe. Session
``s`` of trial ``t`` learns on :func:`~rlstruct.devices.session_device` ``(t, s, n_seeds, gpus,
cuda_offset)``: with ``gpus > 0`` it gets ``--learner-device cuda:k``; with ``gpus == 0``
(default) no device flag is passed and nothing touches CUDA. ``cuda_offset`` defaults to the
``CUDA_OFFSET`` environment variable (SLM-Lab's convention), else 0.

A session that fails (non-zero exit, timeout) is reported in the summary with the last lines of
its stderr; the others go on. Every session runs in its own process group, waited for with a
deadline, and the whole group is killed on timeout, on Ctrl-C and on any error of the sweep.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlstruct.devices import session_device
from rlstruct.errors import ConfigError
from rlstruct.runs.folder import read_run, to_float
from rlstruct.runs.plotting import MA_WINDOW, trial_figure

__all__ = [
    "SessionResult", "SUMMARY_COLUMNS", "sweep", "main", "override_flags", "session_outcome",
]

_OUTPUTS = re.compile(r"^outputs in (.+)$", re.M)
_BOX = "│─╭╮╰╯┃━┏┓┗┛|"

#: The columns of ``summary.csv``, in order.
SUMMARY_COLUMNS = (
    "trial", "session", "seed", "device", "overrides", "returncode", "solved",
    "frames_to_solve", "time_to_solve", "frames", "wall_time", "final_train_return",
    "run_dir", "error",
)


@dataclass
class SessionResult:
    """One session's outcome: a row of ``summary.csv``.

    Attributes:
        trial, session, seed: the indices and the seed.
        device: the learner device given (``"default"`` when no device flag was passed).
        overrides: the trial's overrides, as JSON.
        returncode: the process exit status (negative: killed by that signal; None: not run).
        solved: the stop test fired on the target return (from progress.csv and config.json).
        frames_to_solve, time_to_solve: frames and seconds at the first row that met it.
        frames, wall_time: of the last progress row.
        final_train_return: the last row's ``train_return_mean<N>``.
        run_dir: the session's run folder ("" when none was made).
        error: "" for a good session, else why it failed and its last stderr lines.
    """

    trial: int
    session: int
    seed: int
    device: str
    overrides: str = "{}"
    returncode: int | None = None
    solved: bool = False
    frames_to_solve: float = math.nan
    time_to_solve: float = math.nan
    frames: float = math.nan
    wall_time: float = math.nan
    final_train_return: float = math.nan
    run_dir: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        """True when the session exited with status 0."""
        return self.returncode == 0 and not self.error


@dataclass
class _Job:
    result: SessionResult
    cmd: list[str]
    folder: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    files: list[Any] = field(default_factory=list)


def override_flags(overrides: Mapping[str, Any]) -> list[str]:
    """Command-line flags of a trial's overrides, in tyro's spelling.

    Example:
        >>> override_flags({"n_epochs": 4, "anneal_lr": False, "value_clip": None})
        ['--n-epochs', '4', '--no-anneal-lr', '--value-clip', 'None']

    Raises:
        ConfigError: a key is not an identifier.
    """
    flags: list[str] = []
    for key, value in overrides.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)):
            raise ConfigError(f"trial override {key!r} is not a config field name")
        name = str(key).replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(value, (list, tuple)):
            flags += [f"--{name}", *map(str, value)]
        else:
            flags += [f"--{name}", str(value)]
    return flags


def sweep(
    algo: str,
    seeds: Sequence[int] = (0, 1, 2),
    trials: Sequence[Mapping[str, Any]] | None = None,
    out: str | Path | None = None,
    algo_args: Sequence[str] = (),
    max_parallel: int | None = None,
    cores_per_session: int = 1,
    gpus: int = 0,
    cuda_offset: int | None = None,
    timeout: float | None = None,
    python: str | None = None,
    module: str | None = None,
    poll_s: float = 0.2,
    quiet: bool = False,
    ma_window: int = MA_WINDOW,
) -> list[SessionResult]:
    """Run ``algo`` over ``seeds`` x ``trials`` and write the summary and trial graphs.

    Args:
        algo: the algorithm's name (``python -m algos.<algo>``).
        seeds: one session per seed; session ``s`` gets ``seeds[s]``.
        trials: config overrides per trial (``None``: one trial without overrides).
        out: the sweep folder (default ``sweeps/<algo>_<YYYYmmdd-HHMMSS>``).
        algo_args: flags given to every session (before the trial's overrides, which win).
        max_parallel: sessions at once (default: usable cores // ``cores_per_session``, >= 1).
        cores_per_session: cores one session keeps busy (1 + its worker processes).
        gpus: GPUs to rotate the learners over (0: no device flag, no CUDA call).
        cuda_offset: added to the rotation (default: ``$CUDA_OFFSET`` or 0).
        timeout: seconds one session may run before its process group is killed (None: no
            limit).
        python: the interpreter of the sessions (default: this one, ``sys.executable``).
        module: the module to run (default ``algos.<algo>``).
        poll_s: how often the running sessions are polled.
        quiet: print nothing.
        ma_window: width, in grid points, of the trial graphs' moving average.

    Returns:
        One :class:`SessionResult` per session, ordered by trial then session.

    Raises:
        ConfigError: no seeds, duplicate seeds, bad counts, or ``gpus`` more than this
            machine's CUDA devices (none without CUDA); every problem at once, before any
            folder or session exists.
        KeyboardInterrupt: re-raised after every running session was killed (the summary of
            the sessions that finished is written first).
    """
    seeds = [int(s) for s in seeds]
    _check_arguments(seeds, gpus, cores_per_session, max_parallel, ma_window)
    if cuda_offset is None:
        cuda_offset = int(os.environ.get("CUDA_OFFSET", "0") or 0)
    trial_list = [dict(t) for t in trials] if trials else [{}]
    if max_parallel is None:
        max_parallel = max(1, _usable_cores() // cores_per_session)
    out = Path(out) if out is not None else Path("sweeps") / (
        f"{algo}_{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    module = module or f"rlstruct.algos.{algo}"

    jobs: list[_Job] = []
    for t, overrides in enumerate(trial_list):
        flags = override_flags(overrides)
        for s, seed in enumerate(seeds):
            folder = out / f"trial{t}" / f"session{s}"
            device = session_device(t, s, len(seeds), gpus, cuda_offset) if gpus else None
            cmd = [python or sys.executable, "-m", module, *algo_args, *flags, "--seed", str(seed),
                   "--n-threads", "1", "--runs-dir", str(folder)]
            if device is not None:
                cmd += ["--learner-device", str(device)]
            result = SessionResult(t, s, seed, str(device) if device else "default",
                                   json.dumps(overrides, sort_keys=True))
            jobs.append(_Job(result, cmd, folder))
    (out / "sweep.json").write_text(json.dumps({
        "algo": algo, "module": module, "seeds": seeds, "trials": trial_list,
        "algo_args": list(algo_args), "max_parallel": max_parallel, "gpus": gpus,
        "cuda_offset": cuda_offset, "timeout": timeout,
    }, indent=2) + "\n")

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    pending, running = list(jobs), []
    try:
        while pending or running:
            while pending and len(running) < max_parallel:
                job = pending.pop(0)
                _start(job, env)
                running.append(job)
                if not quiet:
                    print(f"sweep: started trial {job.result.trial} session "
                          f"{job.result.session} (seed {job.result.seed}, "
                          f"{job.result.device})", flush=True)
            for job in list(running):
                code = job.proc.poll() if job.proc is not None else -1
                if code is None and timeout is not None and (
                        time.monotonic() - job.started > timeout):
                    _kill(job)
                    job.result.error = f"timed out after {timeout:g} s; "
                    code = job.proc.returncode if job.proc is not None else -1
                if code is None:
                    continue
                running.remove(job)
                _finish(job, code)
                if not quiet:
                    status = "ok" if job.result.ok else f"FAILED: {job.result.error[:200]}"
                    print(f"sweep: trial {job.result.trial} session {job.result.session} "
                          f"{status}", flush=True)
            if running:
                time.sleep(poll_s)
    except BaseException:
        for job in running:
            _kill(job)
            _finish(job, job.proc.returncode if job.proc is not None else -1)
            job.result.error = "sweep interrupted; " + job.result.error
        for job in pending:
            job.result.error = "not run: sweep interrupted"
        _write_outputs(out, jobs, len(trial_list), quiet=True)
        raise
    results = _write_outputs(out, jobs, len(trial_list), quiet, ma_window)
    return results


def _check_arguments(seeds: list[int], gpus: int, cores_per_session: int,
                     max_parallel: int | None, ma_window: int) -> None:
    """Every problem with the sweep's arguments at once, as one ConfigError."""
    problems = []
    if not seeds:
        problems.append("give at least one seed")
    if len(set(seeds)) != len(seeds):
        problems.append(f"seeds must be distinct, got {seeds}")
    if gpus < 0:
        problems.append(f"gpus must be >= 0, got {gpus}")
    if cores_per_session < 1:
        problems.append(f"cores_per_session must be >= 1, got {cores_per_session}")
    if max_parallel is not None and max_parallel < 1:
        problems.append(f"max_parallel must be >= 1, got {max_parallel}")
    if ma_window < 1:
        problems.append(f"ma_window must be >= 1, got {ma_window}")
    if gpus > 0:
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < gpus:
            where = (f"this machine has {found} CUDA device{'s' if found != 1 else ''}"
                     if found else "CUDA is not available on this machine")
            problems.append(f"gpus={gpus} (--gpus) asks for {gpus} GPUs but {where}; give at "
                            f"most {found}, or run the sweep where the GPUs are")
    if problems:
        raise ConfigError("sweep: " + "; ".join(problems))


# ------------------------------------------------------------------------------ subprocesses
def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _start(job: _Job, env: dict[str, str]) -> None:
    job.folder.mkdir(parents=True, exist_ok=True)
    stdout = open(job.folder / "stdout.log", "wb")  # noqa: SIM115
    stderr = open(job.folder / "stderr.log", "wb")  # noqa: SIM115
    job.files = [stdout, stderr]
    job.started = time.monotonic()
    try:
        job.proc = subprocess.Popen(job.cmd, stdout=stdout, stderr=stderr,
                                    stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
    except OSError as err:
        job.result.error = f"could not start: {err}"


def _kill(job: _Job, grace: float = 5.0) -> None:
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


def _finish(job: _Job, code: int) -> None:
    for f in job.files:
        f.close()
    job.files = []
    if job.proc is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.proc.pid, signal.SIGKILL)  # stray workers of an exited leader
    result = job.result
    result.returncode = code
    stdout = _read_text(job.folder / "stdout.log")
    run_dir = _run_dir(job.folder, stdout)
    if run_dir is not None:
        result.run_dir = str(run_dir)
        outcome = session_outcome(run_dir)
        for key, value in outcome.items():
            setattr(result, key, value)
    if code != 0:
        tail = _tail(_read_text(job.folder / "stderr.log"))
        result.error += f"exit status {code}" + (f": {tail}" if tail else "")


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


def _run_dir(folder: Path, stdout: str) -> Path | None:
    """The run folder a session printed (``outputs in <dir>``), else the one it made."""
    printed = _OUTPUTS.findall(stdout)
    if printed and Path(printed[-1].strip()).is_dir():
        return Path(printed[-1].strip())
    made = sorted(p for p in folder.iterdir() if p.is_dir() and (p / "config.json").is_file())
    return made[-1] if made else None


# ------------------------------------------------------------------------------ outcomes
def session_outcome(run_dir: str | Path) -> dict[str, Any]:
    """Solved, frames and time to solve, last frames, wall time and train return of a run.

    Read from ``progress.csv`` and ``config.json`` (``target_return``, ``target_window``): a
    row meets the target when its ``train_return_mean<N>`` reaches ``target_return`` with at
    least ``target_window`` episodes recorded (the stop test of :class:`~rlstruct.runs.run.Run`).

    Returns:
        ``{"solved", "frames_to_solve", "time_to_solve", "frames", "wall_time",
        "final_train_return"}`` (nan where unknown).
    """
    run = read_run(run_dir)
    rows = run.progress
    out: dict[str, Any] = {"solved": False, "frames_to_solve": math.nan,
                           "time_to_solve": math.nan, "frames": math.nan,
                           "wall_time": math.nan, "final_train_return": math.nan}
    if not rows:
        return out
    column = run.train_column
    last = rows[-1]
    out.update(frames=to_float(last.get("frames")), wall_time=to_float(last.get("wall_time")),
               final_train_return=to_float(last.get(column)))
    target, window = run.config.get("target_return"), run.config.get("target_window", 0)
    if isinstance(target, (int, float)) and not isinstance(target, bool):
        for row in rows:
            value = to_float(row.get(column))
            if (not math.isnan(value) and value >= target
                    and to_float(row.get("episodes")) >= window):
                out.update(solved=True, frames_to_solve=to_float(row.get("frames")),
                           time_to_solve=to_float(row.get("wall_time")))
                break
    return out


def _write_outputs(out: Path, jobs: list[_Job], n_trials: int, quiet: bool,
                   ma_window: int = MA_WINDOW) -> list[SessionResult]:
    results = [job.result for job in jobs]
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
        writer.writeheader()
        for r in results:
            writer.writerow({k: v for k, v in asdict(r).items() if k in SUMMARY_COLUMNS})
    for t in range(n_trials):
        runs = [r.run_dir for r in results if r.trial == t and r.ok and r.run_dir]
        try:
            trial_figure(runs, out / f"trial{t}.png", title=f"{out.name} trial {t}",
                         ma_window=ma_window)
        except ImportError:
            if not quiet:
                print("sweep: matplotlib is not installed: no trial graphs", file=sys.stderr)
            break
    if not quiet:
        good = sum(r.ok for r in results)
        print(f"sweep: {good}/{len(results)} sessions ok; summary in {out / 'summary.csv'}",
              flush=True)
    return results


# ------------------------------------------------------------------------------ command line
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rlstruct sweep ALGO [options] -- [algorithm flags]``; returns the exit code:
    0 when every session succeeded, 1 when some failed, 2 on a usage error, 130 on Ctrl-C."""
    argv = list(sys.argv[1:] if argv is None else argv)
    algo_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, algo_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(
        prog="python -m rlstruct sweep",
        description="Run an algorithm over seeds (sessions) and config variants (trials) in "
                    "parallel processes; flags after -- go to every session.")
    parser.add_argument("algo", help="algorithm: python -m algos.ALGO")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="one session per seed (default: 0 1 2)")
    parser.add_argument("--trials", type=str, default=None,
                        help='JSON list of config overrides, one trial each, e.g. '
                             '\'[{"lr": 0.001}, {"lr": 0.0003}]\' (default: one trial)')
    parser.add_argument("--max-parallel", type=int, default=None,
                        help="sessions at once (default: cores // --cores-per-session)")
    parser.add_argument("--cores-per-session", type=int, default=1,
                        help="cores one session keeps busy (default: 1)")
    parser.add_argument("--gpus", type=int, default=0,
                        help="GPUs to rotate the sessions' learners over (default: 0, no flag)")
    parser.add_argument("--cuda-offset", type=int, default=None,
                        help="added to the GPU rotation (default: $CUDA_OFFSET or 0)")
    parser.add_argument("--out", type=Path, default=None,
                        help="sweep folder (default: sweeps/ALGO_<time>)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per session before it is killed (default: none)")
    parser.add_argument("--ma-window", type=int, default=MA_WINDOW,
                        help=f"width, in points of the trial graphs' 200-point frames grid, "
                             f"of their moving average (default: {MA_WINDOW})")
    args = parser.parse_args(argv)
    trials = None
    if args.trials is not None:
        try:
            trials = json.loads(args.trials)
        except ValueError as err:
            parser.error(f"--trials is not JSON: {err}")
        if not isinstance(trials, list) or not all(isinstance(t, dict) for t in trials):
            parser.error("--trials must be a JSON list of objects")
    try:
        results = sweep(args.algo, seeds=args.seeds, trials=trials, out=args.out,
                        algo_args=algo_args, max_parallel=args.max_parallel,
                        cores_per_session=args.cores_per_session, gpus=args.gpus,
                        cuda_offset=args.cuda_offset, timeout=args.timeout,
                        ma_window=args.ma_window)
    except ConfigError as err:
        parser.error(str(err))
    except KeyboardInterrupt:
        print("sweep: interrupted; running sessions killed", file=sys.stderr)
        return 130
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
