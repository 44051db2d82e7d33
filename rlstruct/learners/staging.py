"""Staged batches for a learner group: shards travel in shared memory and reach each rank's
device while the rank still learns on the previous one (RLlib's "tower stacks").

The driver packs a batch (a :class:`~rlstruct.dicttensor.DictTensor` or
:class:`~rlstruct.trajectories.Trajectories`, ``(B, ...)`` / ``(B, T, *feat)``) into a flat
mapping of tensors that all have ``B`` rows (:func:`pack`), splits it by rows into equal shards
(:func:`split_rows`) and writes each shard into a slot of that rank's :class:`StagingRing`: CPU
tensors in shared memory, allocated once from the first shard (one ``copy_`` per key, no
pickling). A rank's :class:`DeviceStager` then copies the slot onto the rank's device in a
loader thread:

- on a CUDA device, through a pinned host buffer and a side stream; the learner's stream waits
  on an event before it reads the shard, so the copy overlaps the previous update;
- on the CPU, a plain copy into rank-local memory (which frees the slot for the batch after the
  next), overlapping the previous update too.

The learner then makes its ``n_epochs`` passes over the staged shard without copying it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from rlstruct.dicttensor import DictTensor
from rlstruct.errors import ShapeError
from rlstruct.parallel.weights import WeightSpecs
from rlstruct.temporal import TemporalDictTensor
from rlstruct.trajectories import Trajectories

__all__ = ["pack", "unpack", "split_rows", "StagingRing", "DeviceStager"]

_INFO, _TRAJ, _LENGTHS = "info/", "traj/", "lengths"


def pack(batch: DictTensor | Trajectories) -> tuple[str, dict[str, Tensor]]:
    """``(kind, tensors)``: the batch as a flat mapping of tensors with ``B`` rows each.

    Raises:
        TypeError: the batch is neither a DictTensor nor Trajectories.
    """
    if isinstance(batch, DictTensor):
        return "dicttensor", dict(batch.items())
    if isinstance(batch, Trajectories):
        out = {_INFO + k: v for k, v in batch.info.items()}
        out.update({_TRAJ + k: v for k, v in batch.trajectories.items()})
        out[_LENGTHS] = batch.lengths
        return f"trajectories:{batch.trajectories.n_timesteps()}", out
    raise TypeError(
        f"a learner group learns on a DictTensor or Trajectories, got {type(batch).__name__}"
    )


def unpack(kind: str, tensors: Mapping[str, Tensor]) -> DictTensor | Trajectories:
    """The inverse of :func:`pack` (the tensors are used as they are, not copied)."""
    if kind == "dicttensor":
        return DictTensor(dict(tensors))
    n_timesteps = int(kind.split(":", 1)[1])
    info = DictTensor({k[len(_INFO):]: v for k, v in tensors.items() if k.startswith(_INFO)})
    steps = {k[len(_TRAJ):]: v for k, v in tensors.items() if k.startswith(_TRAJ)}
    traj = TemporalDictTensor(steps, tensors[_LENGTHS], n_timesteps=n_timesteps)
    return Trajectories(info, traj)


def split_rows(tensors: Mapping[str, Tensor], n_shards: int) -> list[dict[str, Tensor]]:
    """Splits every tensor by rows into ``n_shards`` equal shards (views, no copy).

    Raises:
        ShapeError: the tensors disagree on their number of rows, or it is not a multiple of
            ``n_shards`` (equal shards keep the averaged gradient equal to the full batch's).
    """
    rows = {k: int(v.shape[0]) if v.dim() else -1 for k, v in tensors.items()}
    n = next(iter(rows.values()), 0)
    odd = {k: r for k, r in rows.items() if r != n}
    if odd:
        raise ShapeError(f"the batch's tensors must share their number of rows ({n}); got {odd}")
    if n == 0 or n % n_shards:
        raise ShapeError(
            f"a batch of {n} rows cannot be split into {n_shards} equal shards, one per learner "
            f"rank: make the batch size (e.g. n_processes * n_envs) a multiple of {n_shards}"
        )
    size = n // n_shards
    return [{k: v[i * size:(i + 1) * size] for k, v in tensors.items()} for i in range(n_shards)]


class StagingRing(WeightSpecs):
    """``n_slots`` shared-memory CPU copies of one rank's shard, written by the driver.

    Allocated from the first shard (keys, shapes, dtypes); a later shard must match it
    (:meth:`~rlstruct.parallel.weights.WeightSpecs.check`).

    Args:
        example: the first shard.
        n_slots: how many shards may be in flight to the rank (>= 2 lets the driver write batch
            ``k + 1`` while the rank stages batch ``k``).
    """

    def __init__(self, example: Mapping[str, Tensor], n_slots: int = 2) -> None:
        assert n_slots >= 1, n_slots
        super().__init__(example, "learner group", "the batch shard", "the first batch",
                         " (the staging buffers were allocated from the first batch)")
        self.slots = [
            {k: torch.empty(s, dtype=d).share_memory_() for k, (s, d) in self.specs.items()}
            for _ in range(n_slots)
        ]

    @property
    def n_slots(self) -> int:
        """The number of slots."""
        return len(self.slots)

    def write(self, slot: int, shard: Mapping[str, Tensor]) -> None:
        """Copies ``shard`` (checked, any device) into ``slot``."""
        dst = self.slots[slot]
        keys = list(self.specs)
        torch._foreach_copy_([dst[k] for k in keys], [shard[k] for k in keys])


class DeviceStager:
    """Copies a shared-memory slot onto one device (the rank side of :class:`StagingRing`).

    Args:
        device: the rank's device.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._pinned: list[dict[str, Tensor]] = []
        self._stream: Any = torch.cuda.Stream(device) if self.cuda else None

    def stage(self, slot: int, src: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], Any]:
        """``(tensors, event)``: ``src`` copied onto the device; once this returns, ``src`` may
        be overwritten. ``event`` (None on the CPU) is what the consumer's stream must wait for
        (:meth:`ready`)."""
        if not self.cuda:
            return {k: v.clone() for k, v in src.items()}, None
        while len(self._pinned) <= slot:
            self._pinned.append({})
        pinned = self._pinned[slot]
        if not pinned:  # one pinned buffer per slot, allocated once
            pinned.update({k: torch.empty_like(v).pin_memory() for k, v in src.items()})
        # The previous copy out of this pinned buffer has to be done before it is overwritten.
        self._stream.synchronize()
        torch._foreach_copy_(list(pinned.values()), [src[k] for k in pinned])
        with torch.cuda.stream(self._stream):
            out = {k: v.to(self.device, non_blocking=True) for k, v in pinned.items()}
            event = torch.cuda.Event()
            event.record(self._stream)
        return out, event

    def ready(self, tensors: Mapping[str, Tensor], event: Any) -> None:
        """Makes the current stream wait for a staged copy (a no-op on the CPU)."""
        if event is None:
            return
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(event)
        for v in tensors.values():
            v.record_stream(stream)  # the side stream's allocation is used on this stream
