"""What a sweep runs (:mod:`rlstruct.tools.sweep`, :mod:`rlstruct.tools.optuna_search`): the
algorithm's module, each session's command line and folder, the checks of the arguments, and
the columns of the summary.

A session's command is ``python -m MODULE [fixed flags] [trial's flags] --seed S --n-threads 1
--runs-dir OUT/trial<t>/session<s>`` (and ``--learner-device cuda:k`` with GPUs to rotate,
:func:`~rlstruct.devices.session_device`); a trial's overrides become flags in tyro's spelling
(:func:`override_flags`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlstruct.devices import session_device
from rlstruct.errors import ConfigError
from rlstruct.tools.sessions import Job, SessionResult

__all__ = ["SUMMARY_COLUMNS", "override_flags", "session_jobs", "check_arguments",
           "algo_module", "usable_cores"]

#: The columns of ``summary.csv``, in order.
SUMMARY_COLUMNS = (
    "trial", "session", "seed", "device", "overrides", "returncode", "status", "solved",
    "frames_to_solve", "time_to_solve", "frames", "wall_time", "final_train_return",
    "eval_return", "run_dir", "error",
)


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


def session_jobs(prefix: list[str], trials: list[dict[str, Any]], seeds: list[int], out: Path,
                 gpus: int, cuda_offset: int, first_trial: int = 0) -> list[Job]:
    """One job per (trial, seed), ordered by trial then session: its command (``prefix``, the
    trial's overrides, the seed, one thread, its folder as ``--runs-dir`` and, with ``gpus``,
    its learner device) and its result, not run yet.

    Args:
        prefix: the command before the trial's flags (``python -m MODULE [fixed flags]``).
        trials: each trial's overrides.
        seeds: one session per seed.
        out: the sweep folder (``out/trial<t>/session<s>``).
        gpus, cuda_offset: the GPU rotation (0 GPUs: no device flag).
        first_trial: the number of the first trial (an Optuna search's trial number).
    """
    jobs: list[Job] = []
    for t, overrides in enumerate(trials, start=first_trial):
        flags = override_flags(overrides)
        for s, seed in enumerate(seeds):
            folder = out / f"trial{t}" / f"session{s}"
            device = session_device(t, s, len(seeds), gpus, cuda_offset) if gpus else None
            cmd = [*prefix, *flags, "--seed", str(seed), "--n-threads", "1", "--runs-dir",
                   str(folder)]
            if device is not None:
                cmd += ["--learner-device", str(device)]
            result = SessionResult(t, s, seed, str(device) if device else "default",
                                   json.dumps(overrides, sort_keys=True))
            jobs.append(Job(result, cmd, folder))
    return jobs


def check_arguments(seeds: list[int], gpus: int, cores_per_session: int,
                    max_parallel: int | None, ma_window: int, folders: list[Path]) -> None:
    """Checks a sweep's arguments (and that its session ``folders`` do not exist yet).

    Raises:
        ConfigError: every problem at once.
    """
    problems = []
    taken = [str(f) for f in folders if f.exists()]
    if taken:
        problems.append(f"{len(taken)} session folder(s) exist already ({taken[0]}, ...): each "
                        "session's run must be the one run in its folder; give a new --out")
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


def algo_module(algo: str, module: str | None) -> str:
    """The module a sweep's sessions run: ``module``, else ``rlstruct.algos.<algo>``.

    Raises:
        ConfigError: no ``module`` and no such algorithm.
    """
    if module is None and not _module_exists(f"rlstruct.algos.{algo}"):
        raise ConfigError(f"sweep: no algorithm {algo!r} (no module rlstruct.algos.{algo}; "
                          "rlstruct train --help lists them)")
    return module or f"rlstruct.algos.{algo}"


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing, or a bad name
        return False


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity on Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
