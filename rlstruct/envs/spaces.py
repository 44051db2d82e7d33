"""Gymnasium spaces <-> tensors: observation keys, observation writes, action checks, options.

Observation spaces (checked once, at construction):

| space                               | keys                    | shape per env   | dtype       |
|-------------------------------------|-------------------------|-----------------|-------------|
| ``Box``                             | ``frame``               | ``space.shape`` | space dtype |
| ``Discrete``                        | ``frame``               | ``()``          | int64       |
| ``MultiDiscrete`` / ``MultiBinary`` | ``frame``               | ``space.shape`` | space dtype |
| ``Dict`` (nested)                   | ``"a"``, ``"a/b"``, ... | leaf's          | leaf's      |
| ``Tuple`` (nested)                  | ``"0"``, ``"1/x"``, ... | leaf's          | leaf's      |

Dtypes are preserved (uint8 stays uint8, float64 stays float64). ``Text``, ``Graph``,
``Sequence``, ``OneOf`` and custom ``Space`` subclasses raise :class:`SpaceError`.

Action spaces: ``Discrete``, ``MultiDiscrete``, ``MultiBinary`` and ``Box``. Actions are checked
for every row at once with numpy (shape, dtype kind, range, finiteness) before any env sees them;
``space.contains`` per env would dominate the step cost.

Default ``last_action`` (what a reset observation carries): zeros of the action dtype, clipped into
the space, i.e. ``0`` for ``Discrete(n)``, ``start`` for ``Discrete(n, start=s)`` with ``s > 0``,
the nearest bound for a ``Box`` that excludes 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from rlstruct import keys as K
from rlstruct.dicttensor import DictTensor
from rlstruct.errors import ActionError, KeyMismatchError, ShapeError, SpaceError

__all__ = [
    "Leaf",
    "ActionSpec",
    "observation_leaves",
    "torch_dtype",
    "write_leaves",
    "exact_leaf",
    "leaf_value",
    "MISSING",
    "check_leaf",
    "env_info_options",
    "short_repr",
]

_LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
_WAY_OUT_OBS = (
    "rlstruct carries Box, Discrete, MultiDiscrete, MultiBinary and (nested) Dict/Tuple of "
    "these; wrap the env with a gymnasium.ObservationWrapper that maps its observations to a "
    "Box or a Dict of Boxes"
)
_WAY_OUT_ACT = (
    "rlstruct steps Discrete, MultiDiscrete, MultiBinary and Box action spaces; wrap the env "
    "with a gymnasium.ActionWrapper that exposes one of these"
)


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype that ``torch.from_numpy`` gives for a numpy ``dtype``.

    Raises:
        SpaceError: torch has no such dtype.
    """
    try:
        return torch.from_numpy(np.zeros(1, dtype=dtype)).dtype
    except TypeError as e:
        raise SpaceError(f"numpy dtype {np.dtype(dtype)} has no torch equivalent: {e}") from e


@dataclass(frozen=True)
class Leaf:
    """One tensor of an observation.

    Attributes:
        key: the observation key (``frame``, ``a/b``, ``0``...).
        path: the keys/indices leading from the gymnasium observation to the leaf value.
        shape: the per-env shape (``()`` for ``Discrete``).
        dtype: the numpy dtype (preserved from the space).
        scalar_int: True for ``Discrete`` leaves, whose values may be Python ints.
        space: the leaf space.
    """

    key: str
    path: tuple[str | int, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    scalar_int: bool
    space: gym.Space = field(repr=False)


def observation_leaves(space: gym.Space) -> list[Leaf]:
    """The leaves of an observation space, in key order.

    Raises:
        SpaceError: the space (or a nested one) is not supported, a Dict key is not a ``str``,
            or a leaf key collides with a key rlstruct adds (``reward``, ``done``, ``info/...``).
    """
    if isinstance(space, _LEAF_SPACES):
        leaves = [_leaf(K.FRAME, (), space)]
    elif isinstance(space, (spaces.Dict, spaces.Tuple)):
        leaves = []
        _collect(space, (), leaves)
    else:
        _unsupported(space, None)
    reserved = set(K.ENV_KEYS)
    for leaf in leaves:
        if leaf.key in reserved or leaf.key.startswith("info/"):
            raise SpaceError(
                f"observation key {leaf.key!r} of {space} collides with a key rlstruct adds "
                f"({sorted(reserved)} and 'info/<k>'); rename it with a gymnasium "
                "ObservationWrapper"
            )
    return leaves


def _collect(space: gym.Space, path: tuple[str | int, ...], out: list[Leaf]) -> None:
    if isinstance(space, spaces.Dict):
        items: list[tuple[str | int, gym.Space]] = list(space.spaces.items())
        for name, _ in items:
            if not isinstance(name, str):
                raise SpaceError(
                    f"Dict observation space has a non-str key {name!r} at "
                    f"{'/'.join(map(str, path)) or 'the top'}; keys must be str"
                )
    elif isinstance(space, spaces.Tuple):
        items = list(enumerate(space.spaces))
    elif isinstance(space, _LEAF_SPACES):
        out.append(_leaf("/".join(map(str, path)), path, space))
        return
    else:
        _unsupported(space, "/".join(map(str, path)))
    for name, sub in items:
        _collect(sub, (*path, name), out)


def _leaf(key: str, path: tuple[str | int, ...], space: gym.Space) -> Leaf:
    if type(space) not in _LEAF_SPACES:  # a subclass may change sample/contains semantics
        _unsupported(space, key)
    dtype = np.dtype(space.dtype)
    torch_dtype(dtype)
    return Leaf(key, path, tuple(space.shape), dtype, isinstance(space, spaces.Discrete), space)


def _unsupported(space: gym.Space, key: str | None) -> None:
    where = f" (at key {key!r})" if key else ""
    raise SpaceError(
        f"observation space {space!r}{where} of type {type(space).__name__} is not supported: "
        f"{_WAY_OUT_OBS}"
    )


class ActionSpec:
    """How the actions of one action space are checked and converted.

    Attributes:
        space: the single-env action space.
        shape: the per-env action shape (``()`` for ``Discrete``).
        dtype: the numpy dtype the env receives (the space's).
        torch_dtype: the matching torch dtype (``last_action``'s).
        default: the ``last_action`` of a reset observation (see module doc).
    """

    def __init__(self, space: gym.Space) -> None:
        if type(space) not in _LEAF_SPACES:
            raise SpaceError(
                f"action space {space!r} of type {type(space).__name__} is not supported: "
                f"{_WAY_OUT_ACT}"
            )
        self.space = space
        self.shape: tuple[int, ...] = tuple(space.shape)
        self.dtype = np.dtype(space.dtype)
        self.torch_dtype = torch_dtype(self.dtype)
        self.is_box = isinstance(space, spaces.Box)
        self.is_float = np.issubdtype(self.dtype, np.floating)
        if isinstance(space, spaces.Discrete):
            low, high = np.int64(space.start), np.int64(space.start + space.n - 1)
        elif isinstance(space, spaces.MultiDiscrete):
            low = np.asarray(space.start, dtype=np.int64)
            high = low + np.asarray(space.nvec, dtype=np.int64) - 1
        elif isinstance(space, spaces.MultiBinary):
            low, high = np.int64(0), np.int64(1)
        else:
            low, high = space.low, space.high
        self.low, self.high = low, high
        if not self.is_float:
            self._shift = bool(np.any(low != 0))
            self._span = (np.asarray(high, np.int64) - low).astype(np.uint64)
        self.default = np.clip(np.zeros(self.shape), low, high).astype(self.dtype)

    def to_numpy(self, action: Tensor, env_ids: np.ndarray, offset: int) -> np.ndarray:
        """Checks ``action`` ``(n, *shape)`` and returns a fresh numpy copy in the space's dtype.

        Args:
            action: one row per running env.
            env_ids: the local index of the env of each row (for messages).
            offset: added to ``env_ids`` to name envs by their global index.

        Raises:
            ActionError: wrong per-env shape, a float action for an integer space, or a row out
                of the space (out of range, NaN or Inf); the message names the first bad env,
                its value and the space, and ``env_index`` holds its local index.
        """
        n = env_ids.shape[0]
        if action.shape[1:] != self.shape:
            raise ActionError(
                f"action has shape {tuple(action.shape)}, expected {(n, *self.shape)} for the "
                f"action space {self.space!r} (one row per running env)"
            )
        a = (action.detach() if action.requires_grad else action).numpy()
        if self.is_float:
            if a.dtype.kind not in "fiub":
                raise ActionError(f"action dtype {action.dtype} is not numeric for {self.space!r}")
            a = a.astype(self.dtype)  # validate what the env will get (a float64 1e39 is inf)
            bad = ~np.isfinite(a) | (a < self.low) | (a > self.high)
        else:
            if a.dtype.kind not in "iub":
                raise ActionError(
                    f"action dtype {action.dtype} is not an integer dtype, as {self.space!r} "
                    "needs; return integer actions (e.g. .long())"
                )
            a = a.astype(np.int64)  # checked wide, so that no value wraps around before the check
            # low <= a <= high as one unsigned comparison: a - low wraps around below low.
            bad = (a - self.low if self._shift else a).view(np.uint64) > self._span
        if np.count_nonzero(bad):
            row = int(np.flatnonzero(bad.reshape(n, -1).any(axis=1))[0])
            why = " (NaN/Inf or out of [low, high])" if self.is_box else ""
            err = ActionError(
                f"env {offset + int(env_ids[row])}: action {a[row].tolist()} is outside the action "
                f"space {self.space!r}{why}"
            )
            err.env_index = int(env_ids[row])  # type: ignore[attr-defined]
            raise err
        # ``astype`` above copied: the env never holds a view of the caller's tensor.
        return a if a.dtype == self.dtype else a.astype(self.dtype)


# ---------------------------------------------------------------------- observations -> arrays
#: What :func:`leaf_value` returns for a leaf the observation lacks.
MISSING = object()


def leaf_value(obs: Any, lf: Leaf) -> Any:
    """The value of leaf ``lf`` in an observation (its ``path`` walked), or :data:`MISSING`."""
    v = obs
    try:
        for p in lf.path:
            v = v[p]
    except (KeyError, IndexError, TypeError):
        return MISSING
    return v


def write_leaves(
    obs: Any, leaves: list[Leaf], arrays: list[np.ndarray], row: int, env: int
) -> None:
    """Writes each leaf of one gymnasium observation into ``arrays[i][row]``.

    Args:
        obs: the observation of one env.
        leaves: the leaves of the observation space.
        arrays: one staging array ``(N, *leaf.shape)`` per leaf.
        row: the row to write.
        env: the env's global index (for messages).

    Raises:
        KeyMismatchError: a Dict/Tuple observation lacks a leaf.
        ShapeError, SpaceError: a leaf value does not match its space (see :func:`check_leaf`).
    """
    for lf, arr in zip(leaves, arrays):
        v = leaf_value(obs, lf)
        if v is MISSING:
            raise KeyMismatchError(
                f"env {env}: its observation has no {lf.key!r} (path {list(lf.path)}), which "
                f"the observation space promises; got {type(obs).__name__} {short_repr(obs)}"
            )
        if v.__class__ is not np.ndarray or v.dtype != lf.dtype or v.shape != lf.shape:
            check_leaf(v, lf, env)
        arr[row] = v


def check_leaf(v: Any, lf: Leaf, env: int) -> None:
    """Accepts what the fast ndarray check of a leaf value missed but is exact; raises otherwise.

    Accepted: a Python or numpy int for a ``Discrete`` leaf, a numpy scalar of the leaf's dtype
    for a 0-d leaf. Anything else that is not an ndarray of the leaf's shape and dtype raises:
    rlstruct never casts an observation silently.

    Raises:
        ShapeError: the shape differs (names env, key, expected, actual).
        SpaceError: the dtype differs.
    """
    if lf.scalar_int:
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            return
        if isinstance(v, np.ndarray) and v.shape == () and v.dtype.kind in "iu":
            return
    elif isinstance(v, np.generic) and v.dtype == lf.dtype and lf.shape == ():
        return
    shape = np.shape(v)
    where = f"env {env}: observation key {lf.key!r}"
    if shape != lf.shape:
        raise ShapeError(
            f"{where} has shape {shape}, expected {lf.shape} from {lf.space!r}; fix the env "
            "or wrap it with a gymnasium ObservationWrapper"
        )
    got = getattr(v, "dtype", type(v).__name__)
    raise SpaceError(
        f"{where} has dtype {got}, expected {lf.dtype} from {lf.space!r} (rlstruct never "
        "casts silently); fix the env or wrap it with gymnasium.wrappers.DtypeObservation"
    )


# ---------------------------------------------------------------------- env_info -> options
def env_info_options(
    env_info: DictTensor | None, n: int, keys: Sequence[str] | None = None
) -> list[dict[str, Any] | None]:
    """The ``options`` of each env's ``reset``: ``{key: row k}`` for env ``k``.

    Rows of 1-D tensors become Python scalars (``.item()``), others numpy arrays (copies).

    Args:
        env_info: ``None`` (every env gets ``options=None``) or a DictTensor ``(n, ...)``.
        n: the number of envs.
        keys: the keys passed (default: all keys of ``env_info``).

    Raises:
        ShapeError: ``env_info`` does not have ``n`` rows.
        KeyMismatchError: ``env_info`` lacks one of ``keys``.
    """
    if env_info is None:
        return [None] * n
    if not isinstance(env_info, DictTensor):
        raise TypeError(f"env_info must be a DictTensor or None, got {type(env_info).__name__}")
    if env_info.n_elems() != n:
        raise ShapeError(f"env_info has {env_info.n_elems()} rows, expected {n} (one per env)")
    names = list(keys) if keys is not None else list(env_info.keys())
    missing = [name for name in names if name not in env_info]
    if missing:
        raise KeyMismatchError(
            f"env_info lacks {missing} named by env_info_keys; it has {sorted(env_info.keys())}"
        )
    columns = {name: env_info[name].detach().cpu().numpy() for name in names}
    return [
        {name: (c[k].item() if c.ndim == 1 else c[k].copy()) for name, c in columns.items()}
        for k in range(n)
    ]


def short_repr(x: object, n: int = 80) -> str:
    """``repr(x)``, cut to ``n`` characters."""
    text = repr(x)
    return text if len(text) <= n else text[: n - 3] + "..."


def exact_leaf(v: Any, lf: Leaf) -> bool:
    """True when ``v`` is an ndarray of exactly the leaf's dtype and shape (it is then written
    as it is, without a look at its values)."""
    return v.__class__ is np.ndarray and v.dtype == lf.dtype and v.shape == lf.shape
