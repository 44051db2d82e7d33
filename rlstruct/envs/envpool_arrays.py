"""envpool's batched answers as arrays in env order, checked against the observation space:
what :class:`~rlstruct.envs.EnvPoolEnv` reads from each ``reset`` and ``step`` of the pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlstruct.envs.spaces import MISSING, Leaf, leaf_value
from rlstruct.errors import BatcherStateError, ConfigError, KeyMismatchError, ShapeError, SpaceError

__all__: list[str] = []


def take(x: np.ndarray, perm: np.ndarray | None) -> np.ndarray:
    """``x``'s rows in env order (``perm``: see :func:`env_order`; None keeps them)."""
    return x if perm is None else x[perm]


def env_order(info: Mapping[str, Any], ids: np.ndarray, n: int) -> np.ndarray | None:
    """The row permutation that puts envpool's rows in the order of ``ids`` (None: they are
    already; synchronous envpool keeps the order, this is a guard).

    Args:
        info: envpool's ``info`` (its ``env_id`` says which env each row is).
        ids: the env ids asked for, in the order wanted.
        n: the number of envs of the pool.

    Raises:
        BatcherStateError: envpool answered for other envs.
    """
    got = info.get("env_id") if isinstance(info, Mapping) else None
    if got is None:
        return None
    got = np.asarray(got)
    if got.shape == ids.shape and np.array_equal(got, ids):
        return None
    if sorted(got.tolist()) != sorted(ids.tolist()):
        raise BatcherStateError(
            f"envpool answered for envs {got.tolist()}, expected {ids.tolist()}; call "
            "reset() to go on"
        )
    where = np.empty(n, np.int64)
    where[got] = np.arange(got.shape[0])
    return where[ids]

def leaf_arrays(
    obs: Any, leaves: Sequence[Leaf], perm: np.ndarray | None, source: str = "envpool"
) -> list[np.ndarray]:
    """One array per observation leaf of ``leaves``, rows in env order (``perm``: see
    :func:`env_order`), exactly in the leaf's dtype, never sharing memory with the source's
    (envpool's, or a gymnasium vector env's: :mod:`rlstruct.envs.vector`).

    Args:
        obs: the batched observation (an array, or a dict/tuple of arrays).
        leaves: the leaves of the single-env observation space.
        perm: the row permutation (None: rows as they are).
        source: what produced ``obs``, named in the messages.

    Raises:
        KeyMismatchError: ``obs`` lacks a leaf.
        SpaceError: a leaf of another dtype than its space's (no silent cast).
        ShapeError: a leaf of another shape than its space's.
    """
    out = []
    for lf in leaves:
        v = leaf_value(obs, lf)
        if v is MISSING:
            raise KeyMismatchError(
                f"{source}'s observation has no {lf.key!r} (path {list(lf.path)}), which "
                "its observation space promises"
            )
        x = np.asarray(v)
        if lf.scalar_int and x.dtype != lf.dtype and x.dtype.kind in "iu":
            # A Discrete leaf is int64 (as for GymEnv, which takes any Python or numpy
            # int there); envpool gives some as int32 (MiniGrid's direction): exact.
            x = x.astype(lf.dtype)
        if x.dtype != lf.dtype:
            raise SpaceError(
                f"{source} returned {lf.key!r} as {x.dtype}, but its observation space says "
                f"{lf.dtype} (rlstruct never casts silently)"
            )
        if x.shape[1:] != lf.shape:
            raise ShapeError(
                f"{source} returned {lf.key!r} of shape {x.shape}, expected "
                f"(n, *{lf.shape}) from its observation space"
            )
        # One copy (or the permutation's gather): what we return never shares memory with
        # anything envpool may write later, whatever its buffer management.
        out.append(x.copy() if perm is None else x[perm])
    return out

def info_arrays(
    info: Mapping[str, Any], names: Sequence[str], perm: np.ndarray | None, n: int
) -> list[np.ndarray]:
    """One float32 ``(n,)`` array per name of ``names``: envpool's ``info[name]`` in env order
    (``perm``: see :func:`env_order`), zeros where envpool gives none.

    Raises:
        ConfigError: an entry is not a per-env numeric scalar.
    """
    out = []
    for name in names:
        v = info.get(name) if isinstance(info, Mapping) else None
        if v is None:
            out.append(np.zeros(n, np.float32))
            continue
        x = np.asarray(v)
        if x.shape != (n,) or x.dtype.kind not in "biuf":
            raise ConfigError(
                f"envpool's info[{name!r}] has shape {x.shape} and dtype {x.dtype}; "
                "info_keys must name per-env numeric scalars"
            )
        out.append(take(x, perm).astype(np.float32))
    return out
