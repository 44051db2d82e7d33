"""envpool as an optional dependency of :class:`~rlstruct.envs.EnvPoolEnv`, and the checks of
its arguments: those that need no envpool (run first, so a bad argument fails the same way with
or without it) and the task id (against ``envpool.list_all_envs()``).
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from rlstruct.errors import ConfigError, install_hint

__all__ = ["import_envpool", "atari_twin", "atari_envpool_kwargs"]

_INT32_MAX = 2**31 - 1
#: envpool.make arguments that EnvPoolEnv sets itself.
_OWN_KWARGS = {
    "num_envs": "n_envs",
    "seed": "seed",
    "env_seed": "seed",
    "env_type": None,
    "batch_size": None,
}
INSTALL_HINT = (
    f"EnvPoolEnv needs envpool: {install_hint('envpool')}; envpool publishes binary wheels "
    "only (Linux x86_64 among others, CPython 3.11 included)"
)


def import_envpool() -> ModuleType:
    """Imports envpool, or raises an ``ImportError`` that says how to install it.

    Raises:
        ImportError: envpool is not installed or does not import (its message is kept as the
            cause).
    """
    try:
        return importlib.import_module("envpool")
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({type(e).__name__}: {e})") from e



def check_arguments(
    n_envs: int, seed: int, env_id_offset: int, info_keys: Sequence[str],
    envpool_kwargs: dict[str, Any],
) -> None:
    """The checks of :class:`~rlstruct.envs.EnvPoolEnv`'s arguments that need no envpool.

    Raises:
        ConfigError: a bad ``n_envs``, ``seed`` or offset, ``seed + n_envs - 1`` over an int32,
            ``info_keys`` given as one str, or a keyword EnvPoolEnv sets itself.
    """
    check_int("n_envs", n_envs, 1)
    check_int("seed", seed, 0)
    check_int("env_id_offset", env_id_offset, 0)
    if isinstance(info_keys, str):
        raise ConfigError(f"info_keys must be a sequence of names, got the str {info_keys!r}")
    if seed + n_envs - 1 > _INT32_MAX:
        raise ConfigError(
            f"seed={seed} with n_envs={n_envs}: envpool seeds env k with seed + k, which must "
            f"fit an int32 (<= {_INT32_MAX})"
        )
    for key, ours in _OWN_KWARGS.items():
        if key in envpool_kwargs:
            what = f"pass it as {ours}=" if ours else "EnvPoolEnv sets it itself"
            if key == "batch_size":
                what = (
                    "EnvPoolEnv runs envpool in synchronous mode (batch_size = n_envs); "
                    "envpool's asynchronous mode does not fit a VecEnv"
                )
            raise ConfigError(f"envpool keyword {key}={envpool_kwargs[key]!r}: {what}")
    if "noop_max" in envpool_kwargs:  # envpool 1.2.5 dies of a segmentation fault at 0
        try:
            check_int("noop_max", envpool_kwargs["noop_max"], 1)
        except ConfigError as err:
            raise ConfigError(
                f"envpool keyword noop_max={envpool_kwargs['noop_max']!r}: {err} (envpool 1.2.5 "
                "crashes the process with a segmentation fault at noop_max=0; noop_max=1 "
                "starts every episode without random no-ops)") from None


def check_task_id(envpool: Any, env: str) -> None:
    """Raises a :class:`~rlstruct.errors.ConfigError`, with the nearest ids, if ``env`` is no
    task id of the ``envpool`` module given."""
    if not isinstance(env, str) or env not in envpool.list_all_envs():
        close = difflib.get_close_matches(str(env), envpool.list_all_envs(), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ConfigError(
            f"{env!r} is not an envpool task id (envpool.list_all_envs() lists them; Atari "
            f"ids have no 'ALE/' prefix, e.g. 'Pong-v5'){hint}"
        )


def check_int(name: str, value: Any, low: int) -> None:
    """Raises a :class:`~rlstruct.errors.ConfigError` unless ``value`` is an int (not a bool)
    >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")


def atari_twin(env_id: str) -> tuple[str, float] | None:
    """envpool's task for an ALE id and the id's sticky-action probability, or ``None`` for an
    id that is not ALE's.

    ``ALE/<Game>-v5`` plays with sticky actions (0.25 per emulator frame) and
    ``<Game>NoFrameskip-v4`` without: both are envpool's ``<Game>-v5`` with that
    ``repeat_action_probability`` (ale-py's own registrations say so).

    Example:
        >>> atari_twin("PongNoFrameskip-v4"), atari_twin("ALE/Pong-v5"), atari_twin("CartPole-v1")
        (('Pong-v5', 0.0), ('Pong-v5', 0.25), None)
    """
    if match := re.fullmatch(r"ALE/([A-Za-z]+)-v5", env_id):
        return f"{match[1]}-v5", 0.25
    if match := re.fullmatch(r"([A-Za-z]+)NoFrameskip-v4", env_id):
        return f"{match[1]}-v5", 0.0
    return None


def atari_envpool_kwargs(env_id: str, frame_stack: int = 4) -> tuple[str, dict[str, Any]]:
    """``(task, envpool keywords)`` that make envpool's Atari env play ``env_id`` as
    :func:`~rlstruct.envs.atari.make_atari_env` preprocesses it (``--env-backend envpool``).

    envpool's defaults differ from the atari backend's in three ways, set here: FIRE at each
    reset (off), no sticky actions for every id (the id's own), and ``stack_num`` (the
    run's ``frame_stack``). The rest are the same: up to 30 no-ops at reset, a frame skip of 4
    with the last two frames max-pooled, 84x84 grey frames resized with ``INTER_AREA``, the
    minimal action set, unclipped rewards, an episode to game over (no ``episodic_life``), and
    ALE's limit of 108,000 emulator frames (27,000 agent steps).

    Raises:
        ConfigError: ``env_id`` is not an ALE id (``ALE/<Game>-v5``, ``<Game>NoFrameskip-v4``).
    """
    twin = atari_twin(env_id)
    if twin is None:
        raise ConfigError(
            f"--env-backend envpool plays ALE ids (ALE/<Game>-v5, <Game>NoFrameskip-v4) with "
            f"the atari backend's preprocessing, not {env_id!r}; envpool's other tasks run "
            "through rlstruct.envs.EnvPoolEnv with a batcher of your own")
    task, sticky = twin
    return task, dict(repeat_action_probability=sticky, use_fire_reset=False,
                      episodic_life=False, reward_clip=False, noop_max=30, frame_skip=4,
                      img_height=84, img_width=84, stack_num=frame_stack,
                      max_episode_steps=27_000)
