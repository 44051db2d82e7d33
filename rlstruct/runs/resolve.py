"""The one step that reads the world for a run config: :func:`resolve`, which returns a
:class:`Resolved`.

Building a :class:`~rlstruct.runs.config.RunConfig` reads no file, imports nothing and reads no
environment variable: it is plain data, and :meth:`~rlstruct.runs.config.RunConfig.problems`
checks only its own values. :func:`resolve`, run once per start-up before anything starts
(``Run`` calls it for a plain config, the command line through :func:`parse`, and hands the
:class:`Resolved` on), does everything that looks outside, each step once:

- applies the ``--layout`` file of ``rlstruct tune`` (to a copy: the config given is left as
  it was);
- imports the env modules and looks the env id up (with close matches), then makes one env to
  read its spaces and checks the observation and action spaces against what the algorithm
  takes (:func:`observation_problems`; an env whose ``close()`` raises is named as such);
- checks that wandb can be imported for ``--wandb`` (:mod:`rlstruct.runs.tracking`);
- reads torchrun's variables (``WORLD_SIZE``) for the learner-rank checks, and whether the
  learner ranks can split the batch;
- resolves every device named (one :func:`~rlstruct.devices.resolve_device` per device spec)
  and checks the pipeline against the batcher device (:func:`pipeline_problems`);
- picks the run to resume for ``--resume auto`` (:func:`newest_checkpointed_run`: the newest
  checkpointed run of this algorithm and env, saying which in one line on stderr, or a new run),
  loads the checkpoint of the run to resume and checks its algorithm and the config it records.

Every problem is listed in one :class:`~rlstruct.errors.ConfigError`, before any folder, process
or thread exists; on the command line that is one message and exit code 2. A run stopped by a
signal (:mod:`rlstruct.runs.signals`) is one line too, and exit code 0 after SIGTERM, 130 after
Ctrl-C.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Generic, TypeVar

import gymnasium as gym
import torch

from rlstruct.blocks.multi_input import feature_size, obs_spec, spec_problems
from rlstruct.devices import is_accelerator, resolve_device
from rlstruct.envs.registry import (
    ATARI_BACKENDS,
    env_id_problems,
    env_module_problems,
    probe_spaces,
)
from rlstruct.errors import CheckpointError, ConfigError
from rlstruct.learners.torchrun import torchrun_rank, torchrun_world
from rlstruct.parallel.startup import catching
from rlstruct.runs.checkpoint import load_checkpoint, object_path
from rlstruct.runs.config import RESUMABLE, RunConfig, config_to_dict
from rlstruct.runs.folder import CHECKPOINTS, RunFolder
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.layout_file import apply_layout
from rlstruct.runs.machine import AUTO, apply_auto_layout
from rlstruct.runs.presets import command_line_config
from rlstruct.runs.signals import exit_code
from rlstruct.runs.tracking import tracking_problems

__all__ = ["Resolved", "resolve", "parse", "run_cli", "algo_name", "newest_checkpointed_run",
           "pipeline_problems", "observation_problems", "RESUME_AUTO", "DEVICE_FIELDS"]

C = TypeVar("C", bound=RunConfig)

#: The value of ``--resume`` that continues the newest checkpointed run of ``--runs-dir``, or
#: starts a fresh run when there is none.
RESUME_AUTO = "auto"

#: The layout's device fields, each resolved once (:attr:`Resolved.devices`).
DEVICE_FIELDS = ("learner_device", "batcher_device", "eval_device")


@dataclass(frozen=True)
class Resolved(Generic[C]):
    """A config checked against the world, with what the checks found: what a run starts from
    (:class:`~rlstruct.runs.run.Run` takes it, and resolves a plain config into one).

    Attributes:
        cfg: the resolved copy of the config: its layout file applied, ``--resume auto``
            replaced by the run it picked (or None: a fresh run).
        algo: the algorithm's name, as the run records it.
        obs_shape: the env's observation shape, as the training envs produce it.
        action_space: the single env's action space.
        devices: ``{"learner_device", "batcher_device", "eval_device"} -> torch.device``.
        learner_devices: the resolved ``layout.learner_devices`` (empty: none named).
        world_size: torchrun's ``WORLD_SIZE`` (1: not under torchrun); ``rank``: this
            process's ``RANK`` (0: the driver; a rank above 0 only learns).
        checkpoint: the loaded ``checkpoints/latest.pt`` of the run to resume, or None.
        env_modules: the modules that register the env (``cfg.env_module``), imported.
        obs_spec: the feature keys of a ``Dict``/``Tuple`` observation space
            (:func:`~rlstruct.blocks.multi_input.obs_spec`), or None (one array, ``frame``);
            with one, ``obs_shape`` is ``(F,)``, the multi-input encoder's features.
    """

    cfg: C
    algo: str
    obs_shape: tuple[int, ...]
    action_space: gym.Space
    devices: dict[str, torch.device]
    learner_devices: tuple[torch.device, ...]
    world_size: int
    rank: int
    checkpoint: dict[str, Any] | None
    env_modules: tuple[str, ...]
    obs_spec: dict[str, dict[str, Any]] | None = None

    def __getattr__(self, name: str) -> Any:
        """A config field read on the Resolved is the resolved config's (``resolved.lr`` is
        ``resolved.cfg.lr``), so that a loop written for a config (``def main(cfg)``, then
        ``Run(name, cfg)`` and ``cfg.lr``) runs on what :func:`run_cli` hands it."""
        if name.startswith("__") or "cfg" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["cfg"], name)

    @property
    def launch(self) -> dict[str, Any]:
        """How the run is launched, and its learner ranks (config.json, summary.json)."""
        if self.world_size > 1:
            return {"launcher": "torchrun", "world_size": self.world_size}
        return {"launcher": "rlstruct", "world_size": self.cfg.layout.n_learners,
                "learner_backend": self.cfg.layout.learner_backend}

    @property
    def learner_device(self) -> torch.device:
        """The learner's device."""
        return self.devices["learner_device"]

    @property
    def batcher_device(self) -> torch.device:
        """The training batcher's device."""
        return self.devices["batcher_device"]

    @property
    def eval_device(self) -> torch.device:
        """The evaluation's device."""
        return self.devices["eval_device"]


def algo_name(cfg: RunConfig | type[RunConfig]) -> str:
    """The algorithm a config (or config class) belongs to (``ppo`` for
    ``rlstruct.algos.ppo.Config``, also run as ``__main__``; the class's module otherwise)."""
    module = object_path(cfg if isinstance(cfg, type) else type(cfg)).split(":")[0]
    return module.rsplit(".", 1)[-1] if module.startswith("rlstruct.algos.") else module


def resolve(cfg: C | Resolved[C], algo: str | None = None) -> Resolved[C]:
    """Checks ``cfg`` against the world and returns what it found (see the module notes);
    ``cfg`` itself is left unchanged. A :class:`Resolved` is returned as it is.

    Args:
        cfg: the config.
        algo: the algorithm's name, as the run records it (default: from the config's class,
            ``ppo`` for ``rlstruct.algos.ppo.Config``).

    Raises:
        ConfigError: listing every problem at once.
    """
    if isinstance(cfg, Resolved):
        return cfg
    algo = algo or algo_name(cfg)
    cfg = copy.deepcopy(cfg)
    problems: list[str] = []
    if cfg.layout_file is not None:
        try:
            if cfg.layout_file == AUTO:  # --layout auto: from this machine (runs/machine.py)
                apply_auto_layout(cfg)
            else:
                apply_layout(cfg, cfg.layout_file)
        except ConfigError as err:
            problems.append(str(err))
    problems += cfg.problems() + tracking_problems(cfg)  # --wandb needs wandb
    world, rank = torchrun_world(), 0
    if world > 1:
        try:
            rank = torchrun_rank()
        except ConfigError as err:  # WORLD_SIZE without torchrun's other variables
            problems.append(str(err))
    devices, learner_devices, found = _resolve_devices(cfg.layout)
    problems += _learner_rank_problems(cfg, world) + found
    if "batcher_device" in devices:
        problems += pipeline_problems(cfg.layout, devices["batcher_device"])
    spaces, found = _env_problems(cfg)
    problems += found
    auto = cfg.resume == RESUME_AUTO
    if auto:  # this algorithm's runs on this env only (a sweep's runs dir holds others too)
        picked = newest_checkpointed_run(cfg.runs_dir, algo, cfg.env_id)
        cfg.resume = None if picked is None else str(picked)
    checkpoint = None
    if cfg.resume is not None:
        checkpoint, found = _resume_problems(cfg, algo)
        problems += found
    if problems:
        raise ConfigError(f"{len(problems)} problem(s) in the config:\n- "
                          + "\n- ".join(problems))
    assert spaces is not None
    if auto and rank == 0:
        print("rlstruct: --resume auto: " + (
            f"resuming {cfg.resume}, the newest {algo} run on {cfg.env_id} with a checkpoint"
            if cfg.resume else f"no {algo} run on {cfg.env_id} in {cfg.runs_dir} has a "
            "checkpoint: starting a new run"), file=sys.stderr)
    return Resolved(cfg, algo, spaces[0], spaces[1], devices, learner_devices, world, rank,
                    checkpoint, tuple(cfg.env_module), spaces[2])


def parse(config_class: type[C], args: Sequence[str] | None = None,
          prog: str | None = None) -> Resolved[C]:
    """The command line of an algorithm: :func:`~rlstruct.runs.presets.command_line_config`
    (tyro, with ``--preset NAME``'s values as the defaults), then :func:`resolve`. A problem of
    the config prints one message and exits with code 2, before anything starts.

    Args:
        config_class: the algorithm's ``Config``.
        args: the arguments (default: ``sys.argv[1:]``).
        prog: the program's name in messages and ``--help``.

    Returns:
        The resolved config (its ``cfg`` is the config the command line gave, resolved).
    """
    with _exit_2_on_config_error(config_class, prog):
        return resolve(command_line_config(config_class, args, prog))


def run_cli(main: Callable[[Resolved[C]], Any], config_class: type[C],
            args: Sequence[str] | None = None, prog: str | None = None) -> Any:
    """An algorithm's command line: :func:`parse`, then ``main(resolved)`` (an algorithm's
    ``main`` hands it to :class:`~rlstruct.runs.run.Run`, which takes a :class:`Resolved` as
    it takes a config). A ConfigError raised while the run sets up (a Ray cluster that cannot
    be joined, a layout the algorithm cannot run) is one message and exit code 2 as well; the
    run leaves no folder behind (:class:`~rlstruct.runs.lock.FolderGuard`).

    A run stopped by SIGTERM or Ctrl-C (:class:`~rlstruct.runs.signals.Terminated`: it wrote
    its final checkpoint and summary) is one line on stderr and exit code 0 after SIGTERM, 130
    after Ctrl-C; so is a signal before the run starts (the config check, a resume's checkpoint
    load) or after it ended. No traceback.

    Returns:
        What ``main`` returns (the run's summary).
    """
    name = prog or "rlstruct train " + algo_name(config_class)
    try:
        with catching():  # a signal from the command's first line on: rlstruct.parallel.startup
            resolved = parse(config_class, args, prog)
            with _exit_2_on_config_error(config_class, prog):
                return main(resolved)
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


def _learner_rank_problems(cfg: RunConfig, world: int) -> list[str]:
    layout = cfg.layout
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


def _resolve_devices(
    layout: LayoutConfig,
) -> tuple[dict[str, torch.device], tuple[torch.device, ...], list[str]]:
    """Every device the layout names, each spec resolved once (``resolve_device`` says what is
    available): ``(devices by field, learner_devices, problems)``."""
    named = [(name, getattr(layout, name)) for name in DEVICE_FIELDS]
    named += [("learner_devices", d) for d in (layout.learner_devices or "").split(",") if d]
    found: dict[str, torch.device | ConfigError] = {}
    devices: dict[str, torch.device] = {}
    ranks: list[torch.device] = []
    problems = []
    for name, value in named:
        try:
            if value != "auto":
                torch.device(value)
        except (RuntimeError, TypeError):
            continue  # not a device at all: LayoutConfig.problems says so
        if value not in found:
            try:
                found[value] = resolve_device(value)
            except ConfigError as err:  # a device this machine lacks
                found[value] = err
        device = found[value]
        if isinstance(device, ConfigError):
            problems.append(f"{name}: {device}")
        elif name == "learner_devices":
            ranks.append(device)
        else:
            devices[name] = device
    return devices, tuple(ranks), problems


def pipeline_problems(layout: LayoutConfig, batcher_device: torch.device) -> list[str]:
    """The run's pipeline check: ``layout.pipeline`` above 1 needs worker processes, which a
    batcher on an accelerator (one process) does not have. (``pipeline >= 1`` is
    :meth:`LayoutConfig.problems`'s; an algorithm that collects synchronously refuses a
    pipeline in :meth:`Run.training_batcher <rlstruct.runs.run.Run.training_batcher>`.)"""
    if layout.pipeline > 1 and is_accelerator(batcher_device):
        return [f"pipeline={layout.pipeline} needs worker processes: use the CPU batcher (the "
                f"device batcher on {batcher_device} collects in the learner's process)"]
    return []


def _env_problems(cfg: RunConfig) -> tuple[tuple[tuple[int, ...], gym.Space, Any] | None,
                                           list[str]]:
    """The env modules, the env id, then one env made for its spaces, each checked against
    what the algorithm takes: ``((obs_shape, action_space, obs_spec), problems)``."""
    problems = env_module_problems(cfg.env_module)
    if problems:
        return None, problems
    problems = env_id_problems(cfg.env_id, cfg.env_backend)
    if problems:
        return None, problems
    try:
        observations, space = probe_spaces(cfg.env_id, cfg.env_backend)
    except ConfigError as err:  # no torch-native version, or a close() that raised
        return None, [str(err)]
    except Exception as err:  # noqa: BLE001 - an env that cannot be made is a listed problem
        return None, [f"env_id {cfg.env_id!r} cannot be made: {type(err).__name__}: {err}"]
    shape = tuple(observations.shape or (1,))
    if cfg.env_backend in ATARI_BACKENDS:  # the probe stacks 4; the training envs frame_stack
        shape = (cfg.frame_stack, *shape[1:])
    problems = observation_problems(cfg, observations)
    kinds = {"Discrete": gym.spaces.Discrete, "Box": gym.spaces.Box}
    if not any(isinstance(space, kinds[k]) for k in cfg.action_spaces):
        takes = " or ".join(cfg.action_spaces)
        problems.append(
            f"{algo_name(cfg)} cannot train on {cfg.env_id}: its action space is {space}, and "
            f"{algo_name(cfg)} takes {takes} action spaces")
    if problems:
        return None, problems
    spec = obs_spec(observations)
    if spec is not None:  # the models read the multi-input encoder's F features
        shape = (feature_size(spec),)
    return (shape, space, spec), cfg.world_problems(shape, space)


def observation_problems(cfg: RunConfig, space: gym.Space) -> list[str]:
    """What is wrong with the env's observation space ``space`` for the algorithm of ``cfg``
    (empty: nothing): it must be one of ``cfg.observation_spaces`` (an algorithm of one's own
    on :class:`~rlstruct.runs.run.Run` may declare more): a ``Box``, ``MultiBinary`` or
    ``MultiDiscrete`` with at least one dimension (one array, ``observation["frame"]``, of
    shape ``(B, *feat)``), or a ``Dict``/``Tuple`` of leaves a multi-input model takes
    (:func:`~rlstruct.blocks.multi_input.spec_problems`), with an MLP ``--model``."""
    takes = cfg.observation_spaces
    kind = type(space).__name__
    if kind in takes and isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        model = str(getattr(cfg, "model", "mlp"))
        return [f"{algo_name(cfg)} cannot train on {cfg.env_id}: {p}" for p in
                spec_problems(space)] + ([
            f"--model {model} reads one image array, but {cfg.env_id}'s observations are a "
            f"{kind} (a multi-input encoder gives a CNN to each image key): use --model mlp "
            "(or mlp-lstm, mlp-gru)"] if model.startswith("cnn") else [])
    arrays = isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary, gym.spaces.MultiDiscrete))
    if kind in takes and (space.shape or not arrays):
        return []
    why = "has no dimension" if kind in takes else "is not one of them"
    return [f"{algo_name(cfg)} cannot train on {cfg.env_id}: its observation space is {space} "
            f"({kind}, which {why}); {algo_name(cfg)} takes {' or '.join(takes)} observation "
            "spaces, arrays with at least one dimension: wrap the env, or map its "
            "observations to a Box with a gymnasium.ObservationWrapper"]


def newest_checkpointed_run(runs_dir: str | os.PathLike[str], algo: str | None = None,
                            env_id: str | None = None) -> Path | None:
    """The run folder of ``runs_dir`` whose ``checkpoints/latest.pt`` was written last: what
    ``--resume auto`` continues. Folders without a checkpoint (a session killed before its
    first one) are passed over, and so are the runs of another algorithm or env than
    ``algo`` and ``env_id`` (as their ``config.json`` records them; None: any).

    Args:
        runs_dir: the folder of the run directories (``--runs-dir``); it may not exist yet.
        algo: the algorithm whose runs count (``ppo``), or None.
        env_id: the env whose runs count (``CartPole-v1``), or None.

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
    found = [(p.stat().st_mtime, p.parent.parent)
             for p in folder.glob(f"*/{CHECKPOINTS}/latest.pt")
             if p.is_file() and _is_run_of(p.parent.parent, algo, env_id)] \
        if folder.is_dir() else []
    return max(found)[1] if found else None


def _is_run_of(run_dir: Path, algo: str | None, env_id: str | None) -> bool:
    """Whether ``config.json`` of ``run_dir`` records ``algo`` and ``env_id`` (None: any)."""
    if algo is None and env_id is None:
        return True
    try:
        meta = json.loads(RunFolder(run_dir).config_file.read_text())
    except (OSError, ValueError):
        return False  # not a run folder rlstruct wrote: not this algorithm's
    return (isinstance(meta, dict) and algo in (None, meta.get("algo"))
            and env_id in (None, meta.get("env")))


def _resume_problems(cfg: RunConfig, algo: str) -> tuple[dict[str, Any] | None, list[str]]:
    """Loads the checkpoint of the run to resume: ``(its state, problems)``; the run exists,
    is this algorithm's, and its checkpoint's config agrees."""
    folder = Path(cfg.resume or "")
    latest = RunFolder(folder).checkpoint("latest")
    if not latest.is_file():
        return None, [f"resume: {folder} holds no checkpoints/latest.pt (give a run directory)"]
    try:
        state = load_checkpoint(latest)
    except CheckpointError as err:
        return None, [f"resume: {err}"]
    saved_algo = state.get("algo")
    if saved_algo is not None and saved_algo != algo:
        return state, [f"resume: {folder} is a {saved_algo} run; resume it with "
                       f"`rlstruct train {saved_algo} --resume {folder}`"]
    saved: dict[str, Any] = state.get("config") or {}
    config = config_to_dict(cfg)
    # A field added to the config after the checkpoint was written is absent from it; the run
    # had that field's default behaviour, so the default (and only the default) resumes it.
    defaults = config_to_dict({f.name: f.default_factory() if f.default is MISSING else f.default
                               for f in fields(cfg) if f.default is not MISSING
                               or f.default_factory is not MISSING})
    return state, [
        f"resume: {name} is {config.get(name, '<absent>')!r} here but "
        f"{saved.get(name, '<absent>')!r} in the checkpoint of {folder} (it cannot change on "
        "resume)" for name in sorted(set(saved) | set(config))
        if name not in RESUMABLE + cfg.resumable and saved.get(name) != config.get(name)
        and not (name not in saved and config.get(name) == defaults.get(name))]
