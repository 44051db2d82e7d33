"""The action space of a torch-native env: its tensor description and the checks of ``step``.

:class:`TorchActions` turns a gymnasium ``Discrete`` or ``Box`` space into what the batched
dynamics need (dtype, shape, bounds and default action on the env's device) and checks the
actions of a ``step`` before any env moves: key, row count, device, per-env shape and dtype from
metadata only, then the values against the space with one vectorised reduction (range, and
finiteness for ``Box``). A bad action raises :class:`~rlstruct.errors.ActionError` naming the
first bad env (``exc.env_index``, its local index).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from rlstruct import keys as K
from rlstruct.dicttensor import DictTensor, _same_device
from rlstruct.envs.step_checks import action_rows
from rlstruct.errors import ActionError, ConfigError, DeviceContractError

__all__ = ["TorchActions", "torch_dtype_of"]


def torch_dtype_of(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (or anything ``np.dtype`` takes)."""
    return torch.from_numpy(np.zeros(1, dtype=dtype)).dtype


class TorchActions:
    """The action space of one torch-native env, on its device.

    Args:
        space: a gymnasium ``Discrete`` or ``Box`` space.
        device: the env's device.
        owner: the env's class name (messages).

    Attributes:
        discrete: ``Discrete`` (int64 actions) or ``Box``.
        shape: the shape of one action.
        dtype: the dtype actions are converted to.
        default: the action at reset (0 clipped into the space), on ``device``.

    Raises:
        ConfigError: another kind of space.
    """

    def __init__(self, space: gym.Space, device: torch.device, owner: str) -> None:
        self.space = space
        self._device = device
        if isinstance(space, spaces.Discrete):
            self.discrete = True
            self.shape: tuple[int, ...] = ()
            self.dtype = torch.long
            low, high = int(space.start), int(space.start + space.n - 1)
            default: Any = min(max(0, low), high)
            self._low: Any = low
            self._high: Any = high
        elif isinstance(space, spaces.Box):
            self.discrete = False
            self.shape = tuple(space.shape)
            self.dtype = torch_dtype_of(space.dtype)
            lo = torch.as_tensor(np.asarray(space.low), dtype=self.dtype)
            hi = torch.as_tensor(np.asarray(space.high), dtype=self.dtype)
            default = torch.clamp(torch.zeros(self.shape, dtype=self.dtype), lo, hi)
            self._low = lo.to(device)
            self._high = hi.to(device)
        else:
            raise ConfigError(
                f"{owner}: action space {space!r} is not supported by TorchVecEnv (Discrete or "
                "Box)"
            )
        self._owner = owner
        self.default = torch.as_tensor(default, dtype=self.dtype, device=device)

    def check(self, action: DictTensor, run: Tensor, values: bool, offset: int) -> Tensor:
        """The checked action in the space's dtype (a fresh tensor: never the caller's).

        Args:
            action: the ``step`` argument.
            run: ``(n,)`` the running env indices.
            values: also check the values against the space (``check_actions``).
            offset: the global index of env 0 (messages).

        Raises:
            TypeError, ShapeError: not a DictTensor, or not one row per running env.
            DeviceContractError: the action is on another device than the env.
            ActionError: a wrong per-env shape or dtype, or a value outside the space.
        """
        a = action_rows(action, run.shape[0])
        n = run.shape[0]
        if not _same_device(a.device, self._device):
            raise DeviceContractError(
                f"{self._owner} runs on {self._device}, but the action is on "
                f"{a.device}; give actions on the env's device",
                argument="action",
                key=K.ACTION_KEY,
                expected=self._device,
                actual=a.device,
            )
        if tuple(a.shape[1:]) != self.shape:
            raise ActionError(
                f"action has shape {tuple(a.shape)}, expected {(n, *self.shape)} for the "
                f"action space {self.space!r} (one row per running env)"
            )
        if a.dtype.is_complex or (self.discrete and a.dtype.is_floating_point):
            need = "an integer dtype" if self.discrete else "a real dtype"
            raise ActionError(
                f"action dtype {a.dtype} is not {need}, as {self.space!r} needs"
                + ("; return integer actions (e.g. .long())" if self.discrete else "")
            )
        a = a.detach().to(self.dtype, copy=True)  # validate what the env will get
        if values:
            if self.discrete:
                lo, hi = torch.aminmax(a)
                bad = int(lo) < self._low or int(hi) > self._high
            else:
                bad = not bool(self._in_box(a).all())
            if bad:
                self._error(a, run, offset)
        return a

    def _in_box(self, a: Tensor) -> Tensor:
        """``(n,)`` bool: row inside the Box (finite and within ``[low, high]``)."""
        ok = torch.isfinite(a) & (a >= self._low) & (a <= self._high)
        return ok.reshape(a.shape[0], -1).all(dim=1)

    def _error(self, a: Tensor, run: Tensor, offset: int) -> None:
        if self.discrete:
            ok = (a >= self._low) & (a <= self._high)
        else:
            ok = self._in_box(a)
        row = int((~ok).nonzero()[0, 0])
        k = int(run[row])
        why = " (NaN/Inf or out of [low, high])" if not self.discrete else ""
        err = ActionError(
            f"env {offset + k}: action {a[row].tolist()} is outside the action space "
            f"{self.space!r}{why}"
        )
        err.env_index = k  # type: ignore[attr-defined]
        raise err
