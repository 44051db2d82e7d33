"""The config fields every algorithm shares: :class:`RunConfig`.

An algorithm's ``Config`` subclasses it; ``tyro`` turns it into a command line whose ``--help``
is the fields' docstrings, and :meth:`RunConfig.problems` lists every bad value before anything
starts. It is plain data: building it reads no file and no environment variable;
:func:`rlstruct.runs.resolve.resolve` is the one step that looks outside (the layout file, env
modules, devices, torchrun, the run to resume) and lists every problem in one
:class:`~rlstruct.errors.ConfigError` (exit code 2 on the command line). The run scaffold that
consumes it is :mod:`rlstruct.runs.run` (which re-exports it).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import tyro

from rlstruct.envs.registry import ATARI_BACKENDS
from rlstruct.runs.json_safe import json_safe
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.machine import machine_dict
from rlstruct.runs.presets import Preset, build_preset

__all__ = ["RunConfig", "RESUMABLE", "code_dir", "config_to_dict", "layout_source",
           "session_record"]

C = TypeVar("C", bound="RunConfig")

#: RunConfig fields a resumed run may set differently from the run it continues.
RESUMABLE = ("resume", "max_frames", "time_budget", "target_return", "eval_every", "eval_envs",
             "checkpoint_every", "progress_every_s", "n_threads", "runs_dir", "layout",
             "layout_file", "env_module", "worker_timeout", "wandb", "wandb_project",
             "wandb_group")


@dataclass
class RunConfig:
    """What every run shares: environment, seed, budgets, stop test, evaluation, outputs, the
    hyperparameters every algorithm has (segment length, width, lr, discount, gradient
    clipping) and the device layout. An algorithm's config subclasses it; redeclaring a field
    changes its default and keeps its help."""

    preset: str | None = None
    """a named hyperparameter set of the algorithm (listed above); every other flag given
    overrides its values. Set by --preset and Config.from_preset: setting it by hand on a
    Config changes no other field"""
    env_id: str = "CartPole-v1"
    """gymnasium id of the environment (Discrete actions; ppo, a2c and trpo also take Box ones,
    sac only Box ones); pkg.mod:Id imports pkg.mod first"""
    env_module: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """a module that registers env_id with gymnasium, imported wherever envs are built (the
    workers, the evaluation, Ray actors); repeatable"""
    resume: str | None = None
    """a run directory to continue from its checkpoints/latest.pt: model, optimizer, frame and
    episode counters, RNG states, clock; progress.csv and episodes.csv are appended. auto: the
    run of this algorithm and env in runs_dir whose checkpoint is newest, or a fresh run when
    none has one (a job that Slurm requeues); one line says which"""
    seed: int = 0
    """run seed: the learner's model, the training batcher (seed), the evaluation (seed + 1000)"""
    max_frames: int = 1_000_000
    """stop after this many environment frames"""
    time_budget: float = 600.0
    """stop after this many seconds (worker start-up included)"""
    worker_timeout: float | None = None
    """seconds a training worker may stay silent in a segment before the run fails naming it
    (a hung env or agent); None: 10 x the slowest segment so far, at least 60 s, at most 300 s.
    Either way no segment is waited for past the time budget plus a grace (a tenth of it, at
    least 10 s)"""
    target_return: float | None = 475.0
    """stop once the mean return of the last target_window training episodes reaches this"""
    target_window: int = 20
    """episodes averaged by the stop test, progress.csv's train_return_mean<N>, plot and summary"""
    eval_every: int = 20
    """start a greedy evaluation every this many iterations (0: never)"""
    eval_envs: int = 4
    """episodes per evaluation"""
    checkpoint_every: int = 50
    """save checkpoints/latest.pt every this many iterations (and at the end)"""
    progress_every_s: float = 1.0
    """the least seconds between two progress.csv rows (0: a row every iteration): an iteration
    that ends sooner is counted in the next row, whose monitor columns cover the whole interval;
    a row also comes with each evaluation's result, each checkpoint and the run's end"""
    n_threads: int = 1
    """torch threads of the learner (the cores are shared with the workers)"""
    precision: Literal["fp32", "bf16", "auto"] = "fp32"
    """the learn step's arithmetic: fp32; bf16 (autocast: convolutions and matmuls in bfloat16,
    weights and optimizer state in float32); auto (bf16 where the learner device has it natively:
    CUDA, or a CPU with AVX512-BF16 or AMX)"""
    runs_dir: str = "runs"
    """folder of the run directories"""
    wandb: bool = False
    """also log the run to Weights & Biases (the wandb extra): every progress.csv row (frames
    as the step), config.json, the plots at the end; a wandb error is a warning and the run goes
    on. WANDB_MODE=offline: no network (wandb sync later). TensorBoard is written either way"""
    wandb_project: str = "rlstruct"
    """--wandb: the wandb project; the run's tags are its algorithm, env id and preset"""
    wandb_group: str | None = None
    """--wandb: the wandb group of the run (a sweep's name, say; None: none)"""
    n_timesteps: int = 32
    """T: steps per env and segment"""
    hidden: int = 64
    """width of the hidden layers of the model"""
    lr: float = 1e-3
    """Adam learning rate"""
    gamma: float = 0.99
    """discount factor"""
    max_grad_norm: float = 0.5
    """clip the global gradient norm to this (0: no clipping)"""
    env_backend: Literal["gymnasium", "torch", "atari", "envpool", "vector"] = "gymnasium"
    """training envs: gymnasium's; rlstruct's torch-native version of env_id (batched tensor
    maths on the batcher's device: CartPole-v1, Acrobot-v1, MountainCar-v0, Pendulum-v1; the
    evaluation plays gymnasium's env); an ALE id with Atari preprocessing (84x84 grey, frame
    skip 4, 4 stacked uint8 frames; the atari extra: pip install -e '.[atari]'; no evaluation
    runs); envpool's C++ threads playing the same ALE game with the same preprocessing (the
    envpool extra: pip install -e '.[envpool]'); or the vector env registered as env_id's
    vector_entry_point, one per worker (gymnasium.make_vec, through VectorEnvAdapter; the
    evaluation plays gymnasium.make's env)"""
    frame_stack: int = 4
    """--env-backend atari or envpool: the preprocessed frames stacked in one observation (1:
    the current frame alone, for a recurrent model, as CleanRL's ppo_atari_lstm)"""
    layout_file: Annotated[str | None, tyro.conf.arg(aliases=("--layout",))] = None
    """a layout file of `rlstruct tune` (tune.json): its batcher_device, n_processes,
    n_envs, pipeline, n_timesteps and n_threads (when it has them) replace the config's; auto:
    the worker processes, envs per worker, learner device and threads for this machine, the
    envs in all kept (rlstruct/runs/machine.py)"""
    layout: Annotated[LayoutConfig, tyro.conf.OmitArgPrefixes] = field(
        default_factory=LayoutConfig
    )
    """where each part runs"""
    #: The smallest ``n_timesteps`` an algorithm accepts (REINFORCE: 0, the episode's length).
    min_timesteps: ClassVar[int] = 1
    #: Whether the algorithm learns through :meth:`~rlstruct.runs.run.Run.learner_group`, so it
    #: takes learner ranks (``--n-learners``, ``--learner-devices``, ``--learner-backend ray``,
    #: torchrun); an algorithm that does not refuses them rather than ignore them.
    learner_ranks: ClassVar[bool] = False
    #: The action spaces the algorithm takes (gymnasium space class names).
    action_spaces: ClassVar[tuple[str, ...]] = ("Discrete", "Box")
    #: The observation spaces the algorithm takes (gymnasium space class names): arrays with at
    #: least one dimension (``observation["frame"]``), and Dict/Tuple spaces, whose feature keys
    #: a multi-input model reads (:mod:`rlstruct.blocks.multi_input`).
    observation_spaces: ClassVar[tuple[str, ...]] = ("Box", "MultiBinary", "MultiDiscrete",
                                                     "Dict", "Tuple")
    #: Whether learner ranks split the batch's env rows (``n_processes * n_envs``), which must
    #: then be a multiple of their number (SAC splits its samples' rows instead).
    splits_rows: ClassVar[bool] = True
    #: The algorithm's named hyperparameter sets (``--preset NAME``).
    presets: ClassVar[dict[str, Preset]] = {}
    #: The algorithm's own fields that, as :data:`RESUMABLE`'s, a resumed run may set
    #: differently: where the work runs, not what is learned (SAC: ``concurrent_losses``).
    resumable: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_preset(cls: type[C], name: str, **overrides: Any) -> C:
        """The config of the preset ``name`` (its values for the env id given or its own),
        with ``overrides`` on top: ``Config.from_preset("atari", env_id="ALE/Breakout-v5")``.

        Raises:
            ConfigError: the algorithm has no such preset, or it names no config field.
        """
        return build_preset(cls, name, overrides)

    def __post_init__(self) -> None:
        """Only normalises (``env_module`` from a list); reads nothing and checks nothing:
        :func:`rlstruct.runs.resolve.resolve` checks the config, once, before the run."""
        self.env_module = tuple(self.env_module)  # a list from JSON or Python: the same config

    def problems(self) -> list[str]:
        """Every problem of the config's own values (sizes, rates, budgets, the layout), with
        no look outside it; :func:`~rlstruct.runs.resolve.resolve` adds what needs the world
        (env ids and modules, the action space, devices, learner ranks, the run to resume). An
        algorithm's config may extend it (``super().problems() + [...]``)."""
        positive = ("target_window", "eval_envs", "checkpoint_every", "n_threads", "hidden",
                    "max_frames")
        problems = [f"{name} must be >= 1, got {getattr(self, name)}"
                    for name in positive if getattr(self, name) < 1]
        if self.n_timesteps < self.min_timesteps:
            problems.append(f"n_timesteps must be >= {self.min_timesteps}, got {self.n_timesteps}")
        if not self.progress_every_s >= 0:  # nan too
            problems.append(f"progress_every_s must be >= 0 (0: a row every iteration), got "
                            f"{self.progress_every_s}")
        if self.eval_every < 0:
            problems.append(f"eval_every must be >= 0 (0: never), got {self.eval_every}")
        if not self.max_grad_norm >= 0:
            problems.append(f"max_grad_norm must be >= 0 (0: no clipping), got "
                            f"{self.max_grad_norm}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            problems.append(f"lr must be a finite number > 0, got {self.lr}")
        if not self.time_budget > 0:
            problems.append(f"time_budget must be > 0 seconds, got {self.time_budget}")
        if self.worker_timeout is not None and not (
                self.worker_timeout > 0 and math.isfinite(self.worker_timeout)):
            problems.append(f"worker_timeout must be a finite number of seconds > 0 (None: "
                            f"derived from the segments), got {self.worker_timeout}")
        if self.preset is not None and self.preset not in self.presets:
            known = ", ".join(sorted(self.presets)) or "none"
            problems.append(f"preset {self.preset!r} is not one of the algorithm's: {known}")
        if self.precision not in ("fp32", "bf16", "auto"):
            problems.append(f"precision must be fp32, bf16 or auto, got {self.precision!r}")
        if not 0 < self.gamma <= 1:
            problems.append(f"gamma must be in (0, 1], got {self.gamma}")
        if self.frame_stack < 1:
            problems.append(f"frame_stack must be >= 1, got {self.frame_stack}")
        elif self.frame_stack != 4 and self.env_backend not in ATARI_BACKENDS:
            problems.append(f"--frame-stack {self.frame_stack} applies to --env-backend atari "
                            f"and envpool only, not {self.env_backend}")
        return problems + self.layout.problems()

    def world_problems(self, obs_shape: tuple[int, ...], action_space: Any) -> list[str]:
        """Problems that need the env's spaces or the machine (memory), for
        :func:`~rlstruct.runs.resolve.resolve`; an algorithm's config may add its own (a replay
        buffer that cannot fit)."""
        return []


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Turn a config (a dataclass, nested ones included, a mapping or ``None``) into a JSON-safe
    dict: what ``config.json`` and the checkpoints record
    (:func:`~rlstruct.runs.json_safe.json_safe` of each field).

    Tuples become lists; paths, devices, dtypes and types become strings; enums their value;
    non-finite floats the strings ``"nan"``, ``"inf"``, ``"-inf"``; tensors and numpy values
    plain numbers or lists; anything else its ``repr``.

    Example:
        >>> from dataclasses import dataclass, field
        >>> @dataclass
        ... class Layout:
        ...     device: str = "cpu"
        >>> @dataclass
        ... class Config:
        ...     hidden: tuple[int, ...] = (64, 64)
        ...     layout: Layout = field(default_factory=Layout)
        >>> config_to_dict(Config())
        {'hidden': [64, 64], 'layout': {'device': 'cpu'}}

    Raises:
        TypeError: ``cfg`` is none of the accepted kinds.
    """
    if cfg is None:
        return {}
    if (dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)) or isinstance(cfg, Mapping):
        return json_safe(cfg)
    raise TypeError(f"config_to_dict needs a dataclass instance or a mapping, got {type(cfg)}")


def layout_source(cfg: RunConfig) -> str:
    """Where a config's layout came from: ``"file"`` (``--layout FILE``, a file of ``rlstruct
    tune``), ``"auto"`` (``--layout auto``: from the machine), ``"default"`` (the algorithm
    config's own layout), ``"preset"`` (the layout of ``--preset``) or ``"flags"`` (any other:
    layout flags, or fields set in code).

    Args:
        cfg: the config (a resolved one keeps ``layout_file``, whose fields it applied).
    """
    if cfg.layout_file is not None:
        return "auto" if cfg.layout_file == "auto" else "file"
    default = next(f for f in dataclasses.fields(cfg) if f.name == "layout").default_factory
    if cfg.layout == default():  # type: ignore[misc]
        return "default"
    if cfg.preset in cfg.presets and cfg.layout == build_preset(
            type(cfg), cfg.preset, {"env_id": cfg.env_id}).layout:
        return "preset"
    return "flags"


def session_record(cfg: RunConfig, frames: int, launch: dict[str, Any]) -> dict[str, Any]:
    """This session's entry of ``config.json``'s ``sessions`` list (one per session, the
    first included; ``config`` keeps the first session's whole config): when it started, the
    frames it started from, its ``argv``, its launch, where its layout came from
    (:func:`layout_source`) and the fields a resume may set anew
    (:data:`~rlstruct.runs.config.RESUMABLE`: the frame and time budgets, the target...)."""
    values = json_safe(cfg)  # as config.json writes the config
    return {"time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "frames": frames, "argv": list(sys.argv), "launch": dict(launch),
            "layout_source": layout_source(cfg),
            **({"machine": machine_dict()} if cfg.layout_file == "auto" else {}),
            "settings": {name: values[name] for name in RESUMABLE if name in values}}


def code_dir(cfg: RunConfig) -> Path | None:
    """The folder of the module that defines the config's class: the algorithm's code."""
    module = sys.modules.get(type(cfg).__module__)
    path = getattr(module, "__file__", None)
    return Path(path).resolve().parent if path else None
