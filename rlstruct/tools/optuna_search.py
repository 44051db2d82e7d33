"""Hyperparameter search with Optuna: ``rlstruct sweep ALGO --search optuna --space SPACE.json
--trials N [--storage URL] [--study-name NAME] ... -- [fixed algorithm flags]``.

The search runs on the sweep's machinery (:mod:`rlstruct.tools.sweep`,
:mod:`rlstruct.tools.sessions`): a *trial* is one config drawn from the space file
(:mod:`rlstruct.tools.optuna_space`) by Optuna's seeded ``TPESampler``; it runs as one session per
seed, each a subprocess ``python -m rlstruct.algos.ALGO [fixed flags] [trial's flags] --seed S``
in its own process group, at most ``max_parallel`` sessions at once (trials overlap to keep them
busy), with the sweep's deadlines and graceful stop. Layout of ``--out``::

    OUT/
      study.db                  the Optuna study (SQLite; the default --storage)
      summary.csv               one row per session of every trial of the study (sweep's
                                columns, then the trial's state and objective value)
      best.json                 the best trial: params, value, its `rlstruct train` line
      optuna_history.png        objective per trial and best so far
      optuna_importances.png    the params' importances (from 2 completed trials on)
      trial<n>/session<s>/      trial n's session s: its run folder and logs, as a sweep's

**Objective** (``--objective``), one value per session, averaged over the trial's sessions:

- ``frames_to_solve`` (default, minimised): the frames at which the run solved the env, its
  ``summary.json``'s ``frames_to_solve`` (the run's own verdict, evaluation veto included); a
  run that did not solve scores ``UNSOLVED_PENALTY`` (2) times the frames it ran
  (:mod:`rlstruct.tools.optuna_study`), so any solve beats no solve within the same
  ``--max-frames`` budget, and an unsolved run still counts.
- ``time_to_solve`` (minimised): the same in seconds (unsolved: the penalty times its wall time).
- ``final_return`` (maximised): the summary's train return (``train_return_mean<N>``).
- ``eval_return`` (maximised): its last greedy evaluation (the run needs ``--eval-every``).

A session that fails fails its trial (state ``FAIL``, not counted).
**Pruning**: Optuna's ``MedianPruner`` (after ``prune_startup_trials`` completed trials). While a
trial runs, each session's own ``progress.csv`` is read as it grows (its ``frames`` column and
its train return, ``train_return_mean<N>``); every ``report_every`` frames the trial reports
the mean over its sessions of the last train return at that frame count (``trial.report``,
step = frames; a minimised objective reports minus the return, so that lower is better for
the pruner too). A trial the pruner stops has its sessions stopped as the sweep stops them:
SIGTERM to each process group (each run writes its final checkpoint and ``summary.json``,
status ``interrupted``), SIGKILL after :data:`~rlstruct.tools.sessions.STOP_GRACE_S`; it is
marked ``PRUNED``.

**Storage**: ``sqlite:///OUT/study.db`` by default, any RDB URL, or ``journal:PATH``
(:mod:`rlstruct.tools.optuna_study`); several processes or Slurm jobs can work on one study, and
a search run again with the same storage and study name continues it: it starts at most
``n_trials`` trials, and none once the study holds ``n_trials`` complete or pruned ones. Each
process seeds its ``TPESampler`` with ``sampler_seed`` plus the study's trial count.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlstruct.errors import ConfigError
from rlstruct.parallel.startup import Terminated
from rlstruct.tools.optuna_space import Param, read_space
from rlstruct.tools.optuna_study import (
    OBJECTIVES,
    check_folders,
    objective_value,
    open_study,
    require_optuna,
    write_outputs,
    write_summary,
)
from rlstruct.tools.session_curve import SessionCurve
from rlstruct.tools.sessions import (
    STOP_GRACE_S,
    Job,
    SessionResult,
    finish,
    kill,
    latched,
    poll,
    signals_blocked,
    start,
    stop_all,
)
from rlstruct.tools.sweep_plan import (
    SUMMARY_COLUMNS,
    algo_module,
    check_arguments,
    session_jobs,
    usable_cores,
)

__all__ = ["SearchResult", "optuna_search"]


@dataclass
class SearchResult:
    """What one process's search did.

    Attributes:
        best: the study's best trial as ``best.json`` holds it (None: no complete trial).
        results: the sessions this process ran, by trial then session.
        failed: the trials this process ran that failed.
    """

    best: dict[str, Any] | None
    results: list[SessionResult]
    failed: int


@dataclass
class _Trial:
    """A trial this process runs: the Optuna trial, its sessions, their progress curves, the
    last step reported, and once pruned the time its sessions are SIGKILLed."""

    trial: Any
    jobs: list[Job]
    curves: list[SessionCurve]
    step: int = 0
    pruned: bool = False
    kill_at: float = math.inf

    def ended(self, job: Job) -> bool:
        return job.result.returncode is not None or (self.pruned and not job.started)


@dataclass
class _Search:
    """The state of one process's search."""

    study: Any
    space: dict[str, Param]
    n_trials: int
    prefix: list[str]
    seeds: list[int]
    out: Path
    objective: str
    max_parallel: int
    gpus: int
    cuda_offset: int
    timeout: float | None
    report_every: int
    prune: bool
    poll_s: float
    quiet: bool
    env: dict[str, str]
    started: int = 0
    failed: int = 0
    active: list[_Trial] = field(default_factory=list)
    results: list[SessionResult] = field(default_factory=list)

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"sweep: {text}", flush=True)


def optuna_search(
    algo: str,
    space: str | Path,
    n_trials: int,
    out: str | Path | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    objective: str = "frames_to_solve",
    seeds: Sequence[int] = (0,),
    algo_args: Sequence[str] = (),
    max_parallel: int | None = None,
    cores_per_session: int = 1,
    gpus: int = 0,
    cuda_offset: int | None = None,
    timeout: float | None = None,
    sampler_seed: int = 0,
    report_every: int = 10_000,
    prune: bool = True,
    prune_startup_trials: int = 2,
    python: str | None = None,
    module: str | None = None,
    poll_s: float = 0.5,
    quiet: bool = False,
) -> SearchResult:
    """Search ``algo``'s hyperparameters over ``space`` with Optuna (see the module docstring).

    Args:
        algo: the algorithm (``rlstruct.algos.<algo>``); its ``Config`` checks the space.
        space: the space file (JSON, :mod:`rlstruct.tools.optuna_space`).
        n_trials: complete or pruned trials the study should hold (this process starts <= as many).
        out: the search folder (default ``sweeps/<study_name>``).
        storage: an Optuna storage URL, or ``journal:PATH`` (default ``sqlite:///OUT/study.db``).
        study_name: the study (default ``<algo>-optuna``).
        objective: one of :data:`~rlstruct.tools.optuna_study.OBJECTIVES`.
        seeds: one session per seed in every trial.
        algo_args: the fixed flags, given to every session before the trial's.
        sampler_seed: the TPESampler's seed (plus the study's trial count at the start).
        report_every: frames between the intermediate values a trial reports to the pruner.
        prune: prune with the MedianPruner (False: every trial runs to its end).
        prune_startup_trials: completed trials before the pruner prunes.
        quiet: as :func:`~rlstruct.tools.sweep.sweep`'s; so are ``max_parallel``, ``gpus``,
            ``cores_per_session``, ``cuda_offset``, ``timeout``, ``python``, ``module``, ``poll_s``.

    Returns:
        The best trial (as ``best.json``), this process's sessions and its failed trials.

    Raises:
        ConfigError: optuna is missing, the space file or an argument is bad, the storage cannot
            be opened, or the study was made with another algorithm, objective or fixed flags;
            before any session starts.
        KeyboardInterrupt: Ctrl-C or SIGTERM, re-raised once the running sessions were stopped
            (each with its final checkpoint), their trials marked failed and the outputs written.
    """
    optuna = require_optuna()
    config = _config_class(algo)
    module = algo_module(algo, module)
    params = read_space(space, config)
    study_name = study_name or f"{algo}-optuna"
    out = Path(out) if out is not None else Path("sweeps") / study_name
    seeds = [int(s) for s in seeds]
    _check_search(objective, n_trials, report_every, prune_startup_trials)
    check_arguments(seeds, gpus, cores_per_session, max_parallel, 1, [])
    study, url = _study(optuna, out, storage, study_name, algo, objective, list(algo_args),
                        sampler_seed, prune_startup_trials if prune else None)
    s = _Search(study, params, n_trials, [python or sys.executable, "-m", module, *algo_args],
                seeds, out, objective, max_parallel or max(1, usable_cores() // cores_per_session),
                gpus, int(os.environ.get("CUDA_OFFSET") or 0) if cuda_offset is None
                else cuda_offset, timeout, report_every, prune, poll_s, quiet,
                dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    # a signal stops the loop between two steps, not inside a storage call; a second one while
    # the sessions stop SIGKILLs them at once
    with latched() as received:
        try:
            _loop(s, received)
        except BaseException:
            received.clear()
            _interrupt(s, received)
            raise
    best = write_outputs(study, out, algo, url, objective, quiet)
    return SearchResult(best, s.results, s.failed)


def _study(optuna: Any, out: Path, storage: str | None, name: str, algo: str, objective: str,
           algo_args: list[str], seed: int, startup: int | None) -> tuple[Any, str]:
    """The study and its storage URL, with this process's TPESampler, seeded with ``seed`` plus
    the study's trial count (two processes on one study draw apart), and its MedianPruner
    (``startup`` None: none); ``out`` exists once it returns."""
    if storage is None:  # the default storage lives in the folder
        out.mkdir(parents=True, exist_ok=True)
    url = storage or f"sqlite:///{out.resolve() / 'study.db'}"
    study = open_study(optuna, url, name, algo, objective, algo_args)
    out.mkdir(parents=True, exist_ok=True)
    study.sampler = optuna.samplers.TPESampler(seed=seed + len(study.trials))
    study.pruner = (optuna.pruners.NopPruner() if startup is None
                    else optuna.pruners.MedianPruner(n_startup_trials=startup))
    check_folders(out, len(study.trials))
    return study, url


def _config_class(algo: str) -> type:
    import importlib

    try:
        return importlib.import_module(f"rlstruct.algos.{algo}").Config
    except (ImportError, AttributeError):
        raise ConfigError(f"sweep --search optuna: no algorithm {algo!r} with a Config (no "
                          f"rlstruct.algos.{algo}.Config; rlstruct train --help lists them)"
                          ) from None


def _check_search(objective: str, n_trials: int, report_every: int, startup: int) -> None:
    """The search's own arguments, every problem at once."""
    problems = []
    if objective not in OBJECTIVES:
        problems.append(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if n_trials < 1:
        problems.append(f"--trials must be >= 1, got {n_trials}")
    if report_every < 1:
        problems.append(f"report_every must be >= 1 frame, got {report_every}")
    if startup < 0:
        problems.append(f"prune_startup_trials must be >= 0, got {startup}")
    if problems:
        raise ConfigError("sweep --search optuna: " + "; ".join(problems))


# ------------------------------------------------------------------------------ the loop
def _loop(s: _Search, received: list[int]) -> None:
    """Starts trials and sessions, polls them, reports and prunes, until the study holds
    ``n_trials`` finished trials or this process started as many and all ended.

    Raises:
        Terminated: a signal came (``received``: the signals latched meanwhile).
    """
    while True:
        if received:
            raise Terminated(received[0])
        _start_trials(s)
        running = _running(s)
        for t in s.active:
            for job in t.jobs:
                if not job.started and not t.pruned and running < s.max_parallel:
                    with signals_blocked():  # a signal now would leave a session untracked
                        start(job, s.env)
                    running += 1
        for t in list(s.active):
            _poll_trial(s, t)
        if not s.active and not _can_start(s):
            return
        if not received:
            time.sleep(s.poll_s)


def _running(s: _Search) -> int:
    return sum(1 for t in s.active for j in t.jobs if j.started and j.result.returncode is None)


def _can_start(s: _Search) -> bool:
    if s.started >= s.n_trials:
        return False
    import optuna

    done = s.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                      optuna.trial.TrialState.PRUNED))
    return len(done) + len(s.active) < s.n_trials


def _start_trials(s: _Search) -> None:
    """Asks for new trials while every session of the active ones started and slots are free."""
    while (_running(s) < s.max_parallel and _can_start(s)
           and all(j.started or t.pruned for t in s.active for j in t.jobs)):
        trial = s.study.ask()
        params = {name: p.suggest(trial) for name, p in s.space.items()}
        jobs = session_jobs(s.prefix, [params], s.seeds, s.out, s.gpus, s.cuda_offset,
                             first_trial=trial.number)
        s.started += 1
        taken = [str(j.folder) for j in jobs if j.folder.exists()]
        if taken:
            s.failed += 1
            trial.set_user_attr("error", f"session folder {taken[0]} exists already")
            s.study.tell(trial, state=_state("FAIL"))
            continue
        s.active.append(_Trial(trial, jobs, [SessionCurve(j.folder) for j in jobs]))
        s.say(f"trial {trial.number}: {json.dumps(params)}")


def _poll_trial(s: _Search, t: _Trial) -> None:
    """Polls the sessions of ``t``, reports its progress, prunes it, and ends it once every
    session ended."""
    for job in t.jobs:
        if job.started and job.result.returncode is None:
            code = poll(job, s.timeout)
            if code is None and time.monotonic() > t.kill_at:
                kill(job, grace=0.0)
                code = job.proc.returncode if job.proc is not None else -1
            if code is not None:
                finish(job, code)
    ended = all(t.ended(j) for j in t.jobs)
    if not t.pruned and _report(s, t, may_prune=not ended):
        t.pruned, t.kill_at = True, time.monotonic() + STOP_GRACE_S
        s.say(f"trial {t.trial.number} pruned at {t.step} frames: stopping its sessions")
        for job in t.jobs:
            if job.proc is not None and job.result.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(job.proc.pid, signal.SIGTERM)
    if ended:
        s.active.remove(t)
        _tell(s, t)


def _report(s: _Search, t: _Trial, may_prune: bool) -> bool:
    """Reports ``t``'s mean train return at each ``report_every`` frames that all its sessions
    passed (or ended before); True when the pruner says to prune it (asked only while
    ``may_prune``: a trial whose sessions all ended is complete)."""
    for curve in t.curves:
        curve.update()
    sign = 1.0 if OBJECTIVES[s.objective] == "maximize" else -1.0
    reach = max(c.frames for c in t.curves)
    while t.step + s.report_every <= reach:
        step = t.step + s.report_every
        if not all(c.frames >= step or t.ended(j) for c, j in zip(t.curves, t.jobs)):
            break
        t.step = step
        values = [v for v in (c.value_at(step) for c in t.curves) if math.isfinite(v)]
        if values:
            t.trial.report(sign * sum(values) / len(values), step)
            if may_prune and s.prune and t.trial.should_prune():
                return True
    return False


def _tell(s: _Search, t: _Trial) -> None:
    """Ends ``t`` in the study: pruned, complete with its objective value, or failed."""
    results = [j.result for j in t.jobs]
    number = t.trial.number
    if t.pruned:
        for job in t.jobs:  # stopped on purpose: no error when the run stopped gracefully
            r = job.result
            if not job.started:
                r.error = "not run: trial pruned"
            elif r.status == "interrupted":
                r.error = ""
            elif r.error:
                r.error = f"pruned, then: {r.error}"
        state, value, error = "PRUNED", None, ""
    else:
        value, error = objective_value(results, s.objective)
        state = "FAIL" if value is None else "COMPLETE"
    t.trial.set_user_attr("sessions", [_row(r) for r in results])
    if error:
        t.trial.set_user_attr("error", error)
    s.study.tell(t.trial, value, state=_state(state) if state != "COMPLETE" else None)
    s.failed += state == "FAIL"
    s.results += results
    s.say(f"trial {number} {state.lower()}" + (f": {s.objective} {value:g}" if value is not None
                                               else f": {error[:300]}" if error else ""))


def _interrupt(s: _Search, received: list[int]) -> None:
    """After Ctrl-C or SIGTERM: stops the running sessions (each with its final checkpoint),
    marks their trials failed and writes the outputs."""
    running = [j for t in s.active for j in t.jobs if j.started and j.result.returncode is None]
    stop_all(running, STOP_GRACE_S, received)
    for t in s.active:
        s.results += [j.result for j in t.jobs]
        with contextlib.suppress(Exception):  # the storage may be what failed
            t.trial.set_user_attr("sessions", [_row(j.result) for j in t.jobs if j.started])
            t.trial.set_user_attr("error", "search interrupted")
            s.study.tell(t.trial, state=_state("FAIL"))
    s.active.clear()
    with contextlib.suppress(Exception):  # the interrupt, not a broken storage, is the news
        write_summary(s.study, s.out)


def _state(name: str) -> Any:
    import optuna

    return optuna.trial.TrialState[name]


def _row(result: SessionResult) -> dict[str, Any]:
    return {k: v for k, v in asdict(result).items() if k in SUMMARY_COLUMNS}
