"""Sessions and trials: one algorithm over several seeds and config variants, in parallel.

``rlstruct sweep ALGO [options] -- [algorithm flags]`` runs ``python -m rlstruct.algos.ALGO``
(what ``rlstruct train ALGO`` runs) once per (trial, seed) pair as a subprocess. A *trial* is one
config variant (a dict of overrides, e.g. ``{"lr": 3e-4}``); a *session* is one seed of a trial.
Layout of ``--out``::

    OUT/
      summary.csv                  one row per session (see SUMMARY_COLUMNS)
      trial0.png                   mean train return vs frames across the sessions of trial 0
                                   (over the longest session; mean and min-max band over the
                                   sessions still running), moving average (--ma-window)
      trial0/session0/             --runs-dir of the session, owned by the sweep: the one run
                                   folder the session makes, stdout.log, stderr.log
      ...

A session's outcome is what its run wrote to ``summary.json`` (status ``solved``, ``budget``,
``failed`` or ``interrupted``, frames, returns): the run's own verdict, evaluation veto
included, never recomputed here. The sweep finds the run folder as the one run directory in
the session's folder, which it creates empty (a folder that already holds a session is refused),
so nothing is read from the session's output.

At most ``max_parallel`` sessions run at once (default: usable cores // ``cores_per_session``);
each gets ``--n-threads 1`` and ``OMP_NUM_THREADS=1`` so sessions do not oversubscribe. Session
``s`` of trial ``t`` learns on :func:`~rlstruct.devices.session_device` ``(t, s, n_seeds, gpus,
cuda_offset)``: with ``gpus > 0`` it gets ``--learner-device cuda:k``; with ``gpus == 0``
(default) no device flag is passed and nothing touches CUDA. ``cuda_offset`` defaults to the
``CUDA_OFFSET`` environment variable (SLM-Lab's convention), else 0.

A session that fails (non-zero exit, timeout) is reported in the summary with the last lines of
its stderr; the others go on. Every session runs in its own process group, waited for with a
deadline, and the whole group is killed on timeout. SIGTERM or Ctrl-C to the sweep stops the
running sessions gracefully, each with its final checkpoint (a second signal: at once), writes
the summary and exits 0 after SIGTERM, 130 after Ctrl-C; a sweep that is killed takes its
sessions with it (:mod:`rlstruct.tools.sessions`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import tyro

from rlstruct.errors import ConfigError
from rlstruct.runs.plotting import MA_WINDOW, trial_figure
from rlstruct.runs.signals import exit_code
from rlstruct.tools.sessions import (
    Job,
    SessionResult,
    find_run_dir,
    finish,
    latched,
    run_sessions,
    session_outcome,
    sigterm_raises,
)
from rlstruct.tools.sweep_plan import (
    SUMMARY_COLUMNS,
    algo_module,
    check_arguments,
    override_flags,
    session_jobs,
    usable_cores,
)

__all__ = [
    "SessionResult", "SUMMARY_COLUMNS", "SweepCommand", "sweep", "main", "override_flags",
    "session_outcome", "find_run_dir",
]

PROG = "rlstruct sweep"


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
    launcher: str = "local",
    slurm_time: int = 60,
    slurm_partition: str | None = None,
) -> list[SessionResult]:
    """Run ``algo`` over ``seeds`` x ``trials`` and write the summary and trial graphs.

    Args:
        algo: the algorithm's name (``python -m rlstruct.algos.<algo>``, as ``rlstruct train``).
        seeds: one session per seed; session ``s`` gets ``seeds[s]``.
        trials: config overrides per trial (``None``: one trial without overrides).
        out: the sweep folder (default ``sweeps/<algo>_<YYYYmmdd-HHMMSS>``); it may exist, but
            not hold a session folder already.
        algo_args: flags given to every session (before the trial's overrides, which win).
        max_parallel: sessions at once (default: usable cores // ``cores_per_session``, >= 1).
        cores_per_session: cores one session keeps busy (1 + its worker processes).
        gpus: GPUs to rotate the learners over (0: no device flag, no CUDA call).
        cuda_offset: added to the rotation (default: ``$CUDA_OFFSET`` or 0).
        timeout: seconds one session may run before its process group is killed (None: no
            limit).
        python: the interpreter of the sessions (default: this one, ``sys.executable``).
        module: the module to run (default ``rlstruct.algos.<algo>``).
        poll_s: how often the running sessions are polled.
        quiet: print nothing.
        ma_window: width, in grid points, of the trial graphs' moving average.
        launcher: ``local``, or ``slurm``: a Slurm job per session (``slurm_sweep``).
        slurm_time, slurm_partition: each Slurm job's ``--time`` (minutes) and partition.

    Returns:
        One :class:`SessionResult` per session, ordered by trial then session.

    Raises:
        ConfigError: no such algorithm (without ``module``); or no seeds, duplicate seeds,
            bad counts, ``gpus`` more than this machine's CUDA devices (none without CUDA), or
            session folders that exist already, every problem at once; or ``launcher``
            ``slurm`` without submitit; before any folder or session exists.
        KeyboardInterrupt: Ctrl-C, or SIGTERM (:class:`~rlstruct.parallel.startup.Terminated`),
            re-raised after every running session was stopped, each with its final checkpoint
            (``rlstruct.tools.sessions``: SIGTERM, then SIGKILL after ``STOP_GRACE_S`` or a
            second signal); the summary is written first.
    """
    seeds = [int(s) for s in seeds]
    trial_list = [dict(t) for t in trials] if trials else [{}]
    out = Path(out) if out is not None else _default_folder(algo)
    module = algo_module(algo, module)
    rotate = gpus if launcher == "local" else 0  # slurm: each job gets its own GPUs
    if launcher == "slurm":  # refused before the sweep folder exists
        _require_submitit()
    check_arguments(seeds, rotate, cores_per_session, max_parallel, ma_window,
                     [out / f"trial{t}" / f"session{s}" for t in range(len(trial_list))
                      for s in range(len(seeds))])
    cuda_offset = int(os.environ.get("CUDA_OFFSET") or 0) if cuda_offset is None else cuda_offset
    max_parallel = max_parallel or max(1, usable_cores() // cores_per_session)  # None: cores
    out.mkdir(parents=True, exist_ok=True)
    jobs = session_jobs([python or sys.executable, "-m", module, *algo_args], trial_list, seeds,
                         out, rotate, cuda_offset)
    _write_json(out / "sweep.json", {
        "algo": algo, "module": module, "seeds": seeds, "trials": trial_list,
        "algo_args": list(algo_args), "max_parallel": max_parallel, "gpus": gpus,
        "cuda_offset": cuda_offset, "timeout": timeout})
    if launcher == "slurm":  # one Slurm job per session (rlstruct/tools/slurm_sweep.py)
        _on_slurm(jobs, out, cores_per_session, gpus, slurm_time, slurm_partition, timeout, quiet)
        return _write_outputs(out, jobs, len(trial_list), quiet, ma_window)
    return _run_here(jobs, out, len(trial_list), max_parallel, timeout, poll_s, quiet,
                     ma_window)


def _run_here(jobs: list[Job], out: Path, n_trials: int, max_parallel: int,
              timeout: float | None, poll_s: float, quiet: bool,
              ma_window: int) -> list[SessionResult]:
    """Runs the sessions as subprocesses here and writes the outputs, also after SIGTERM or
    Ctrl-C (the sessions stopped first, a second signal does not cost the summary)."""
    with sigterm_raises():
        try:
            run_sessions(jobs, max_parallel, timeout, poll_s, quiet)
        except BaseException:
            with latched():
                _write_outputs(out, jobs, n_trials, quiet=True)
            raise
    return _write_outputs(out, jobs, n_trials, quiet, ma_window)


def _require_submitit() -> None:
    from rlstruct.tools.slurm_sweep import require_submitit

    require_submitit()


def _on_slurm(jobs: list[Job], out: Path, cores_per_session: int, gpus: int,
                  slurm_time: int, slurm_partition: str | None, timeout: float | None,
                  quiet: bool) -> None:
    """Runs each session as a Slurm job (:func:`~rlstruct.tools.slurm_sweep.run_on_slurm`) and
    fills in its result."""
    from rlstruct.tools.slurm_sweep import run_on_slurm

    for job, (code, error) in zip(jobs, run_on_slurm(
            [(j.cmd, j.folder, f"t{j.result.trial}s{j.result.session}") for j in jobs],
            out, cores_per_session, gpus, slurm_time, slurm_partition, timeout, quiet)):
        job.result.error, job.result.device = f"{error}; " if error else "", f"slurm {gpus}"
        finish(job, -1 if code is None else code)


def _default_folder(algo: str) -> Path:
    """``sweeps/<algo>_<YYYYmmdd-HHMMSS>``."""
    return Path("sweeps") / f"{algo}_{time.strftime('%Y%m%d-%H%M%S')}"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _write_outputs(out: Path, jobs: list[Job], n_trials: int, quiet: bool,
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
@dataclass
class SweepCommand:
    """Run an algorithm over seeds (sessions) and config variants (trials) in parallel
    processes; the flags after -- go to every session.

    Example: rlstruct sweep ppo --seeds 0 1 --trials '[{"lr": 0.001}]' -- --max-frames 100000
    """

    algo: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="ALGO")]
    """the algorithm, as rlstruct train ALGO names it (ppo, a2c, ...)"""
    seeds: tuple[int, ...] = (0, 1, 2)
    """one session per seed"""
    trials: str | None = None
    """JSON list of config overrides, one trial each, e.g. '[{"lr": 0.001}, {"lr": 0.0003}]'
    (None: one trial without overrides); with --search optuna: the number of trials"""
    max_parallel: int | None = None
    """sessions at once (None: usable cores // --cores-per-session)"""
    cores_per_session: int = 1
    """cores one session keeps busy"""
    gpus: int = 0
    """GPUs to rotate the sessions' learners over (0: no device flag; slurm: GPUs per job)"""
    cuda_offset: int | None = None
    """added to the GPU rotation (None: $CUDA_OFFSET or 0)"""
    out: Path | None = None
    """sweep folder (None: sweeps/ALGO_<time>)"""
    timeout: float | None = None
    """seconds per session before it is killed (None: no limit)"""
    ma_window: int = MA_WINDOW
    """width, in points of the trial graphs' 200-point frames grid, of their moving average"""
    launcher: Literal["local", "slurm"] = "local"
    """local: subprocesses here; slurm: one Slurm job per session (the slurm extra: pip install
    -e '.[slurm]') with --cores-per-session CPUs and --gpus GPUs, requeued and resumed"""
    slurm_time: int = 60
    """slurm: each job's time limit, in minutes"""
    slurm_partition: str | None = None
    """slurm: the partition (None: the default)"""
    search: Literal["grid", "optuna"] = "grid"
    """grid: the --trials given; optuna: --trials N configs drawn from --space by Optuna (the
    optuna extra), pruned by the median, kept in --storage (rlstruct.tools.optuna_search)"""
    space: Path | None = None
    """optuna: the search space, a JSON file (examples/ppo_cartpole_space.json)"""
    storage: str | None = None
    """optuna: the study's storage URL, or journal:PATH (None: sqlite:///OUT/study.db)"""
    study_name: str | None = None
    """optuna: the study (None: ALGO-optuna; OUT defaults to sweeps/NAME); the same storage and
    name continue it"""
    objective: Literal["frames_to_solve", "time_to_solve", "final_return", "eval_return"] = (
        "frames_to_solve")
    """optuna: a trial's score, the mean over its seeds (to_solve: minimised, unsolved runs
    score 2x their frames or seconds; returns: maximised)"""
    sampler_seed: int = 0
    """optuna: the TPE sampler's seed (plus the study's trial count)"""
    report_every: int = 10_000
    """optuna: frames between the train returns a trial reports to the pruner"""
    prune: bool = True
    """optuna: stop the trials the MedianPruner prunes (SIGTERM, final checkpoint)"""
    prune_startup_trials: int = 2
    """optuna: complete trials before any is pruned"""
    algo_args: tyro.conf.Suppress[tuple[str, ...]] = ()
    """the flags after --, given to every session (not a flag: split off before parsing)"""


def main(argv: Sequence[str] | None = None) -> int:
    """``rlstruct sweep ALGO [options] -- [algorithm flags]``.

    Args:
        argv: the words after ``sweep`` (default: ``sys.argv[1:]``); those after the first
            ``--`` are the algorithm's flags, given to every session.

    Returns:
        The exit code: 0 when every session succeeded, 1 when some failed, 130 on Ctrl-C, 0
        after SIGTERM (the sessions stopped gracefully); a usage error exits with 2
        (``SystemExit``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    algo_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, algo_args = argv[:cut], argv[cut + 1:]
    args = tyro.cli(SweepCommand, args=argv, prog=PROG)
    return run(dataclasses.replace(args, algo_args=tuple(algo_args)))


def run(args: SweepCommand) -> int:
    """Runs a parsed ``rlstruct sweep`` command line (see :func:`main`).

    Args:
        args: the parsed flags, ``algo_args`` included.

    Returns:
        The exit code (0, 1 or 130, as :func:`main`).

    Raises:
        SystemExit: with code 2 on a usage error (bad ``--trials``, a ConfigError of
            :func:`sweep`), after one message on stderr.
    """
    if args.search == "optuna":
        return _run_optuna(args)
    if args.space is not None:
        _usage_error("--space is the search space of --search optuna")
    trials = None
    if args.trials is not None:
        try:
            trials = json.loads(args.trials)
        except ValueError as err:
            _usage_error(f"--trials is not JSON: {err}")
        if not isinstance(trials, list) or not all(isinstance(t, dict) for t in trials):
            _usage_error("--trials must be a JSON list of objects")
    try:
        results = sweep(args.algo, seeds=args.seeds, trials=trials, out=args.out,
                        algo_args=args.algo_args, max_parallel=args.max_parallel,
                        cores_per_session=args.cores_per_session, gpus=args.gpus,
                        cuda_offset=args.cuda_offset, timeout=args.timeout,
                        ma_window=args.ma_window, launcher=args.launcher,
                        slurm_time=args.slurm_time, slurm_partition=args.slurm_partition)
    except ConfigError as err:
        _usage_error(str(err))
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (Terminated)
        code = exit_code(stop)
        what = str(stop).removeprefix("signal ") or "SIGINT"
        print(f"sweep: stopped by {what} (exit code {code}); the running sessions were "
              "stopped, each with its final checkpoint, and the summary written",
              file=sys.stderr, flush=True)
        return code
    return 0 if all(r.ok for r in results) else 1


def _run_optuna(args: SweepCommand) -> int:
    """Runs a parsed ``rlstruct sweep --search optuna`` command line.

    Args:
        args: the parsed flags (:class:`~rlstruct.tools.sweep.SweepCommand`), ``algo_args``
            included; ``--trials`` is the number of trials.

    Returns:
        The exit code: 0 when the study has a best trial and no trial of this process failed,
        1 otherwise, 130 on Ctrl-C, 0 after SIGTERM.

    Raises:
        SystemExit: with code 2 on a usage error (no ``--space``, ``--trials`` not a number,
            ``--launcher slurm``, a ConfigError of
            :func:`~rlstruct.tools.optuna_search.optuna_search`), after one message.
    """
    from rlstruct.tools.optuna_search import optuna_search
    from rlstruct.tools.optuna_study import require_optuna

    if args.space is None:
        _usage_error("--search optuna needs --space FILE, the search space (JSON)")
    if args.trials is None or not args.trials.strip().isdigit():
        _usage_error(f"--search optuna takes --trials N, a number of trials, got {args.trials!r}")
    if args.launcher != "local":
        _usage_error("--search optuna runs its sessions here: on Slurm, run one search per job "
                     "on one --storage (docs/guide-clusters.md)")
    try:
        require_optuna().logging.set_verbosity(logging.WARNING)  # the sweep says what happens
        result = optuna_search(
            args.algo, args.space, int(args.trials), out=args.out, storage=args.storage,
            study_name=args.study_name, objective=args.objective, seeds=args.seeds,
            algo_args=args.algo_args, max_parallel=args.max_parallel,
            cores_per_session=args.cores_per_session, gpus=args.gpus,
            cuda_offset=args.cuda_offset, timeout=args.timeout, sampler_seed=args.sampler_seed,
            report_every=args.report_every, prune=args.prune,
            prune_startup_trials=args.prune_startup_trials)
    except ConfigError as err:
        _usage_error(str(err))
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (Terminated)
        code = exit_code(stop)
        print(f"sweep: stopped by {str(stop).removeprefix('signal ') or 'SIGINT'} (exit code "
              f"{code}); the running sessions were stopped, each with its final checkpoint, "
              "their trials marked failed and the summary written", file=sys.stderr, flush=True)
        return code
    return 0 if result.best is not None and not result.failed else 1


def _usage_error(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


if __name__ == "__main__":
    sys.exit(main())
