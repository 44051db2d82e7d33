"""envpool as an optional dependency of :class:`~rlstruct.envs.EnvPoolEnv`, and the checks of
its arguments: those that need no envpool (run first, so a bad argument fails the same way with
or without it) and the task id (against ``envpool.list_all_envs()``).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from rlstruct.errors import ConfigError, install_hint

__all__ = ["import_envpool"]

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
