"""The one step that reads the world for a run config: :func:`resolve`.

Building a :class:`~rlstruct.runs.config.RunConfig` reads no file, imports nothing and reads no
environment variable: it is plain data, and :meth:`~rlstruct.runs.config.RunConfig.problems`
checks only its own values. :func:`resolve`, run once before anything starts (``Run`` calls it,
the command line calls it through :func:`parse`), does everything that looks outside:

- applies the ``--layout`` file of ``rlstruct tune``;
- imports the env modules and looks the env id up (with close matches), then makes one env to
  read its spaces and checks the action space against what the algorithm takes;
- reads torchrun's variables (``WORLD_SIZE``) for the learner-rank checks, and whether the
  learner ranks can split the batch;
- checks that every device named exists on this machine;
- picks the run to resume for ``--resume auto`` (:func:`newest_checkpointed_run`), and checks
  the run to resume: its checkpoint, its algorithm and the config its checkpoint records.

Every problem is listed in one :class:`~rlstruct.errors.ConfigError`, before any folder, process
or thread exists; on the command line that is one message and exit code 2. A run stopped by a
signal (:mod:`rlstruct.runs.signals`) is one line too, and exit code 0 after SIGTERM, 130 after
Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, TypeVar

import gymnasium as gym
import torch

from rlstruct.devices import resolve_device
from rlstruct.envs.registry import env_id_problems, env_module_problems, env_spaces
from rlstruct.errors import CheckpointError, ConfigError
from rlstruct.learners.torchrun import torchrun_world
from rlstruct.runs.checkpoint import load_checkpoint, object_path
from rlstruct.runs.config import RESUMABLE, RunConfig
from rlstruct.runs.layout_file import apply_layout
from rlstruct.runs.logger import config_to_dict
from rlstruct.runs.presets import command_line_config
from rlstruct.runs.signals import exit_code

__all__ = ["resolve", "parse", "run_cli", "is_resolved", "algo_name", "newest_checkpointed_run",
           "RESUME_AUTO"]

C = TypeVar("C", bound=RunConfig)

_RESOLVED = "_rlstruct_resolved"

#: The value of ``--resume`` that continues the newest checkpointed run of ``--runs-dir``, or
#: starts a fresh run when there is none.
RESUME_AUTO = "auto"


def is_resolved(cfg: RunConfig) -> bool:
    """Whether ``cfg`` came out of :func:`resolve`."""
    return bool(getattr(cfg, _RESOLVED, False))


def algo_name(cfg: RunConfig | type[RunConfig]) -> str:
    """The algorithm a config (or config class) belongs to (``ppo`` for
    ``rlstruct.algos.ppo.Config``, also run as ``__main__``; the class's module otherwise)."""
    module = object_path(cfg if isinstance(cfg, type) else type(cfg)).split(":")[0]
    return module.rsplit(".", 1)[-1] if module.startswith("rlstruct.algos.") else module


def resolve(cfg: C, algo: str | None = None) -> C:
    """Checks ``cfg`` against the world, applies its layout file (in place: the algorithm's
    own reference sees the same config as the run) and returns it (see the module notes). A
    resolved config is not resolved again.

    Args:
        cfg: the config.
        algo: the algorithm's name, as the run records it (default: from the config's class,
            ``ppo`` for ``rlstruct.algos.ppo.Config``).

    Raises:
        ConfigError: listing every problem at once.
    """
    if is_resolved(cfg):
        return cfg
    problems: list[str] = []
    if cfg.layout_file is not None:
        try:
            cfg = apply_layout(cfg, cfg.layout_file)
        except ConfigError as err:
            problems.append(str(err))
    problems += cfg.problems()
    problems += _learner_rank_problems(cfg) + _device_problems(cfg)
    module_problems = env_module_problems(cfg.env_module)
    problems += module_problems
    if not module_problems:
        id_problems = env_id_problems(cfg.env_id, cfg.env_backend)
        problems += id_problems
        if not id_problems:
            problems += _space_problems(cfg)
    if cfg.resume == RESUME_AUTO:
        found = newest_checkpointed_run(cfg.runs_dir)
        cfg.resume = None if found is None else str(found)
    if cfg.resume is not None:
        problems += _resume_problems(cfg, algo or algo_name(cfg))
    if problems:
        raise ConfigError(f"{len(problems)} problem(s) in the config:\n- "
                          + "\n- ".join(problems))
    setattr(cfg, _RESOLVED, True)
    return cfg


def parse(config_class: type[C], args: Sequence[str] | None = None,
          prog: str | None = None) -> C:
    """The command line of an algorithm: :func:`~rlstruct.runs.presets.command_line_config`
    (tyro, with ``--preset NAME``'s values as the defaults), then :func:`resolve`. A problem of
    the config prints one message and exits with code 2, before anything starts.

    Args:
        config_class: the algorithm's ``Config``.
        args: the arguments (default: ``sys.argv[1:]``).
        prog: the program's name in messages and ``--help``.
    """
    with _exit_2_on_config_error(config_class, prog):
        return resolve(command_line_config(config_class, args, prog))


def run_cli(main: Callable[[C], Any], config_class: type[C], args: Sequence[str] | None = None,
            prog: str | None = None) -> Any:
    """An algorithm's command line: :func:`parse`, then ``main(cfg)``. A ConfigError raised
    while the run sets up (a Ray cluster that cannot be joined, a layout the algorithm cannot
    run) is one message and exit code 2 as well; the run leaves no folder behind
    (:class:`~rlstruct.runs.lock.FolderGuard`).

    A run stopped by SIGTERM or Ctrl-C (:class:`~rlstruct.runs.signals.Terminated`: it wrote
    its final checkpoint and summary) is one line on stderr and exit code 0 after SIGTERM, 130
    after Ctrl-C; so is a Ctrl-C before the run starts or after it ended. No traceback.

    Returns:
        What ``main`` returns (the run's summary).
    """
    name = prog or "rlstruct train " + algo_name(config_class)
    try:
        cfg = parse(config_class, args, prog)
        with _exit_2_on_config_error(config_class, prog):
            return main(cfg)
    except KeyboardInterrupt as stop:  # Terminated (SIGTERM, Ctrl-C) or a bare Ctrl-C
        code = exit_code(stop)
        what = str(stop) or "signal SIGINT"
        print(f"{name}: stopped by {what.removeprefix('signal ')} (exit code {code})",
              file=sys.stderr, flush=True)
        raise SystemExit(code) from None


@contextlib.contextmanager
def _exit_2_on_config_error(config_class: type[RunConfig], prog: str | None) -> Iterator[None]:
    """A ConfigError in the block: one message on stderr, exit code 2, no traceback."""
    try:
        yield
    except ConfigError as err:
        print(f"{prog or 'rlstruct train ' + algo_name(config_class)}: error: {err}",
              file=sys.stderr)
        raise SystemExit(2) from None


def _learner_rank_problems(cfg: RunConfig) -> list[str]:
    layout, world = cfg.layout, torchrun_world()
    asked = [flag for flag, on in (
        (f"n_learners={layout.n_learners}", layout.n_learners > 1),
        ("learner_devices", bool(layout.learner_devices)),
        ("learner_backend 'ray'", layout.learner_backend == "ray"),
        (f"torchrun (WORLD_SIZE={world})", world > 1)) if on]
    if asked and not cfg.learner_ranks:
        return [f"{', '.join(asked)}: {algo_name(cfg)} learns in one process and takes no "
                f"learner ranks (ppo, a2c, impala, sac and trpo do; docs/guide-learners.md)"]
    ranks = world if world > 1 else layout.n_learners
    if ranks > 1 and cfg.learner_ranks and cfg.splits_rows:
        rows = (layout.n_processes or os.cpu_count() or 1) * layout.n_envs
        if rows % ranks:
            return [f"{ranks} learner ranks cannot split a batch of {rows} rows "
                    f"(n_processes={layout.n_processes or os.cpu_count()} x n_envs="
                    f"{layout.n_envs}): make n_processes x n_envs a multiple of {ranks}"]
    return []


def _device_problems(cfg: RunConfig) -> list[str]:
    """Every device the layout names exists here (``resolve_device`` says what is available)."""
    layout = cfg.layout
    named = [(name, getattr(layout, name)) for name in
             ("learner_device", "batcher_device", "eval_device")]
    named += [("learner_devices", d) for d in (layout.learner_devices or "").split(",") if d]
    problems = []
    for name, value in named:
        try:
            if value != "auto":
                torch.device(value)
        except (RuntimeError, TypeError):
            continue  # not a device at all: LayoutConfig.problems says so
        try:
            resolve_device(value)
        except ConfigError as err:  # a device this machine lacks
            problems.append(f"{name}: {err}")
    return problems


def _space_problems(cfg: RunConfig) -> list[str]:
    """The env's action space against the algorithm's ``action_spaces``."""
    try:
        shape, space = env_spaces(cfg.env_id, cfg.env_backend)
    except Exception as err:  # an env that cannot be made: name it, with the cause
        return [f"env_id {cfg.env_id!r} cannot be made: {type(err).__name__}: {err}"]
    kinds = {"Discrete": gym.spaces.Discrete, "Box": gym.spaces.Box}
    if any(isinstance(space, kinds[k]) for k in cfg.action_spaces):
        return cfg.world_problems(shape, space)
    takes = " or ".join(cfg.action_spaces)
    return [f"{algo_name(cfg)} cannot train on {cfg.env_id}: its action space is {space}, "
            f"and {algo_name(cfg)} takes {takes} action spaces"]


def newest_checkpointed_run(runs_dir: str | os.PathLike[str]) -> Path | None:
    """The run folder of ``runs_dir`` whose ``checkpoints/latest.pt`` was written last: what
    ``--resume auto`` continues. Folders without a checkpoint (a session killed before its
    first one) are passed over.

    Args:
        runs_dir: the folder of the run directories (``--runs-dir``); it may not exist yet.

    Returns:
        The run folder, or None when no run of ``runs_dir`` holds a checkpoint (a fresh run).

    Example:
        >>> import tempfile, pathlib
        >>> runs = pathlib.Path(tempfile.mkdtemp())
        >>> newest_checkpointed_run(runs) is None
        True
        >>> (runs / "a" / "checkpoints").mkdir(parents=True)
        >>> _ = (runs / "a" / "checkpoints" / "latest.pt").write_bytes(b"")
        >>> newest_checkpointed_run(runs).name
        'a'
    """
    folder = Path(runs_dir)
    found = [(p.stat().st_mtime, p.name, p.parent.parent)
             for p in folder.glob("*/checkpoints/latest.pt") if p.is_file()] \
        if folder.is_dir() else []
    return max(found)[2] if found else None


def _resume_problems(cfg: RunConfig, algo: str) -> list[str]:
    """The run to resume exists, is this algorithm's, and its checkpoint's config agrees."""
    folder = Path(cfg.resume or "")
    latest = folder / "checkpoints" / "latest.pt"
    if not latest.is_file():
        return [f"resume: {folder} holds no checkpoints/latest.pt (give a run directory)"]
    try:
        state = load_checkpoint(latest)
    except CheckpointError as err:
        return [f"resume: {err}"]
    saved_algo = state.get("algo")
    if saved_algo is not None and saved_algo != algo:
        return [f"resume: {folder} is a {saved_algo} run; resume it with "
                f"`rlstruct train {saved_algo} --resume {folder}`"]
    saved: dict[str, Any] = state.get("config") or {}
    config = config_to_dict(cfg)
    # A field added to the config after the checkpoint was written is absent from it; the run
    # had that field's default behaviour, so the default (and only the default) resumes it.
    defaults = config_to_dict({f.name: f.default_factory() if f.default is MISSING else f.default
                               for f in fields(cfg) if f.default is not MISSING
                               or f.default_factory is not MISSING})
    return [f"resume: {name} is {config.get(name, '<absent>')!r} here but "
            f"{saved.get(name, '<absent>')!r} in the checkpoint of {folder} (it cannot change "
            "on resume)" for name in sorted(set(saved) | set(config))
            if name not in RESUMABLE and saved.get(name) != config.get(name)
            and not (name not in saved and config.get(name) == defaults.get(name))]
