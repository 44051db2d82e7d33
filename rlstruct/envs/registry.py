"""Finding the user's envs: modules that register them, id checks, close-match suggestions.

gymnasium knows an env id once the module that calls ``gymnasium.register`` has been imported.
A training run builds envs in several processes (the driver, the worker processes, the
evaluation worker, Ray actors), and each must import that module first. Two ways say which:

- ``--env-module pkg.mod`` (repeatable): :func:`import_env_modules` imports them in the driver,
  and :class:`EnvModules` wraps an env factory so that every process that builds an env
  imports them first (it pickles by module name, so it travels to workers and actors);
- gymnasium's own ``pkg.mod:Id`` form: ``gymnasium.make`` imports ``pkg.mod`` in whichever
  process calls it.

:func:`env_id_problems` checks an id before anything starts and suggests close matches;
:func:`probe_spaces` makes one env for its spaces (:func:`env_spaces`, :func:`env_shape`: its
observation shape, and its action space or number of actions).

Example:
    >>> env_id_problems("CartPole-v2")
    ["env_id 'CartPole-v2' is not registered with gymnasium (did you mean 'CartPole-v1', ...?)..."]
"""

from __future__ import annotations

import difflib
import functools
import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from rlstruct.envs.factories import warn_once_from_mujoco
from rlstruct.errors import ConfigError

__all__ = [
    "env_factory",
    "EnvModules", "env_dims", "env_id_problems", "env_module_problems", "env_shape", "env_spaces",
    "env_spec", "probe_spaces",
    "import_env_modules",
    "ATARI_BACKENDS",
]

#: The env backends that play ALE ids as preprocessed uint8 frames: ``atari`` (ale-py's
#: emulators behind gymnasium's wrappers) and ``envpool`` (envpool's C++ threads, the same game
#: and preprocessing, :func:`rlstruct.envs.envpool_args.atari_envpool_kwargs`).
ATARI_BACKENDS = ("atari", "envpool")


def env_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """``gymnasium.spec`` that also takes the ``pkg.mod:Id`` form (importing ``pkg.mod``
    first), as ``gymnasium.make`` does.

    Raises:
        ModuleNotFoundError: ``pkg.mod`` does not import.
        gymnasium.error.Error: the id is not registered.
    """
    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)
    return gym.spec(name)


def env_module_problems(modules: Sequence[str]) -> list[str]:
    """Imports each of ``modules``; returns one message per module that fails to import."""
    problems = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - a module's own error is reported, not raised
            problems.append(f"env_module {name!r} cannot be imported: {type(err).__name__}: "
                            f"{err} (is its folder on PYTHONPATH?)")
    return problems


def import_env_modules(modules: Sequence[str]) -> None:
    """Imports ``modules`` (their import registers envs with gymnasium).

    Raises:
        ConfigError: one or more modules do not import (all of them are named).
    """
    problems = env_module_problems(modules)
    if problems:
        raise ConfigError("; ".join(problems))


def env_id_problems(env_id: str, backend: str = "gymnasium") -> list[str]:
    """What is wrong with ``env_id`` for the env ``backend`` (empty: nothing).

    ``gymnasium`` ids must be registered (after the env modules are imported; ``pkg.mod:Id``
    imports ``pkg.mod`` here); an unknown one gets up to three close matches; ``vector`` ids
    also need a ``vector_entry_point`` and an ``entry_point``. ``torch`` ids must
    have a torch-native version; ``atari`` ids are checked once ale-py registered them (a
    missing ale-py is a problem too); ``envpool`` ids must be ALE ids whose game envpool has
    (a missing envpool is a problem).
    """
    if backend == "envpool":
        return _envpool_id_problems(env_id)
    if backend == "torch":
        from rlstruct.envs.torch import BY_GYM_ID

        if env_id not in BY_GYM_ID:
            return [f"env_id {env_id!r} has no torch-native version (--env-backend torch): "
                    f"there are {sorted(BY_GYM_ID)}{_suggest(env_id, BY_GYM_ID)}"]
        return []
    if backend == "atari":
        from rlstruct.envs.atari import register_atari_envs

        try:
            register_atari_envs()
        except ImportError as err:
            return [f"--env-backend atari: {err}"]
    try:
        spec = env_spec(env_id)
    except ModuleNotFoundError as err:
        return [f"env_id {env_id!r}: its module cannot be imported ({err})"]
    except gym.error.Error as err:
        name = env_id.split(":")[-1]
        return [f"env_id {env_id!r} is not registered with gymnasium{_suggest(name, gym.registry)}"
                f" ({type(err).__name__}: {err}); an env of your own needs --env-module "
                "pkg.mod (the module that registers it) or the id form pkg.mod:Id"]
    if backend == "vector" and (spec.vector_entry_point is None or spec.entry_point is None):
        return [f"env_id {env_id!r} is registered without a vector_entry_point or an "
                "entry_point; --env-backend vector trains on gymnasium.make_vec(env_id, "
                "vectorization_mode='vector_entry_point') and probes and evaluates "
                "gymnasium.make(env_id): register both (gymnasium.register(id, entry_point=..., "
                "vector_entry_point=...))"]
    return []


def _envpool_id_problems(env_id: str) -> list[str]:
    """:func:`env_id_problems` for ``--env-backend envpool``."""
    from rlstruct.envs.envpool_args import atari_envpool_kwargs, check_task_id, import_envpool

    try:
        task, _ = atari_envpool_kwargs(env_id)
        check_task_id(import_envpool(), task)
    except (ConfigError, ImportError) as err:
        return [f"--env-backend envpool: {err}"]
    return []


def _suggest(name: str, known: Any) -> str:
    matches = difflib.get_close_matches(name, [str(k) for k in known], n=3, cutoff=0.6)
    return f" (did you mean {', '.join(repr(m) for m in matches)}?)" if matches else ""


def env_dims(env_id: str) -> tuple[int, int]:
    """``(observation size, number of actions)`` of a gymnasium env with discrete actions.

    Raises:
        ConfigError: the action space is not ``Discrete``.
    """
    shape, n_actions = env_shape(env_id)
    return math.prod(shape), n_actions


def probe_spaces(env_id: str, backend: str = "gymnasium") -> tuple[gym.Space, gym.Space]:
    """``(observation space, action space)`` of ``env_id`` as the training envs of ``backend``
    produce them (``"atari"``: the preprocessed frames; ``"torch"``: the torch-native env's;
    ``"vector"``: the single-env spaces of its registered vector env), from one env made and
    closed here.

    Raises:
        ConfigError: ``backend`` is ``"torch"`` and ``env_id`` has no torch-native version, or
            the env was made but its ``close()`` raised (a close error, named as one).
        AutoresetModeError: ``backend`` is ``"vector"`` and the vector env states no auto-reset
            mode, or an unknown one (a ConfigError).
        Exception: whatever making the env raised (the caller reports it as an env that
            cannot be made).
    """
    if backend == "torch":
        from rlstruct.envs.torch import BY_GYM_ID

        if env_id not in BY_GYM_ID:
            raise ConfigError(
                f"no torch-native version of {env_id!r}; there are {sorted(BY_GYM_ID)} (use the "
                "gymnasium env backend for the others)"
            )
        cls = BY_GYM_ID[env_id]
        return cls.observation_space, cls.action_space
    if backend == "vector":
        return _probe_vector_env(env_id)
    if backend == "envpool":
        return _probe_envpool(env_id)
    if backend == "atari":
        from rlstruct.envs.atari import make_atari_gym_env

        probe = make_atari_gym_env(env_id)
    else:
        warn_once_from_mujoco(env_id)  # MuJoCo's warnings: once each, not once per env
        probe = gym.make(env_id)
    obs, actions = probe.observation_space, probe.action_space
    try:
        probe.close()
    except Exception as err:  # reported as a close error, with its cause
        raise ConfigError(
            f"env_id {env_id!r} was made, but its close() raised {type(err).__name__}: {err} "
            "(rlstruct closes every env it makes: the probe, the workers' envs, the "
            "evaluation's; make close() succeed, also on an env that was never reset)"
        ) from err
    return obs, actions


def _probe_envpool(env_id: str) -> tuple[gym.Space, gym.Space]:
    """The spaces of one envpool env playing ``env_id`` as ``--env-backend envpool`` does."""
    from rlstruct.envs.envpool import EnvPoolEnv
    from rlstruct.envs.envpool_args import atari_envpool_kwargs

    task, kwargs = atari_envpool_kwargs(env_id)
    probe = EnvPoolEnv(task, 1, num_threads=1, **kwargs)
    try:
        return probe.observation_space, probe.action_space
    finally:
        probe.close()


def _probe_vector_env(env_id: str) -> tuple[gym.Space, gym.Space]:
    """The single-env spaces of the vector env registered for ``env_id`` (one env made and
    closed here), its auto-reset mode checked: a mode the adapter cannot tell apart is a
    ConfigError before the run starts."""
    from rlstruct.envs.autoreset import autoreset_mode

    probe = gym.make_vec(env_id, num_envs=1, vectorization_mode="vector_entry_point")
    try:
        autoreset_mode(probe)
        return probe.single_observation_space, probe.single_action_space
    finally:
        probe.close()


def env_spaces(env_id: str, backend: str = "gymnasium") -> tuple[tuple[int, ...], gym.Space]:
    """``(observation shape, action space)`` of ``env_id`` as the training envs of ``backend``
    produce it (:func:`probe_spaces`; a space without a shape, such as ``Discrete``, has shape
    ``(1,)``).

    Raises:
        ConfigError: ``backend`` is ``"torch"`` and ``env_id`` has no torch-native version, or
            the env's ``close()`` raised.
    """
    obs, actions = probe_spaces(env_id, backend)
    return tuple(obs.shape or (1,)), actions


def env_shape(env_id: str, backend: str = "gymnasium") -> tuple[tuple[int, ...], int]:
    """``(observation shape, number of actions)`` of an env with discrete actions, as the
    training envs of ``backend`` produce it (``"atari"``: the preprocessed frames).

    Raises:
        ConfigError: the action space is not ``Discrete``.
    """
    shape, actions = env_spaces(env_id, backend)
    if not isinstance(actions, gym.spaces.Discrete):
        raise ConfigError(f"{env_id} has actions {actions}; these algorithms need Discrete ones")
    return shape, int(actions.n)


class EnvModules:
    """A picklable env factory that imports ``modules`` before it calls ``create_env``.

    Args:
        create_env: the factory (``create_env(**env_args, seed=s) -> VecEnv``).
        modules: module names that register envs with gymnasium.
    """

    def __init__(self, create_env: Callable[..., Any], modules: Sequence[str]) -> None:
        self.create_env, self.modules = create_env, tuple(modules)
        self.__name__ = getattr(create_env, "__name__", type(self).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import_env_modules(self.modules)
        return self.create_env(*args, **kwargs)

    def __repr__(self) -> str:
        return f"EnvModules({self.create_env!r}, {list(self.modules)})"


def env_factory(env_id: str, backend: str = "gymnasium") -> Callable[..., gym.Env]:
    """What makes one gymnasium env of a run's ``env_id`` as its ``env_backend`` trains on it:
    the preprocessed Atari env for ``"atari"`` (and ``"envpool"``: its game, played by ale-py),
    ``gym.make(env_id)`` otherwise (a ``"torch"`` run's env has the gymnasium spaces of its
    id). Keyword arguments (``render_mode``) go to it."""
    if backend in ATARI_BACKENDS:
        from rlstruct.envs.atari import make_atari_gym_env

        return functools.partial(make_atari_gym_env, env_id)
    return functools.partial(gym.make, env_id)
