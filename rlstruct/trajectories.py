"""``Trajectories``: per-row ``info`` at segment start plus the steps of each row."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rlstruct.dicttensor import DeviceLike, DictTensor, Index, _row_index, _same_device
from rlstruct.errors import DeviceContractError, ShapeError
from rlstruct.temporal import TemporalDictTensor

__all__ = ["Trajectories"]


class Trajectories:
    """A batch of trajectory segments: ``info`` (B, ...) and ``trajectories`` (B, T, ...).

    Row ``b`` of ``info`` describes row ``b`` of ``trajectories`` (agent_info, env_info,
    agent_state at the segment start, env_id; see :mod:`rlstruct.keys`).

    Args:
        info: per-row information, a DictTensor with ``B`` rows (may be empty).
        trajectories: the steps, a TemporalDictTensor with ``B`` rows on the same device.

    Raises:
        ShapeError: the two have different numbers of rows.
        DeviceContractError: they live on different devices.
        TypeError: ``info`` is not a DictTensor or ``trajectories`` not a TemporalDictTensor.
    """

    __slots__ = ("info", "trajectories")

    def __init__(self, info: DictTensor, trajectories: TemporalDictTensor) -> None:
        if not isinstance(info, DictTensor):
            raise TypeError(f"info must be a DictTensor, got {type(info).__name__}")
        if not isinstance(trajectories, TemporalDictTensor):
            raise TypeError(
                f"trajectories must be a TemporalDictTensor, got {type(trajectories).__name__}"
            )
        if not info.empty() and info.n_elems() != trajectories.n_elems():
            raise ShapeError(
                f"info has {info.n_elems()} rows, trajectories has {trajectories.n_elems()}"
            )
        di, dt = info.device(), trajectories.device()
        if not info.empty() and di is not None and dt is not None and not _same_device(di, dt):
            raise DeviceContractError(
                f"info is on {di} but trajectories are on {dt}; move both with .to(device)",
                key="info", expected=dt, actual=di,
            )
        self.info = info
        self.trajectories = trajectories

    def n_elems(self) -> int:
        """``B``, the number of rows."""
        return self.trajectories.n_elems()

    def device(self) -> torch.device | None:
        """The device of the trajectories (and info)."""
        return self.trajectories.device()

    @property
    def lengths(self) -> Tensor:
        """int64 ``(B,)``: valid steps per row."""
        return self.trajectories.lengths

    def to(self, device: DeviceLike, non_blocking: bool = False) -> Trajectories:
        """Both parts on ``device``; ``self`` when already there."""
        info = self.info.to(device, non_blocking=non_blocking)
        traj = self.trajectories.to(device, non_blocking=non_blocking)
        if info is self.info and traj is self.trajectories:
            return self
        return Trajectories(info, traj)

    def index(self, idx: Index) -> Trajectories:
        """Rows selected by ``idx`` in both parts."""
        ridx = _row_index(idx, self.n_elems(), self.device())
        info = self.info if self.info.empty() else self.info.index(ridx)
        return Trajectories(info, self.trajectories.index(ridx))

    def sample(
        self, n: int, generator: torch.Generator | None = None, replace: bool = False
    ) -> Trajectories:
        """``n`` random rows (without replacement unless ``replace``).

        Args:
            n: number of rows to draw.
            generator: a CPU ``torch.Generator`` for reproducible draws.
            replace: draw with replacement (then ``n`` may exceed ``B``).
        """
        b = self.n_elems()
        if n < 0 or (not replace and n > b):
            raise ShapeError(f"cannot sample {n} rows out of {b} without replacement")
        if replace:
            if b == 0 and n > 0:
                raise ShapeError("cannot sample rows from empty Trajectories")
            idx = torch.randint(b, (n,), generator=generator)
        else:
            idx = torch.randperm(b, generator=generator)[:n]
        return self.index(idx.to(self.device() or "cpu"))

    @staticmethod
    def cat(items: Sequence[Trajectories]) -> Trajectories:
        """Concatenates rows (time padded to the longest ``T``)."""
        if not items:
            raise ValueError("Trajectories.cat needs at least one Trajectories")
        infos = [t.info for t in items]
        info = DictTensor.cat(infos) if not all(i.empty() for i in infos) else DictTensor()
        return Trajectories(info, TemporalDictTensor.cat([t.trajectories for t in items]))

    def __repr__(self) -> str:
        return f"Trajectories(\n info={self.info!r},\n trajectories={self.trajectories!r})"
