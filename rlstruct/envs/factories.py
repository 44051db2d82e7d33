"""Building the gymnasium envs of a VecEnv: from a gymnasium id or a list of factories.

What :class:`~rlstruct.envs.GymEnv` and :class:`~rlstruct.envs.GymEnvInf` do before their first
reset: make ``N`` envs (``gym.make(id)`` or one per factory), optionally cast their float ``Box``
observations (``obs_dtype``), and refuse what would make a wrong VecEnv, each with the fix: env
instances where factories are expected (rlstructures' ``GymEnv(envs, seed)``), factories that
return one env several times (Python's late binding), and ``n_envs`` that does not fit. Every env
built before an error is closed, each underlying env once.

MuJoCo prints its warnings from C at every model it compiles (HalfCheetah's ``settotalmass``
deprecation, once per env made); before the first MuJoCo env of a process is made,
:func:`warn_once_from_mujoco` makes each distinct MuJoCo warning print once per process.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlstruct.envs.spaces import short_repr
from rlstruct.errors import ConfigError, RLStructError

__all__ = ["EnvFactory", "make_envs", "cast_observations", "refuse_env_instances",
           "warn_once_from_mujoco"]

#: A zero-argument callable that builds one gymnasium env (must be picklable for worker batchers).
EnvFactory = Callable[[], gym.Env]


def cast_observations(env: gym.Env, dtype: str | np.dtype | torch.dtype) -> gym.Env:
    """``env`` with its float ``Box`` observations cast to ``dtype`` (the ``obs_dtype`` option).

    Raises:
        ConfigError: ``dtype`` is not a float dtype, or the observations are not a float Box.
    """
    why = f"obs_dtype must be a float dtype such as 'float32', got {dtype!r}"
    try:
        target = np.dtype(torch.empty(0, dtype=dtype).numpy().dtype
                          if isinstance(dtype, torch.dtype) else dtype)
    except TypeError as e:
        raise ConfigError(why) from e
    if target.kind != "f":
        raise ConfigError(why)
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or space.dtype.kind != "f":
        raise ConfigError(
            f"obs_dtype={dtype!r} casts float Box observations, but the env has {space!r}; "
            "cast other observations with a gymnasium ObservationWrapper"
        )
    if space.dtype == target:
        return env
    with warnings.catch_warnings():  # gymnasium's Box warns about casting its bounds (+-inf)
        warnings.filterwarnings("ignore", ".*precision lowered", UserWarning)
        warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)
        return gym.wrappers.DtypeObservation(env, target)


def make_envs(
    env: str | Sequence[EnvFactory], n_envs: int | None, make_kwargs: Mapping[str, Any] | None
) -> list[gym.Env]:
    """Builds the envs of a VecEnv: ``n_envs`` ``gym.make(env)`` or one env per factory.

    Args:
        env: a gymnasium id, or a non-empty list of zero-argument factories.
        n_envs: the number of envs for an id (default 1); ``None`` or ``len(env)`` for factories.
        make_kwargs: keyword arguments of ``gym.make`` (id only).

    Returns:
        The envs, distinct objects over distinct underlying envs.

    Raises:
        ConfigError: a bad ``env`` or ``n_envs`` (with what changed since rlstructures when the
            call looks like rlstructures' ``GymEnv(envs, seed)``), a factory that returns no
            gymnasium env, or factories that return the same env twice. Every env built before
            the error is closed, each once.
    """
    refuse_env_instances(env, n_envs)
    factory_list = isinstance(env, Sequence) and not isinstance(env, str)
    if n_envs is not None and (
        isinstance(n_envs, bool) or not isinstance(n_envs, (int, np.integer)) or n_envs < 1
    ):
        raise ConfigError(
            f"n_envs must be an int >= 1 or None, got {n_envs!r}"
            + (_SECOND_ARGUMENT.format(n=n_envs) if factory_list else "")
        )
    if isinstance(env, str):
        factories: list[EnvFactory] = [lambda: gym.make(env, **(make_kwargs or {}))] * (
            1 if n_envs is None else int(n_envs)
        )
    elif factory_list and env and all(callable(f) for f in env):
        if make_kwargs:
            raise ConfigError("make_kwargs only applies when env is a gymnasium id")
        if n_envs is not None and n_envs != len(env):
            raise ConfigError(
                f"n_envs={n_envs} but {len(env)} env factories were given"
                + _SECOND_ARGUMENT.format(n=n_envs)
            )
        factories = list(env)
    else:
        raise ConfigError(
            f"env must be a gymnasium id or a non-empty list of zero-argument env factories, "
            f"got {short_repr(env)}"
        )
    warn_once_from_mujoco(env if isinstance(env, str) else env[0])
    envs: list[gym.Env] = []
    try:
        for k, factory in enumerate(factories):
            e = factory()
            if not isinstance(e, gym.Env):
                raise ConfigError(
                    f"env factory {k} returned {type(e).__name__}, not a gymnasium.Env"
                )
            envs.append(e)
        _refuse_shared_envs(envs)
    except BaseException as exc:
        if not isinstance(exc, RLStructError) and hasattr(exc, "add_note"):
            exc.add_note(f"raised while building env {len(envs)}")
            if isinstance(exc, TypeError) and "max_episode_steps" in str(exc):
                exc.add_note(_TIME_LIMIT_HINT)
        _close_once(envs)
        raise
    return envs


_MUJOCO_SEEN: set[str] = set()  # the MuJoCo warnings printed by this process


def _mujoco_warning(message: str) -> None:
    if message not in _MUJOCO_SEEN:
        _MUJOCO_SEEN.add(message)
        print(f"WARNING: {message}", file=sys.stderr, flush=True)


def _mujoco_id(env: Any) -> bool:
    """Whether ``env`` (a gymnasium id, or a factory such as ``partial(gym.make, id)``) is an
    env of gymnasium's MuJoCo suite."""
    if not isinstance(env, str):
        args = getattr(env, "args", ())
        env = next((a for a in args if isinstance(a, str)), None)
        if env is None:
            return False
    try:
        entry = gym.spec(env).entry_point
    except (gym.error.Error, ModuleNotFoundError):
        return False
    return isinstance(entry, str) and entry.startswith("gymnasium.envs.mujoco")


def warn_once_from_mujoco(env: Any = None) -> None:
    """From now on, MuJoCo's warnings print once each per process (MuJoCo prints one at every
    model it compiles: once per env made). Where MuJoCo is not imported yet, it is imported
    first when ``env`` (a gymnasium id or a factory) is a MuJoCo env; otherwise nothing
    happens. Idempotent."""
    if "mujoco" not in sys.modules and env is not None and _mujoco_id(env):
        with contextlib.suppress(ImportError):  # gym.make names the missing package itself
            importlib.import_module("mujoco")
    mujoco = sys.modules.get("mujoco")
    if mujoco is None or not hasattr(mujoco, "set_mju_user_warning"):
        return
    if mujoco.get_mju_user_warning() is None:  # MuJoCo's own printer: replace it, once
        mujoco.set_mju_user_warning(_mujoco_warning)


#: Appended to n_envs errors when env is a list: rlstructures' GymEnv took the seed second.
_SECOND_ARGUMENT = (
    "; GymEnv's second argument is n_envs (the number of envs, default len(env) for factories), "
    "not the seed as in rlstructures' GymEnv(envs, seed): if {n!r} is a seed, pass it as the "
    "keyword seed={n!r}"
)

#: Added to gymnasium's TypeError for ``TimeLimit(env, max_episode_steps=None)``.
_TIME_LIMIT_HINT = (
    "gymnasium's TimeLimit needs an int max_episode_steps (gym's accepted None for the "
    "registered limit): write gym.make(env_id, max_episode_steps=n), which keeps the registered "
    "limit when n is None, or wrap with TimeLimit only when n is not None"
)


def _is_env_instance(x: object) -> bool:
    """A gymnasium env, or an object with ``step`` and ``reset`` that is not a factory (gym's)."""
    return isinstance(x, gym.Env) or (
        not callable(x) and hasattr(x, "step") and hasattr(x, "reset")
    )


def _env_name(e: object) -> str:
    """The gymnasium id of an env (from its spec), else its class name."""
    spec = getattr(e, "spec", None)
    return str(getattr(spec, "id", None) or type(e).__name__)


def refuse_env_instances(env: object, n_envs: object) -> None:
    """Refuses env instances where factories are expected, saying what changed since
    rlstructures (whose ``GymEnv(gym_env, seed)`` took a list of instances and the seed second).

    Raises:
        ConfigError: ``env`` is an env instance, or a list holding one.
    """
    if _is_env_instance(env):
        name = _env_name(env)
        raise ConfigError(
            f"env is an env instance ({name}), but GymEnv builds its envs itself: pass a "
            f"gymnasium id (GymEnv({_id_or(name, 'CartPole-v1')!r}, n_envs=n, seed=s)) or a list "
            "of zero-argument factories that each build a fresh env; to keep this env instance "
            "e, pass [lambda: e]"
        )
    if not isinstance(env, Sequence) or isinstance(env, str):
        return
    where = [k for k, x in enumerate(env) if _is_env_instance(x)]
    if not where:
        return
    n = len(env)
    names = sorted({_env_name(env[k]) for k in where})
    if len(where) == n:
        what = f"a list of {n} env instance{'s' if n > 1 else ''} ({', '.join(names)})"
    else:
        what = (
            f"env instances at positions {_enumerate(where)}"
            if len(where) > 1
            else f"an env instance at position {where[0]}"
        ) + f" ({', '.join(names)}) among factories"
    changed = "rlstruct takes zero-argument factories that each build a fresh env"
    if n_envs is None:
        seed = "s"
        what += f": rlstructures' GymEnv(envs, seed) took env instances, {changed}"
    else:
        seed = repr(n_envs)
        what += (
            f" and n_envs={n_envs!r}: this is rlstructures' GymEnv(envs, seed), which changed: "
            f"{changed}, its second argument is n_envs (default: one env per factory) and the "
            "seed is the keyword seed="
        )
    ids = {_id_or(name, "") for name in names} - {""}
    by_id = f"GymEnv({ids.pop()!r}, n_envs={n}, seed={seed}), or " if len(ids) == 1 else ""
    raise ConfigError(
        f"GymEnv got {what}. Write {by_id}GymEnv([make_env] * {n}, seed={seed}) where make_env() "
        "builds one env (wrappers included); to keep envs already built, bind each one: "
        f"GymEnv([lambda e=e: e for e in envs], seed={seed}) (in [lambda: e for e in envs] "
        "every lambda returns the last env)"
    )


def _id_or(name: str, default: str) -> str:
    """``name`` if it looks like a gymnasium id (``Name-v<k>``), else ``default``."""
    return name if "-v" in name else default


def _refuse_shared_envs(envs: Sequence[gym.Env]) -> None:
    """Refuses factories that returned one env object (or wrappers of one env) more than once.

    A VecEnv would step that one env several times per step: the classic cause is Python's late
    binding, ``[lambda: e for e in envs]`` (every lambda returns the last ``e``).

    Raises:
        ConfigError: naming the factories that share an env.
    """
    groups: dict[int, list[int]] = {}
    for k, e in enumerate(envs):
        groups.setdefault(id(e.unwrapped), []).append(k)
    shared = [ks for ks in groups.values() if len(ks) > 1]
    if not shared:
        return
    parts = []
    for ks in shared:
        same = all(envs[k] is envs[ks[0]] for k in ks)
        obj = "the same env object" if same else "wrappers of the same env object"
        parts.append(f"env factories {_enumerate(ks)} returned {obj} ({_env_name(envs[ks[0]])})")
    example = _id_or(_env_name(envs[shared[0][0]]), "CartPole-v1")
    raise ConfigError(
        f"{'; '.join(parts)}: the VecEnv would step one env several times per step. In "
        "[lambda: e for e in envs] every lambda returns the last e (Python's late binding): "
        "bind each env with [lambda e=e: e for e in envs], or better give factories that each "
        f"build a fresh env (e.g. [lambda: gym.make({example!r})] * n)"
    )


def _close_once(envs: Sequence[gym.Env]) -> None:
    """Closes the envs of a refused or failed construction, each underlying env once, ignoring
    errors raised by ``close`` (the construction error is the one to report)."""
    closed: set[int] = set()
    for e in envs:
        base = id(e.unwrapped)
        if base in closed:
            continue
        closed.add(base)
        with contextlib.suppress(Exception):  # the construction error is the one to report
            e.close()


def _enumerate(indices: Sequence[int]) -> str:
    """``0``, ``0 and 1``, ``0, 1 and 2``."""
    names = [str(k) for k in indices]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
