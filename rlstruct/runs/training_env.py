"""The env factory a run's training batcher builds its envs with: :func:`training_env`
(for :meth:`Run.training_batcher <rlstruct.runs.run.Run.training_batcher>`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlstruct.envs.base import VecEnv
from rlstruct.envs.gym import GymEnvInf
from rlstruct.envs.registry import EnvModules
from rlstruct.envs.torch import make_torch_env
from rlstruct.envs.vector import VectorEnvAdapter
from rlstruct.errors import ConfigError

__all__ = ["training_env", "envpool_training_env", "envpool_threads"]


def training_env(
    algo: str, cfg: Any, create_env: Callable[..., VecEnv], batcher_device: torch.device,
) -> tuple[Callable[..., VecEnv], dict[str, Any]]:
    """``(create_env, env_args)`` of a run's training envs: the algorithm's ``create_env``
    for gymnasium envs, the torch-native env on ``batcher_device`` for ``--env-backend
    torch``, the preprocessed Atari env for ``--env-backend atari`` (envpool's, playing the
    same game with the same preprocessing, for ``--env-backend envpool``), the id's registered
    vector env behind a :class:`~rlstruct.envs.VectorEnvAdapter` for ``--env-backend vector``;
    wrapped so that every
    process that builds an env imports ``cfg.env_module`` first.

    Args:
        algo: the algorithm's name (for messages).
        cfg: the run's resolved :class:`~rlstruct.runs.config.RunConfig`.
        create_env: the algorithm's env factory.
        batcher_device: the training batcher's resolved device.

    Raises:
        ConfigError: another env backend than gymnasium's for an algorithm that does not
            collect with auto-reset gymnasium envs (``GymEnvInf``).
    """
    env_args: dict[str, Any] = {"env": cfg.env_id, "n_envs": cfg.layout.n_envs}
    if cfg.env_backend != "gymnasium":
        if create_env is not GymEnvInf:
            raise ConfigError(
                f"{algo} collects with {getattr(create_env, '__name__', create_env)}; "
                f"--env-backend {cfg.env_backend} replaces auto-reset gymnasium envs "
                "(GymEnvInf) only"
            )
        if cfg.env_backend == "torch":
            create_env = make_torch_env
            env_args["device"] = str(batcher_device)
        elif cfg.env_backend == "envpool":
            create_env, env_args = envpool_training_env(cfg)
        elif cfg.env_backend == "vector":
            create_env = VectorEnvAdapter
            env_args = {"make_env": cfg.env_id, "n_envs": cfg.layout.n_envs,
                        "make_kwargs": {"vectorization_mode": "vector_entry_point"}}
        else:
            from rlstruct.envs.atari import make_atari_env

            create_env = make_atari_env
            env_args["frame_stack"] = cfg.frame_stack
    if cfg.env_module:  # every process that builds an env imports them first
        create_env = EnvModules(create_env, cfg.env_module)
    return create_env, env_args


def envpool_threads(n_processes: int, cores: int | None = None) -> int:
    """envpool's ``num_threads`` for each of a run's pools: the machine's cores shared among
    the worker processes (``n_processes``; 0: one per core), at least one; one pool in this
    process (``n_processes`` 1) steps its envs on every core.

    Example:
        >>> envpool_threads(2, cores=2), envpool_threads(1, cores=16), envpool_threads(0, 4)
        (1, 16, 1)
    """
    if cores is None:
        from rlstruct.runs.machine import Machine

        cores = Machine.here().cores
    return max(1, cores // n_processes) if n_processes > 0 else 1


def envpool_training_env(cfg: Any) -> tuple[Callable[..., VecEnv], dict[str, Any]]:
    """``(EnvPoolEnv, env_args)`` for ``--env-backend envpool``: each worker (or this process)
    steps its ``n_envs`` of ``cfg.env_id``'s game in one envpool with
    :func:`envpool_threads` threads, preprocessed as the atari backend does
    (:func:`~rlstruct.envs.envpool_args.atari_envpool_kwargs`)."""
    from rlstruct.envs.envpool import EnvPoolEnv
    from rlstruct.envs.envpool_args import atari_envpool_kwargs

    task, kwargs = atari_envpool_kwargs(cfg.env_id, cfg.frame_stack)
    threads = envpool_threads(cfg.layout.n_processes)
    return EnvPoolEnv, {"env": task, "n_envs": cfg.layout.n_envs, "num_threads": threads,
                        **kwargs}
