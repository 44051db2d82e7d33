"""Action masks at the env layer: the legal actions of a ``Discrete`` action space, as the
``action_mask`` key of every observation (bool ``(A,)`` per env, True where legal).

A mask reaches the observation by one of two routes:

- an ``action_mask`` leaf of a ``Dict`` observation space (the sb3-contrib layout,
  ``Dict({"observation": Box, "action_mask": MultiBinary(A)})``): it is an observation leaf
  like any other (:mod:`rlstruct.envs.spaces`), stored as the space's dtype;
- gymnasium's ``info["action_mask"]`` (what Gymnasium and PettingZoo envs give, often as
  ``int8``): a ``GymEnv`` / ``GymEnvInf`` records it as the observation key ``action_mask``,
  bool, at reset and at every step. Its ``action_mask`` argument says when: ``None`` (the
  default) detects it at the first reset (env 0's reset ``info`` holds ``action_mask`` and the
  action space is ``Discrete``), ``True`` requires it, ``False`` ignores it.

Either way, an observation an agent acts on (a reset one, or a step's that does not end the
episode) whose mask allows no action raises :class:`~rlstruct.errors.ActionMaskError` naming
the env; a final observation may allow none (a finished game).

Example:
    >>> masks = np.array([[True, False], [False, False]])
    >>> check_masks(masks, np.arange(2), np.array([True, False]), 0, np.zeros(2, np.int64))
    >>> check_masks(masks, np.arange(2), np.array([True, True]), 10, np.array([0, 7]))
    Traceback (most recent call last):
    ...
    rlstruct.errors.ActionMaskError: env 11: the action mask allows no action at env_step 7 ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlstruct import keys as K
from rlstruct.errors import ActionMaskError

__all__ = ["info_mask", "check_masks"]


def _error(message: str, k: int) -> ActionMaskError:
    err = ActionMaskError(message)
    err.env_index = k  # type: ignore[attr-defined]
    return err


def info_mask(info: Mapping[str, Any], n_actions: int, k: int, offset: int) -> np.ndarray:
    """Env ``k``'s ``info["action_mask"]`` as a bool array ``(A,)`` (nonzero: legal).

    Args:
        info: the env's ``info`` of a reset or a step.
        n_actions: ``A``, the ``Discrete`` action space's size.
        k: the env's LOCAL index (``exc.env_index``).
        offset: the global index of env 0 (messages).

    Raises:
        ActionMaskError: ``info`` lacks ``action_mask``, or it is not ``A`` numbers.
    """
    if K.ACTION_MASK not in info:
        raise _error(f"env {offset + k}: info lacks 'action_mask' (an env whose VecEnv records "
                     "its action mask, found at the first reset or asked with action_mask=True, "
                     "gives it at every reset and step)", k)
    try:
        mask = np.asarray(info[K.ACTION_MASK]).astype(bool, copy=False)
    except (TypeError, ValueError):
        mask = None
    if mask is None or mask.shape != (n_actions,):
        raise _error(f"env {offset + k}: info['action_mask'] is {info[K.ACTION_MASK]!r}, "
                     f"expected {n_actions} booleans or 0/1 numbers (one per action)", k)
    return mask


def check_masks(
    masks: np.ndarray, rows: np.ndarray, acting: np.ndarray, offset: int, env_step: np.ndarray,
) -> None:
    """Raises unless every row an agent acts on allows at least one action.

    Args:
        masks: ``(n, A)`` masks (bool or 0/1), row ``j`` of env ``rows[j]``.
        rows: the LOCAL env index of each row.
        acting: bool ``(n,)``: the rows an agent acts on (not a final observation).
        offset: the global index of env 0 (messages).
        env_step: the VecEnv's ``env_step`` per env (indexed by local env index).

    Raises:
        ActionMaskError: naming the first such env (global index) and its env_step.
    """
    empty = ~masks.reshape(masks.shape[0], -1).any(axis=1) & acting
    if empty.any():
        j = int(np.flatnonzero(empty)[0])
        k = int(rows[j])
        raise _error(f"env {offset + k}: the action mask allows no action at env_step "
                     f"{int(env_step[k])} (an observation an agent must act on needs at least "
                     "one legal action)", k)
