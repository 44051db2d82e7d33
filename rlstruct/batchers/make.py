"""The batcher a device layout calls for: :func:`make_batcher`.

A batcher device that is an accelerator selects the single-process device batcher
(:class:`~rlstruct.SerialBatcher` with the envs behind a DeviceEnv); the CPU selects the
multi-process :class:`~rlstruct.Batcher` (or the SerialBatcher when ``n_processes`` is 1, which
saves the workers' start-up; with ``pipeline`` above 1 one worker process collects while the
learner learns); ``backend="ray"`` a :class:`~rlstruct.batchers.ray.batcher.RayBatcher`.
``check_devices`` wraps every agent in :class:`~rlstruct.CheckDevice`. The run scaffold calls it
with the fields of its :class:`~rlstruct.runs.layout.LayoutConfig`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from rlstruct.agent import Agent
from rlstruct.batchers.base import BatcherBase
from rlstruct.batchers.process.batcher import Batcher
from rlstruct.batchers.restart import RestartPolicy
from rlstruct.batchers.serial import SerialBatcher
from rlstruct.checks import CheckDevice
from rlstruct.devices import is_accelerator, resolve_device
from rlstruct.dicttensor import DeviceLike, DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.errors import ConfigError

if TYPE_CHECKING:  # imported for the annotation only: importing it needs the ray extra
    from rlstruct.batchers.ray.batcher import RayBatcher

__all__ = ["make_batcher", "checked_agent_factory", "default_processes"]


def default_processes() -> int:
    """The number of cores this process may use (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


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
    timeout: float = 300.0,
    adaptive_timeout: bool = False,
    deadline: float | None = None,
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
            Ray resources) of the actors (``backend="ray"``; from ``batcher_options``).
        timeout: with ``adaptive_timeout`` and ``deadline``: how long the workers may stay
            silent (:class:`~rlstruct.batchers.deadlines.Deadlines`); ignored by a
            SerialBatcher (nothing can interrupt a hung env in this process).

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
    common = dict(n_timesteps=n_timesteps, create_agent=create_agent, agent_args=agent_args,
                  create_env=create_env, env_args=env_args, seeds=seeds, agent_info=agent_info,
                  env_info=env_info)
    n_processes = n_processes or default_processes()
    restart = _restart_policy(pipeline, max_restarts)
    waits, ray_options = dict(timeout=timeout, adaptive_timeout=adaptive_timeout,
                              deadline=deadline), (ray_address, ray_actor)
    if backend == "ray":
        return _ray_batcher({**common, **waits}, n_processes, pipeline, restart, *ray_options)
    if backend != "local":
        raise ConfigError(f"backend must be 'local' or 'ray', got {backend!r}")
    if is_accelerator(device) and pipeline > 1:
        raise ConfigError(
            f"pipeline={pipeline} needs worker processes: use the CPU batcher (the device "
            "batcher collects in the learner's process)"
        )
    if is_accelerator(device) or (n_processes == 1 and pipeline == 1):
        return SerialBatcher(**common, device=device)
    return Batcher(**common, **waits, n_processes=n_processes, pipeline=pipeline, restart=restart)


def _restart_policy(pipeline: int, max_restarts: int) -> RestartPolicy | None:
    """Checks ``pipeline`` and ``max_restarts``; the restart policy they call for (None: fail
    fast)."""
    problems = BatcherBase.validate_pipeline(pipeline)
    if problems:
        raise ConfigError("; ".join(problems))
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ConfigError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
    return RestartPolicy(max_restarts=max_restarts) if max_restarts else None


def _ray_batcher(
    common: dict[str, Any],
    n_processes: int,
    pipeline: int,
    restart: RestartPolicy | None,
    ray_address: str | None,
    ray_actor: Mapping[str, Any] | None,
) -> RayBatcher:
    """The RayBatcher of :func:`make_batcher` (``backend="ray"``), its actors' options split
    out of ``ray_actor``."""
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
