"""Stepping a gymnasium env past ``gym.make``'s standard wrappers, and the time limit it had.

``gym.make`` wraps every env in ``PassiveEnvChecker``, ``OrderEnforcing`` and usually
``TimeLimit``: three Python calls per env and step that a VecEnv can do without, since it checks
actions and observations itself, refuses a step before reset, and can apply the time limit.
:func:`stepper` says what to call ``step`` on and which limit the VecEnv then applies.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["stepper"]


#: Wrappers that ``gym.make`` adds by default and that a VecEnv can do without: it checks
#: actions and observations itself, enforces reset-before-step, and applies the time limit.
_STANDARD_WRAPPERS = (
    gym.wrappers.TimeLimit,
    gym.wrappers.OrderEnforcing,
    gym.wrappers.PassiveEnvChecker,
)


def stepper(env: gym.Env) -> tuple[Any, int]:
    """What to call ``step`` on for ``env``, and the time limit to apply (0: none).

    An env wrapped by nothing but ``gym.make``'s standard wrappers (TimeLimit, OrderEnforcing,
    PassiveEnvChecker) is stepped through ``env.unwrapped``: the VecEnv validates actions and
    observations itself, refuses a step before reset, and applies the TimeLimit (truncated once
    ``env_step`` reaches ``max_episode_steps``, as the wrapper does), which saves three calls per
    env and step. Any other wrapper (a user's, Atari preprocessing) keeps the whole chain. An
    env's first reset goes through the whole chain (PassiveEnvChecker checks it, OrderEnforcing
    records it); the VecEnvs send its later resets where its steps go. For a ``Discrete`` action
    space the unwrapped env's ``action_space.contains`` gets a fast path for the int64 scalars
    the VecEnv passes (the same answer, without numpy's dtype introspection): gymnasium's
    classic envs assert it every step.
    """
    limit = 0
    inner = env
    while isinstance(inner, gym.Wrapper):
        if not isinstance(inner, _STANDARD_WRAPPERS) or type(inner) not in _STANDARD_WRAPPERS:
            return env, 0
        if isinstance(inner, gym.wrappers.TimeLimit):
            limit = int(getattr(inner, "_max_episode_steps", 0) or 0)
            if limit <= 0:
                return env, 0
        inner = inner.env
    space = inner.action_space
    if type(space) is gym.spaces.Discrete and space.dtype == np.int64:
        space.contains = _FastDiscreteContains(space)  # type: ignore[method-assign]
    return inner, limit


class _FastDiscreteContains:
    """``Discrete.contains`` with a fast path for numpy int64 scalars (the VecEnv's actions)."""

    def __init__(self, space: gym.spaces.Discrete) -> None:
        self._low = int(space.start)
        self._high = int(space.start) + int(space.n)
        self._general = type(space).contains.__get__(space)

    def __call__(self, x: Any) -> bool:
        if x.__class__ is np.int64:
            return self._low <= x < self._high
        return self._general(x)
