"""How a gymnasium 1.x vector env resets an ended env: its ``AutoresetMode``, read from its
``metadata["autoreset_mode"]`` and refused when it cannot be told apart, and the known
combinations whose partial reset cannot be trusted. :class:`~rlstruct.envs.VectorEnvAdapter`
checks both when it is built; ``rlstruct train --env-backend vector`` in its config check.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from rlstruct.errors import AutoresetModeError, ConfigError

__all__ = ["autoreset_mode", "refuse_stale_autoreset"]


def autoreset_mode(env: gym.vector.VectorEnv) -> AutoresetMode:
    """The auto-reset mode a gymnasium vector env states in ``metadata["autoreset_mode"]``.

    Args:
        env: the vector env.

    Returns:
        The ``AutoresetMode`` (a string value such as ``"SameStep"`` is read as its member).

    Raises:
        AutoresetModeError: the metadata has no ``autoreset_mode``, or not one of gymnasium's.
    """
    metadata = getattr(env, "metadata", None)
    mode = metadata.get("autoreset_mode") if isinstance(metadata, Mapping) else None
    known = ", ".join(f"AutoresetMode.{m.name} ({m.value!r})" for m in AutoresetMode)
    if mode is None:
        raise AutoresetModeError(
            f"{type(env).__name__} has no metadata['autoreset_mode'], so rlstruct cannot tell "
            f"which step ends an episode; expected one of {known} (set it in the env's "
            "metadata)",
            mode=None,
        )
    if isinstance(mode, AutoresetMode):
        return mode
    try:
        return AutoresetMode(mode)
    except ValueError:
        raise AutoresetModeError(
            f"{type(env).__name__} has metadata['autoreset_mode'] = {mode!r}, which rlstruct "
            f"does not know; expected one of {known}",
            mode=mode,
        ) from None


def refuse_stale_autoreset(vec: gym.vector.VectorEnv, mode: AutoresetMode) -> None:
    """gymnasium 1.4's ``AsyncVectorEnv(shared_memory=False)`` in ``NEXT_STEP`` mode keeps an
    env's pending auto-reset through ``reset(options={"reset_mask": ...})`` (its worker clears
    it with shared memory only), so the env would be reset twice and its next action dropped:
    refused here, with the ways out.

    Args:
        vec: the vector env (a ``VectorWrapper`` is looked through).
        mode: its auto-reset mode.

    Raises:
        ConfigError: such an ``AsyncVectorEnv`` in ``NEXT_STEP`` mode.
    """
    base = getattr(vec, "unwrapped", vec)
    if (mode == AutoresetMode.NEXT_STEP and isinstance(base, gym.vector.AsyncVectorEnv)
            and not base.shared_memory):
        raise ConfigError(
            "AsyncVectorEnv(shared_memory=False) in NEXT_STEP mode keeps a pending auto-reset "
            "after gymnasium's partial reset (reset_mask), which would drop an action at each "
            "episode end; build it with shared_memory=True (gymnasium's default) or "
            "autoreset_mode=SAME_STEP"
        )
