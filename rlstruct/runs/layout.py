"""Device layouts for experiments: the flags every algorithm shares and the batcher they select.

:class:`LayoutConfig` is a typed dataclass (its fields' docstrings are the ``--help`` text of
the flags); :func:`make_batcher` turns a layout into a batcher. A batcher device that is an
accelerator selects the single-process device batcher (:class:`~rlstruct.SerialBatcher` with
the envs behind a DeviceEnv); the CPU selects the multi-process :class:`~rlstruct.Batcher` (or
the SerialBatcher when ``n_processes`` is 1, which saves the workers' start-up; with
``pipeline`` above 1 one worker process collects while the learner learns).
``--check-devices`` wraps every agent in :class:`~rlstruct.CheckDevice`.

The default of ``n_processes`` is 2, not "one per core": with the same seed a run collects the
same data on any machine (``B = n_processes * n_envs`` rows whatever the core count).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.batchers.base import BatcherBase
from rlstruct.batchers.restart import RestartPolicy
from rlstruct.checks import CheckDevice
from rlstruct.devices import is_accelerator, resolve_device
from rlstruct.dicttensor import DeviceLike, DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.errors import ConfigError

if TYPE_CHECKING:  # imported for the annotation only: importing it needs the ray extra
    from rlstruct.batchers.ray.batcher import RayBatcher

__all__ = ["LayoutConfig", "make_batcher", "checked_agent_factory", "default_processes"]


def default_processes() -> int:
    """The number of cores this process may use (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class LayoutConfig:
    """Where each part of an experiment runs (the same flags for every algorithm)."""

    learner_device: str = "auto"
    """device of the model being trained and of the loss (auto: cuda:0 when there is a GPU)"""
    batcher_device: str = "cpu"
    """device of the training batcher: cpu (worker processes) or a GPU (one process)"""
    eval_device: str = "cpu"
    """device of the evaluation batcher: cpu (a worker process of its own) or a GPU"""
    n_processes: int = 2
    """training worker processes on the CPU (0: one per core; 1: no worker, collect here, or one
    worker with --pipeline 2)"""
    n_envs: int = 8
    """environments per worker process (or in the device batcher)"""
    check_devices: bool = False
    """wrap every agent in CheckDevice (a debugging aid)"""
    pipeline: int = 1
    """segment slots per worker: 1 collects then learns; 2 collects the next batch while learning
    on this one (one update of policy lag; on the CPU batcher only)"""
    backend: Literal["local", "ray"] = "local"
    """training workers: local processes, or Ray actors (pip install rlstruct[ray]; see
    docs/guide-clusters.md)"""
    ray_address: str | None = None
    """Ray cluster to join (auto: the one `ray start` set up); None: the configured one, else a
    local cluster on this machine"""
    max_restarts: int = 0
    """worker faults absorbed by replacing the worker, over the whole run (a process or Ray actor
    that dies, a node lost, an env or agent that raises; 0: the first fault ends the run)"""
    ray_num_cpus: float = 1.0
    """CPUs Ray reserves for each actor (--backend ray; fractions allowed)"""
    ray_num_gpus: float = 0.0
    """GPUs Ray reserves for each actor (--backend ray; 0.25: four actors share a GPU)"""
    ray_resources: dict[str, float] = field(default_factory=dict)
    """custom Ray resources each actor needs (--backend ray), e.g. `--ray-resources rollout 1`
    places the actors only on nodes started with `ray start --resources '{"rollout": 8}'`"""
    n_learners: int = 1
    """learner ranks (ppo, a2c, impala, sac, trpo): each learns on 1/N of every batch's rows
    and the gradients (TRPO: also its Fisher-vector products, line search and statistics) are
    averaged (torch.distributed; see docs/guide-learners.md); 1: learn here"""
    learner_devices: str | None = None
    """one device per learner rank, comma-separated (cuda:0,cuda:1); None: learner_device's
    type, cuda:0..N-1 on GPUs"""
    learner_backend: Literal["local", "ray"] = "local"
    """learner ranks: processes of this machine, or Ray actors that Ray places (pip install
    rlstruct[ray]; joins --ray-address like the batcher; see docs/guide-learners.md)"""
    learner_num_gpus: float = 0.0
    """GPUs Ray reserves for each learner rank (--learner-backend ray; 1: a GPU each, NCCL;
    fractions share a GPU with gloo; 0: the CPU)"""
    learner_num_cpus: float = 1.0
    """CPUs Ray reserves for each learner rank (--learner-backend ray)"""
    learner_resources: dict[str, float] = field(default_factory=dict)
    """custom Ray resources each learner rank needs (--learner-backend ray), e.g.
    `--learner-resources learner 1` places the ranks on nodes started with that resource"""

    def batcher_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`make_batcher` that come from this layout besides the
        devices and sizes: the restart budget and the Ray actors' resources."""
        return {
            "max_restarts": self.max_restarts,
            "ray_actor": {
                "num_cpus_per_actor": self.ray_num_cpus,
                "num_gpus_per_actor": self.ray_num_gpus,
                "resources": dict(self.ray_resources),
            },
        }

    def problems(self) -> list[str]:
        """Every problem of the layout (empty: none), for :class:`~rlstruct.runs.run.RunConfig` to
        list with its own before anything starts."""
        problems = []
        if self.n_learners < 1:
            problems.append(f"n_learners must be >= 1, got {self.n_learners}")
        devices = self.learner_devices.split(",") if self.learner_devices else []
        if devices and len(devices) != self.n_learners:
            problems.append(f"learner_devices names {len(devices)} device(s) ({devices}) for "
                            f"n_learners={self.n_learners}: give one per rank")
        problems += self._learner_problems()
        if self.n_envs < 1:
            problems.append(f"n_envs must be >= 1, got {self.n_envs}")
        if self.n_processes < 0:
            problems.append(f"n_processes must be >= 0 (0: one per core), got {self.n_processes}")
        if self.pipeline < 1:
            problems.append(f"pipeline must be >= 1, got {self.pipeline}")
        for name in ("learner_device", "batcher_device", "eval_device"):
            value = getattr(self, name)
            if value != "auto":
                try:
                    torch.device(value)
                except (RuntimeError, TypeError) as err:
                    problems.append(f"{name} {value!r} is not a device: {err}")
        return problems

    def _learner_problems(self) -> list[str]:
        problems = []
        if self.learner_backend == "ray":
            if importlib.util.find_spec("ray") is None:
                problems.append("learner_backend 'ray' needs Ray, an optional extra: pip install "
                                "rlstruct[ray]")
            if self.learner_devices:
                problems.append("learner_devices places local ranks; with learner_backend 'ray' "
                                "Ray places them: ask for learner_num_gpus instead")
            for name in ("learner_num_gpus", "learner_num_cpus"):
                if not getattr(self, name) >= 0:
                    problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
            bad = {k: v for k, v in self.learner_resources.items() if not v >= 0}
            if bad:
                problems.append(f"learner_resources must be >= 0, got {bad}")
        elif self.learner_num_gpus or self.learner_resources or self.learner_num_cpus != 1.0:
            problems.append("learner_num_gpus, learner_num_cpus and learner_resources are Ray's "
                            "placement of the learner ranks: add --learner-backend ray")
        return problems


class _Checked:
    """Picklable factory: builds the agent and wraps it in CheckDevice."""

    def __init__(self, create_agent: Callable[..., Agent], device: torch.device) -> None:
        self.create_agent, self.device = create_agent, device

    def __call__(self, **agent_args: Any) -> Agent:
        return CheckDevice(self.create_agent(**agent_args), self.device)


def checked_agent_factory(
    create_agent: Callable[..., Agent], device: DeviceLike
) -> Callable[..., Agent]:
    """``create_agent`` whose agents are wrapped in CheckDevice for ``device``."""
    return _Checked(create_agent, torch.device(device))


def make_batcher(
    *,
    device: DeviceLike,
    n_processes: int,
    n_timesteps: int,
    create_agent: Callable[..., Agent],
    agent_args: Mapping[str, Any],
    create_env: Callable[..., VecEnv],
    env_args: Mapping[str, Any],
    seeds: int | Sequence[int],
    agent_info: DictTensor | None = None,
    env_info: DictTensor | None = None,
    check_devices: bool = False,
    pipeline: int = 1,
    backend: str = "local",
    ray_address: str | None = None,
    max_restarts: int = 0,
    ray_actor: Mapping[str, Any] | None = None,
) -> Batcher | SerialBatcher | RayBatcher:
    """The batcher a device layout calls for.

    Args:
        device: the batcher's device (``"auto"`` resolves to a GPU when there is one).
        n_processes: CPU worker processes (0: one per core); ignored on an accelerator.
        n_timesteps: ``T`` of each segment.
        create_agent: builds the agent (on the CPU; the batcher moves its copy to ``device``).
        agent_args: keyword arguments of ``create_agent`` (CPU tensors and modules).
        create_env: ``create_env(**env_args, seed=s) -> VecEnv`` on the CPU.
        env_args: keyword arguments of ``create_env``.
        seeds: the run seed.
        agent_info: example agent_info (1 or B rows).
        env_info: example env_info (1 or B rows).
        check_devices: wrap the agent in CheckDevice.
        pipeline: segment slots per worker (``Batcher(pipeline=...)``); more than 1 needs
            worker processes (on the CPU, ``n_processes=1`` then gives one worker process).
        backend: ``"local"`` (worker processes of this machine) or ``"ray"`` (a
            :class:`~rlstruct.batchers.ray.batcher.RayBatcher`, one actor per worker).
        ray_address: the Ray cluster to join (``backend="ray"`` only).
        max_restarts: worker faults absorbed by a restart
            (:class:`~rlstruct.batchers.restart.RestartPolicy`); 0: fail fast. A SerialBatcher
            has no workers to restart: there it is ignored.
        ray_actor: ``num_cpus_per_actor``, ``num_gpus_per_actor`` and ``resources`` (custom
            Ray resources) of the actors (``backend="ray"`` only;
            :meth:`LayoutConfig.batcher_options` gives them).

    Returns:
        A SerialBatcher on ``device`` for an accelerator (or one CPU process without a
        pipeline), else a Batcher (or a RayBatcher with ``backend="ray"``).

    Raises:
        ConfigError: a bad pipeline (the batchers' one check), a pipeline on an accelerator
            (no worker processes there); an unknown backend.
    """
    device = resolve_device(device)
    if check_devices:
        create_agent = checked_agent_factory(create_agent, device)
    common = dict(
        n_timesteps=n_timesteps,
        create_agent=create_agent,
        agent_args=agent_args,
        create_env=create_env,
        env_args=env_args,
        seeds=seeds,
        agent_info=agent_info,
        env_info=env_info,
    )
    n_processes = n_processes or default_processes()
    problems = BatcherBase._validate_pipeline(pipeline)
    if problems:
        raise ConfigError("; ".join(problems))
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ConfigError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
    restart = RestartPolicy(max_restarts=max_restarts) if max_restarts else None
    if backend == "ray":
        from rlstruct.batchers import RayBatcher

        actor = dict(ray_actor or {})
        resources = actor.pop("resources", None)
        return RayBatcher(
            **common, n_processes=n_processes, address=ray_address, restart=restart,
            pipeline=pipeline,
            num_cpus_per_actor=actor.pop("num_cpus_per_actor", 1),
            num_gpus_per_actor=actor.pop("num_gpus_per_actor", 0),
            actor_options={"resources": dict(resources), **actor} if resources else actor or None,
        )  # fmt: skip
    if backend != "local":
        raise ConfigError(f"backend must be 'local' or 'ray', got {backend!r}")
    if is_accelerator(device) and pipeline > 1:
        raise ConfigError(
            f"pipeline={pipeline} needs worker processes: use the CPU batcher (the device "
            "batcher collects in the learner's process)"
        )
    if is_accelerator(device) or (n_processes == 1 and pipeline == 1):
        return SerialBatcher(**common, device=device)
    return Batcher(**common, n_processes=n_processes, pipeline=pipeline, restart=restart)
