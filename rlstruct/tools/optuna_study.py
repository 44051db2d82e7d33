"""The study of an Optuna search (:mod:`rlstruct.tools.optuna_search`): where it is stored,
how it is opened, and what is written from it.

- :func:`open_study` creates or loads a study (``load_if_exists``) from a storage URL: any URL
  Optuna's RDB storage takes (``sqlite:///OUT/study.db``, ``postgresql://...``), or
  ``journal:PATH`` for Optuna's journal file (``JournalFileBackend``: one file, appended under a
  lock, which works on a shared filesystem where SQLite's locks do not). The study keeps the
  algorithm, the objective and the fixed flags it was made with as user attributes; opening it
  with others is refused.
- :func:`objective_value` is a trial's score from its sessions' outcomes (:data:`OBJECTIVES`,
  :data:`UNSOLVED_PENALTY`; see :mod:`rlstruct.tools.optuna_search`).
- :func:`write_outputs` writes, from everything the study holds (every process's trials),
  ``summary.csv`` (:data:`STUDY_COLUMNS`: one row per session, from each trial's ``sessions``
  user attribute), ``best.json`` (the best complete trial's params, value and
  :func:`train_command`), ``optuna_history.png`` and, from 2 complete trials on,
  ``optuna_importances.png`` (``optuna.visualization.matplotlib``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlstruct.errors import ConfigError, install_hint
from rlstruct.tools.sessions import SessionResult
from rlstruct.tools.sweep_plan import SUMMARY_COLUMNS, override_flags

__all__ = ["OBJECTIVES", "UNSOLVED_PENALTY", "STUDY_COLUMNS", "objective_value",
           "require_optuna", "open_study", "check_folders", "write_summary", "write_outputs",
           "train_command"]

#: The objectives and their directions.
OBJECTIVES: dict[str, str] = {"frames_to_solve": "minimize", "time_to_solve": "minimize",
                              "final_return": "maximize", "eval_return": "maximize"}

#: An unsolved session's frames_to_solve (time_to_solve): this many times the frames (seconds)
#: it ran.
UNSOLVED_PENALTY = 2.0

#: The columns of an Optuna search's ``summary.csv``: the sweep's, then the trial's.
STUDY_COLUMNS = (*SUMMARY_COLUMNS, "state", "value")


def require_optuna() -> Any:
    """Optuna, which ``--search optuna`` needs (the ``optuna`` extra).

    Raises:
        ConfigError: optuna is not installed.
    """
    try:
        import optuna
    except ImportError:
        raise ConfigError("sweep --search optuna needs optuna (the 'optuna' extra), which is "
                          "not installed: " + install_hint("optuna")) from None
    return optuna


def open_study(optuna: Any, url: str, name: str, algo: str, objective: str,
               algo_args: list[str]) -> Any:
    """The study ``name`` of the storage at ``url``, created or loaded (``load_if_exists``).

    Args:
        optuna: the optuna module (:func:`require_optuna`).
        url: an RDB storage URL, or ``journal:PATH``.
        name: the study's name.
        algo, objective, algo_args: what the study is made for, kept as its user attributes.

    Returns:
        The ``optuna.Study`` (its direction: the objective's, :data:`OBJECTIVES`).

    Raises:
        ConfigError: the storage cannot be opened, or the study was made for another
            algorithm, objective (direction) or fixed flags.
    """
    storage: Any = url
    if url.startswith("journal:"):
        storage = _journal(optuna, url.removeprefix("journal:"))
    try:
        study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True,
                                    direction=OBJECTIVES[objective])
    except Exception as err:  # noqa: BLE001 - a bad URL raises many types: name it
        raise ConfigError(f"sweep --search optuna: cannot open study {name!r} at {url}: "
                          f"{type(err).__name__}: {err}") from None
    made = {"algo": algo, "objective": objective, "algo_args": algo_args}
    kept = {k: study.user_attrs[k] for k in made if k in study.user_attrs}
    differ = [f"{k} {kept[k]!r} (this search: {made[k]!r})" for k in kept if kept[k] != made[k]]
    if study.direction.name.lower() != OBJECTIVES[objective]:
        differ.append(f"direction {study.direction.name.lower()}")
    if differ:
        raise ConfigError(f"sweep --search optuna: study {name!r} at {url} was made with "
                          f"{'; '.join(differ)}: give the same, or a new --study-name")
    for key, value in made.items():
        if key not in kept:
            study.set_user_attr(key, value)
    return study


def _journal(optuna: Any, path: str) -> Any:
    """Optuna's journal storage on the file ``path`` (the API of optuna >= 4, else 3's)."""
    try:
        from optuna.storages.journal import JournalFileBackend, JournalStorage
    except ImportError:  # optuna 3
        return optuna.storages.JournalStorage(optuna.storages.JournalFileStorage(path))
    return JournalStorage(JournalFileBackend(path))


def check_folders(out: Path, n_trials: int) -> None:
    """Refuses trial folders in ``out`` that the study's next trials would take: trial numbers
    go on from the study's count, so a ``trial<k>`` folder with ``k >= n_trials`` is another
    study's.

    Args:
        out: the search folder.
        n_trials: the trials the study holds (every state).

    Raises:
        ConfigError: such folders exist (the first three are named).
    """
    taken = sorted(p.name for p in out.glob("trial*") if p.is_dir()
                   and p.name[5:].isdigit() and int(p.name[5:]) >= n_trials)
    if taken:
        raise ConfigError(f"sweep --search optuna: {out} holds {', '.join(taken[:3])}, which "
                          f"the study's next trials would take (it holds {n_trials} trials): "
                          "give the storage and study name those folders came from, or a new "
                          "--out")


def objective_value(results: Sequence[SessionResult], objective: str) -> tuple[float | None, str]:
    """A trial's objective: the mean over its sessions (see the module docstring).

    Args:
        results: the trial's sessions, ended.
        objective: one of :data:`OBJECTIVES`.

    Returns:
        ``(value, "")``, or ``(None, why)`` when a session failed or has no such value.

    Example:
        >>> solved = SessionResult(0, 0, 0, "default", returncode=0, status="solved",
        ...                        solved=True, frames_to_solve=3000.0, frames=3000.0)
        >>> unsolved = SessionResult(0, 1, 1, "default", returncode=0, status="budget",
        ...                          frames=10000.0)
        >>> objective_value([solved, unsolved], "frames_to_solve")
        (11500.0, '')
    """
    values = []
    for r in results:
        if not r.ok:
            return None, f"session {r.session} failed: {r.error[:400]}"
        if objective == "frames_to_solve":
            v = r.frames_to_solve if r.solved else UNSOLVED_PENALTY * r.frames
        elif objective == "time_to_solve":
            v = r.time_to_solve if r.solved else UNSOLVED_PENALTY * r.wall_time
        else:
            v = r.final_train_return if objective == "final_return" else r.eval_return
        if not math.isfinite(v):
            return None, (f"session {r.session} has no {objective} (its summary.json: status "
                          f"{r.status!r}" + (", no evaluation: give --eval-every)"
                                             if objective == "eval_return" else ")"))
        values.append(v)
    return sum(values) / len(values), ""


def train_command(algo: str, algo_args: Sequence[str], params: dict[str, Any]) -> str:
    """The ``rlstruct train`` line of a trial: the fixed flags, then the trial's.

    Example:
        >>> train_command("ppo", ["--max-frames", "5000"], {"lr": 0.002, "anneal_lr": False})
        'rlstruct train ppo --max-frames 5000 --lr 0.002 --no-anneal-lr'
    """
    return shlex.join(["rlstruct", "train", algo, *algo_args, *override_flags(params)])


def write_summary(study: Any, out: Path) -> None:
    """Writes ``out/summary.csv``: a row (:data:`STUDY_COLUMNS`) per session of every trial of
    the study that recorded its sessions (its ``sessions`` user attribute), by trial number."""
    tmp = out / f".summary.csv.{os.getpid()}"  # replaced at once: several processes write it
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=STUDY_COLUMNS, restval="")
        writer.writeheader()
        for trial in study.get_trials(deepcopy=False):
            for row in trial.user_attrs.get("sessions", []):
                writer.writerow({**{k: row.get(k, "") for k in SUMMARY_COLUMNS},
                                 "state": trial.state.name,
                                 "value": "" if trial.value is None else trial.value})
    os.replace(tmp, out / "summary.csv")


def write_outputs(study: Any, out: Path, algo: str, url: str, objective: str,
                  quiet: bool) -> dict[str, Any] | None:
    """Writes ``summary.csv``, ``best.json`` and the plots into ``out``; prints the best trial's
    ``rlstruct train`` line (unless ``quiet``).

    Returns:
        What ``best.json`` holds: algo, study_name, storage, objective, direction, trial,
        value, params, flags (the params as flags), algo_args (the fixed flags), command (the
        train line) and trials (counts by state); None when the study has no complete trial
        (then no ``best.json`` is written).
    """
    write_summary(study, out)
    trials = study.get_trials(deepcopy=False)
    counts = {s: sum(t.state.name == s for t in trials) for s in ("COMPLETE", "PRUNED", "FAIL")}
    if not counts["COMPLETE"]:
        if not quiet:
            print(f"sweep: study {study.study_name!r} has no complete trial ({counts}): no "
                  "best.json", flush=True)
        return None
    best_trial = study.best_trial
    fixed = list(study.user_attrs.get("algo_args", []))
    best = {"algo": algo, "study_name": study.study_name, "storage": url,
            "objective": objective, "direction": OBJECTIVES[objective],
            "trial": best_trial.number, "value": best_trial.value,
            "params": best_trial.params, "flags": override_flags(best_trial.params),
            "algo_args": fixed, "command": train_command(algo, fixed, best_trial.params),
            "trials": {k.lower(): v for k, v in counts.items()}}
    tmp = out / f".best.json.{os.getpid()}"
    tmp.write_text(json.dumps(best, indent=2) + "\n")
    os.replace(tmp, out / "best.json")
    _plots(study, out, objective, counts["COMPLETE"], quiet)
    if not quiet:
        print(f"sweep: best trial {best_trial.number} of {len(trials)} ({objective} "
              f"{best_trial.value:g}); summary in {out / 'summary.csv'}, best in "
              f"{out / 'best.json'}", flush=True)
        print(best["command"], flush=True)
    return best


def _plots(study: Any, out: Path, objective: str, n_complete: int, quiet: bool) -> None:
    """Optuna's optimization history and param importances as PNGs in ``out``."""
    def note(text: str) -> None:
        if not quiet:
            print(f"sweep: {text}", file=sys.stderr, flush=True)

    try:
        import matplotlib.pyplot as plt
        from optuna.exceptions import ExperimentalWarning
        from optuna.visualization import matplotlib as plots
    except ImportError as err:
        note(f"no plots: {err} ({install_hint('plot')})")
        return
    drawn = [("optuna_history.png", plots.plot_optimization_history)]
    if n_complete >= 2:
        drawn.append(("optuna_importances.png", plots.plot_param_importances))
    else:
        note(f"param importances need 2 complete trials, the study has {n_complete}: "
             "optuna_importances.png not drawn")
    for name, plot in drawn:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            warnings.filterwarnings("ignore", "Target and region quantiles")  # few trials
            try:
                axes = plot(study, target_name=objective)
            except (ValueError, RuntimeError, ImportError) as err:
                note(f"{name} not drawn: {err}")
                continue
        tmp = out / f".{os.getpid()}.{name}"
        axes.figure.savefig(tmp, dpi=100, format="png")
        os.replace(tmp, out / name)
        plt.close(axes.figure)
