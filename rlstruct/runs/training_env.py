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

__all__ = ["training_env"]


def training_env(
    algo: str, cfg: Any, create_env: Callable[..., VecEnv], batcher_device: torch.device,
) -> tuple[Callable[..., VecEnv], dict[str, Any]]:
    """``(create_env, env_args)`` of a run's training envs: the algorithm's ``create_env``
    for gymnasium envs, the torch-native env on ``batcher_device`` for ``--env-backend
    torch``, the preprocessed Atari env for ``--env-backend atari``, the id's registered
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
