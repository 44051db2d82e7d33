"""Fault injection for reliability tests: envs that raise, hang, die or emit NaN on schedule.

The schedule is deterministic: the env whose seed is ``fault_seed`` (for a batcher with an int run
seed ``s``, global env ``g`` has seed ``s * 2**20 + g``) misbehaves at its ``at_step``-th call of
``step`` (0-based, counted over the env's life). Everything here is picklable, so the factories
work in spawned worker processes.

Examples:
    >>> env = faulty_gym_env("CartPole-v1", n_envs=2, seed=10, fault="raise", fault_seed=11,
    ...                      at_step=0)
    >>> _ = env.reset()
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import gymnasium as gym
import numpy as np

from rlstruct.envs.gym import GymEnv, GymEnvInf

__all__ = ["FAULTS", "InjectedFaultError", "FaultyEnv", "faulty_gym_env"]

#: The faults a :class:`FaultyEnv` can inject.
FAULTS = ("raise", "hang", "exit", "kill", "nan", "raise_in_reset")


class InjectedFaultError(RuntimeError):
    """The exception a ``fault="raise"`` env raises."""


class FaultyEnv(gym.Wrapper):
    """Wraps a gymnasium env and injects ``fault`` at its ``at_step``-th ``step`` call.

    Args:
        env: the env to wrap.
        fault: one of :data:`FAULTS`: ``raise`` an InjectedFaultError, ``hang`` (sleep
            ``hang_seconds``), ``exit`` (``os._exit(3)``), ``kill`` (SIGKILL itself), ``nan``
            (NaN observation and reward); ``raise_in_reset`` raises from ``reset`` instead (at
            every reset; ``at_step`` is ignored).
        at_step: the 0-based index of the faulty ``step`` call.
        hang_seconds: how long ``hang`` sleeps.
    """

    def __init__(self, env: gym.Env, fault: str, at_step: int, hang_seconds: float = 3600.0):
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
        super().__init__(env)
        self.fault, self.at_step, self.hang_seconds = fault, at_step, hang_seconds
        self.n_steps = 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.fault == "raise_in_reset":
            raise InjectedFaultError("injected fault in reset")
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        due = self.n_steps == self.at_step
        self.n_steps += 1
        if due and self.fault == "raise":
            raise InjectedFaultError(f"injected fault at step call {self.at_step}")
        if due and self.fault == "hang":
            time.sleep(self.hang_seconds)
        if due and self.fault == "exit":
            os._exit(3)
        if due and self.fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        obs, reward, terminated, truncated, info = self.env.step(action)
        if due and self.fault == "nan":
            obs = np.full_like(obs, np.nan)
            reward = float("nan")
        return obs, reward, terminated, truncated, info


def _make(env_id: str, fault: str | None, at_step: int, hang_seconds: float) -> gym.Env:
    env = gym.make(env_id)
    return env if fault is None else FaultyEnv(env, fault, at_step, hang_seconds)


class _Factory:
    """A picklable zero-argument factory (a closure would be too, but this reads better)."""

    def __init__(self, env_id: str, fault: str | None, at_step: int, hang_seconds: float):
        self.args = (env_id, fault, at_step, hang_seconds)

    def __call__(self) -> gym.Env:
        return _make(*self.args)


def faulty_gym_env(
    env_id: str,
    n_envs: int,
    seed: int,
    fault: str = "raise",
    fault_seed: int = -1,
    at_step: int = 0,
    hang_seconds: float = 3600.0,
    auto_reset: bool = False,
    factory_fails: bool = False,
) -> GymEnv:
    """A ``create_env`` for batchers: ``n_envs`` copies of ``env_id``, the one seeded
    ``fault_seed`` wrapped in :class:`FaultyEnv`.

    Args:
        env_id: a gymnasium id.
        n_envs: envs in the VecEnv.
        seed: seed of env 0 (env ``k`` gets ``seed + k``).
        fault: what the faulty env does (see :class:`FaultyEnv`).
        fault_seed: the seed of the faulty env (no env is faulty if no seed matches).
        at_step: the faulty env's 0-based faulty ``step`` call.
        hang_seconds: how long a ``hang`` lasts.
        auto_reset: build a GymEnvInf instead of a GymEnv.
        factory_fails: raise InjectedFaultError from this factory itself when ``fault_seed`` is
            one of its seeds (a failing env constructor).

    Returns:
        The VecEnv.
    """
    seeds = range(seed, seed + n_envs)
    if factory_fails and fault_seed in seeds:
        raise InjectedFaultError(f"injected failure of the env factory (seed {fault_seed})")
    factories = [
        _Factory(env_id, fault if s == fault_seed else None, at_step, hang_seconds) for s in seeds
    ]
    return (GymEnvInf if auto_reset else GymEnv)(factories, seed=seed)
