"""``TemporalDictTensor``: named ``(B, T, *feat)`` tensors plus per-row ``lengths``.

Invariant (checked at construction and on every write):
    every tensor has shape ``(B, T, *feat)`` with the same ``B`` and ``T`` on one device;
    ``lengths`` is an int64 tensor ``(B,)`` on that device with ``0 <= lengths[b] <= T``.
    Entries at ``t >= lengths[b]`` are padding: ``mask()`` tells the valid steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from rlstruct.dicttensor import (
    DeviceLike,
    DictTensor,
    Index,
    _as_device,
    _NamedTensors,
    _row_index,
    _same_device,
)
from rlstruct.errors import DeviceContractError, KeyMismatchError, ShapeError

__all__ = ["TemporalDictTensor"]


class TemporalDictTensor(_NamedTensors):
    """Batch-first, time-second named tensors with a valid length per row.

    Args:
        tensors: ``{key: (B, T, *feat)}`` tensors, or a DictTensor of such tensors.
        lengths: int tensor ``(B,)`` with ``0 <= lengths[b] <= T`` on the tensors' device;
            ``None`` means every row is full (``lengths = T``).
        n_timesteps: ``T``; required only for a TDT without keys.

    Raises:
        ShapeError: a tensor has another ``B`` or ``T``, ``lengths`` has the wrong shape, dtype
            or values out of ``[0, T]``.
        DeviceContractError: tensors or ``lengths`` on different devices.

    Examples:
        >>> tdt = TemporalDictTensor({"r": torch.ones(2, 3)}, torch.tensor([3, 1]))
        >>> tdt.mask()
        tensor([[ True,  True,  True],
                [ True, False, False]])
        >>> tdt.to_transitions()["r"].shape
        torch.Size([4])
    """

    __slots__ = ("_dt", "_lengths", "_T")

    def __init__(
        self,
        tensors: Mapping[str, Tensor] | DictTensor | None = None,
        lengths: Tensor | None = None,
        *,
        n_timesteps: int | None = None,
    ) -> None:
        tensors = dict(tensors.items()) if tensors is not None else {}
        if lengths is not None and not isinstance(lengths, Tensor):
            raise TypeError(f"lengths must be a tensor, got {type(lengths).__name__}")
        self._T: int | None = n_timesteps
        # The tensors set B and the device; lengths is then checked against them, so that an
        # error blames lengths when lengths is the odd one out. Without tensors, lengths sets them.
        batch_size = device = None
        if lengths is not None and not tensors:
            batch_size = lengths.shape[0] if lengths.dim() else None
            device = lengths.device
        self._dt = DictTensor(batch_size=batch_size, device=device)
        for k, v in tensors.items():
            self.set(k, v)
        if self._T is None:
            if lengths is None:
                raise ShapeError("an empty TemporalDictTensor needs lengths or n_timesteps")
            self._T = int(lengths.max()) if lengths.numel() else 0
        if lengths is None:
            lengths = torch.full((self._dt.n_elems(),), self._T, dtype=torch.long,
                                 device=self._dt.device())
        self._lengths = self._check_lengths(lengths)

    def _check_lengths(self, lengths: Tensor) -> Tensor:
        if not isinstance(lengths, Tensor):
            raise TypeError(f"lengths must be a tensor, got {type(lengths).__name__}")
        if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise ShapeError(f"lengths must be an integer tensor, got {lengths.dtype}")
        b = self._dt.n_elems()
        if lengths.shape != (b,):
            raise ShapeError(f"lengths has shape {tuple(lengths.shape)}, expected ({b},)")
        device = self._dt.device()
        if device is not None and not _same_device(lengths.device, device):
            raise DeviceContractError(
                f"lengths is on {lengths.device}, expected {device} like the tensors",
                key="lengths", expected=device, actual=lengths.device,
            )
        lengths = lengths.long()
        if b and lengths.device.type != "meta":
            lo, hi = int(lengths.min()), int(lengths.max())
            if lo < 0 or hi > self._T:
                raise ShapeError(
                    f"lengths must lie in [0, T={self._T}], got values in [{lo}, {hi}]"
                )
        return lengths

    @classmethod
    def trusted(cls, dt: DictTensor, lengths: Tensor, n_timesteps: int) -> TemporalDictTensor:
        """A TemporalDictTensor over ``dt`` as it is, without a check or a copy (for fast paths
        whose tensors are known to be ``(B, T, *feat)``; see :meth:`DictTensor.trusted`).

        Args:
            dt: the DictTensor of ``(B, T, *feat)`` tensors, with ``T == n_timesteps``.
            lengths: ``(B,)`` int64 lengths in ``[0, T]``, on ``dt``'s device.
            n_timesteps: ``T``.

        Returns:
            The TemporalDictTensor.
        """
        out = cls.__new__(cls)
        out._dt, out._lengths, out._T = dt, lengths, n_timesteps
        return out

    # ------------------------------------------------------------------ mapping protocol
    # keys, values, items, iteration and ``in`` are _NamedTensors', over this dict.
    @property
    def _tensors(self) -> dict[str, Tensor]:
        """The ``{key: (B, T, *feat) tensor}`` dict of the underlying DictTensor."""
        return self._dt._tensors

    def __getitem__(self, key: str) -> Tensor:
        return self._dt[key]

    def __setitem__(self, key: str, value: Tensor) -> None:
        self.set(key, value)

    def set(self, key: str, value: Tensor) -> None:
        """Sets ``key`` in place to a ``(B, T, *feat)`` tensor (checked)."""
        if isinstance(value, Tensor) and value.dim() < 2:
            raise ShapeError(
                f"key {key!r} has shape {tuple(value.shape)}, expected (B, T, ...) with T={self._T}"
            )
        if isinstance(value, Tensor) and self._T is not None and value.shape[1] != self._T:
            raise ShapeError(
                f"key {key!r} has {value.shape[1]} time steps, expected T={self._T} "
                f"(shape {tuple(value.shape)})"
            )
        self._dt.set(key, value)
        if self._T is None:
            self._T = value.shape[1]

    def unset(self, key: str) -> TemporalDictTensor:
        """Removes ``key`` in place; returns self."""
        self._dt.unset(key)
        return self

    # ------------------------------------------------------------------ description
    @property
    def lengths(self) -> Tensor:
        """int64 ``(B,)``: the number of valid steps of each row."""
        return self._lengths

    def n_elems(self) -> int:
        """``B``."""
        return self._dt.n_elems()

    def n_timesteps(self) -> int:
        """``T``."""
        return self._T

    def device(self) -> torch.device | None:
        """The device of tensors and lengths."""
        return self._dt.device()

    def specs(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """``{key: (shape_without_B_and_T, dtype)}``."""
        return {k: (v.shape[2:], v.dtype) for k, v in self._dt.items()}

    def full(self) -> bool:
        """True when every row has ``T`` valid steps."""
        return bool((self._lengths == self._T).all())

    def mask(self) -> Tensor:
        """``(B, T)`` bool, true on valid steps, on the tensors' device."""
        steps = torch.arange(self._T, device=self._lengths.device)
        return steps.unsqueeze(0) < self._lengths.unsqueeze(1)

    def __repr__(self) -> str:
        lines = [f"TemporalDictTensor(B={self.n_elems()}, T={self._T}, device={self.device()}"]
        for k, v in self._dt.items():
            lines.append(f"  {k}: {tuple(v.shape)} {str(v.dtype).replace('torch.', '')}")
        return "\n".join(lines) + ")"

    # ------------------------------------------------------------------ rows
    def get(self, keys: str | Iterable[str], clone: bool = False) -> TemporalDictTensor:
        """The TDT restricted to ``keys`` (same lengths)."""
        lengths = self._lengths.clone() if clone else self._lengths
        return TemporalDictTensor.trusted(self._dt.get(keys, clone), lengths, self._T)

    def clone(self) -> TemporalDictTensor:
        """A deep copy."""
        return TemporalDictTensor.trusted(self._dt.clone(), self._lengths.clone(), self._T)

    def slice(self, a: int, b: int | None = None) -> TemporalDictTensor:
        """Rows ``a`` to ``b`` (excluded); ``slice(a)`` keeps row ``a`` as B=1."""
        dt = self._dt.slice(a, b)
        n = self.n_elems()
        if b is None:
            a = a % n
            b = a + 1
        start, stop, _ = slice(a, b).indices(n)
        return TemporalDictTensor.trusted(dt, self._lengths[start:stop], self._T)

    def index(self, idx: Index) -> TemporalDictTensor:
        """Rows selected by ``idx`` (LongTensor, ints or bool mask (B,)), lengths included."""
        ridx = _row_index(idx, self.n_elems(), self.device())
        dt = self._dt.index(ridx)
        return TemporalDictTensor.trusted(dt, self._lengths[ridx], self._T)

    def unfold(self) -> list[TemporalDictTensor]:
        """One TDT per row, each shortened to its own length."""
        return [self.slice(i).shorten() for i in range(self.n_elems())]

    def expand(self, new_b: int) -> TemporalDictTensor:
        """Pads with empty rows (length 0, zeros of each tensor's dtype) up to ``new_b`` rows."""
        b = self.n_elems()
        if new_b < b:
            raise ShapeError(f"expand: new batch size {new_b} is smaller than the current {b}")
        if new_b == b:
            return self
        pad = {k: v.new_zeros((new_b - b,) + tuple(v.shape[1:])) for k, v in self._dt.items()}
        dt = DictTensor.trusted(
            {k: torch.cat([v, pad[k]]) for k, v in self._dt.items()}, new_b, self.device()
        )
        lengths = torch.cat([self._lengths, self._lengths.new_zeros(new_b - b)])
        return TemporalDictTensor.trusted(dt, lengths, self._T)

    # ------------------------------------------------------------------ time
    def shorten(self) -> TemporalDictTensor:
        """Drops trailing padding: ``T`` becomes ``max(lengths)``; ``self`` if nothing to drop."""
        t = int(self._lengths.max()) if self.n_elems() else 0
        if t == self._T:
            return self
        return self.temporal_slice(0, t)

    def temporal_slice(self, a: int, b: int) -> TemporalDictTensor:
        """Steps ``a`` to ``b`` (excluded) of every row.

        Lengths become ``clamp(lengths - a, 0, b - a)``.
        """
        if not 0 <= a <= b <= self._T:
            raise IndexError(f"temporal_slice({a}, {b}) needs 0 <= a <= b <= T={self._T}")
        dt = self._dt.map_tensors(lambda t: t[:, a:b], self.n_elems())
        lengths = (self._lengths - a).clamp(0, b - a)
        return TemporalDictTensor.trusted(dt, lengths, b - a)

    def _check_t(self, t: int) -> int:
        if not -self._T <= t < self._T:
            raise IndexError(f"time index {t} is out of range for T={self._T}")
        return t % self._T

    def temporal_index(self, t: int) -> DictTensor:
        """Step ``t`` of every row as a DictTensor ``(B, *feat)`` (padding rows included)."""
        t = self._check_t(t)
        return self._dt.map_tensors(lambda v: v[:, t], self.n_elems())

    def masked_temporal_index(self, t: int) -> tuple[DictTensor, Tensor]:
        """Step ``t`` of every row and a ``(B,)`` bool mask (on the tensors' device) of the rows
        for which step ``t`` is valid."""
        return self.temporal_index(t), self._lengths > self._check_t(t)

    def temporal_multi_index(self, t: Tensor) -> DictTensor:
        """Row ``b`` at its own step ``t[b]``: a DictTensor ``(B, *feat)``."""
        b = self.n_elems()
        t = torch.as_tensor(t, dtype=torch.long, device=self._lengths.device)
        if t.shape != (b,):
            raise ShapeError(f"temporal_multi_index: t has shape {tuple(t.shape)}, expected ({b},)")
        if b and ((t < 0).any() or (t >= self._T).any()):
            raise IndexError(f"temporal_multi_index: steps must lie in [0, {self._T})")
        rows = torch.arange(b, device=t.device)
        return self._dt.map_tensors(lambda v: v[rows, t], b)

    def last(self) -> DictTensor:
        """Each row's last valid step (``lengths[b] - 1``) as a DictTensor ``(B, *feat)``.

        Raises:
            ShapeError: a row has no valid step.
        """
        if self.n_elems() and bool((self._lengths == 0).any()):
            empty = torch.nonzero(self._lengths == 0).flatten().tolist()
            raise ShapeError(f"last(): rows {empty} have length 0 and no last step")
        return self.temporal_multi_index(self._lengths - 1)

    def to_transitions(self) -> DictTensor:
        """The valid steps only, flattened row by row: a DictTensor of ``sum(lengths)`` rows."""
        b, t = self.n_elems(), self._T
        if self.full():
            return self._dt.map_tensors(lambda v: v.reshape((b * t,) + tuple(v.shape[2:])), b * t)
        flat = torch.nonzero(self.mask().reshape(-1)).squeeze(1)
        n = flat.shape[0]
        return self._dt.map_tensors(lambda v: v.reshape((b * t,) + tuple(v.shape[2:]))[flat], n)

    # ------------------------------------------------------------------ whole
    def apply(self, fn: Callable[[Tensor], Tensor]) -> TemporalDictTensor:
        """``fn`` applied to every tensor (lengths unchanged); the result is checked."""
        return TemporalDictTensor({k: fn(v) for k, v in self._dt.items()}, self._lengths,
                                  n_timesteps=self._T)

    def detach(self) -> TemporalDictTensor:
        """The tensors detached from the autograd graph."""
        return TemporalDictTensor.trusted(self._dt.detach(), self._lengths, self._T)

    def pin_memory(self) -> TemporalDictTensor:
        """Page-locked copies (tensors and lengths)."""
        return TemporalDictTensor.trusted(
            self._dt.pin_memory(), self._lengths.pin_memory(), self._T
        )

    def to(self, device: DeviceLike, non_blocking: bool = False) -> TemporalDictTensor:
        """The TDT on ``device`` (lengths too); ``self`` when already there."""
        device = _as_device(device)
        dt = self._dt.to(device, non_blocking=non_blocking)
        if dt is self._dt and _same_device(self._lengths.device, device):
            return self
        return TemporalDictTensor.trusted(
            dt, self._lengths.to(device, non_blocking=non_blocking), self._T
        )

    def copy_(self, src: TemporalDictTensor, src_idx: Index, dst_idx: Index) -> None:
        """In place: rows ``src_idx`` of ``src`` (tensors and lengths) into rows ``dst_idx``.

        ``src`` may be shorter in time than ``self``; its steps go to ``[0, src.T)``.
        """
        if src._T > self._T:
            raise ShapeError(f"copy_: source has T={src._T}, longer than the target's T={self._T}")
        missing = self._dt.keys() - src._dt.keys()
        if missing:
            raise KeyMismatchError(f"copy_: source lacks keys {sorted(missing)}")
        s = _row_index(src_idx, src.n_elems(), src.device())
        d = _row_index(dst_idx, self.n_elems(), self.device())
        ts = src._T
        for k, v in self._dt.items():
            v[d, :ts] = src._dt[k][s]
        self._lengths[d] = src._lengths[s]

    def equal(self, other: TemporalDictTensor, rtol: float = 0.0, atol: float = 0.0) -> bool:
        """True when keys, lengths and the valid steps agree (padding is ignored)."""
        if not isinstance(other, TemporalDictTensor) or self.keys() != other.keys():
            return False
        if self.n_elems() != other.n_elems() or not torch.equal(
            self._lengths.cpu(), other._lengths.cpu()
        ):
            return False
        a, b = self.shorten(), other.shorten()
        if a._T != b._T:
            return False
        return a.to_transitions().equal(b.to_transitions(), rtol=rtol, atol=atol)

    @staticmethod
    def cat(tdts: Sequence[TemporalDictTensor]) -> TemporalDictTensor:
        """Concatenates rows; shorter ones are padded in time with zeros of their own dtype, on
        their own device, up to the longest ``T``."""
        if not tdts:
            raise ValueError("TemporalDictTensor.cat needs at least one TemporalDictTensor")
        keys = tdts[0].keys()
        for i, d in enumerate(tdts[1:], 1):
            if d.keys() != keys:
                raise KeyMismatchError(
                    f"TemporalDictTensor.cat: item {i} has keys {sorted(d.keys())}, "
                    f"expected {sorted(keys)} like item 0"
                )
        t_max = max(d._T for d in tdts)
        padded = []
        for d in tdts:
            if d._T < t_max:
                pad = d._T
                d = TemporalDictTensor.trusted(
                    d._dt.map_tensors(
                        lambda v, pad=pad: torch.cat(
                            [v, v.new_zeros((v.shape[0], t_max - pad) + tuple(v.shape[2:]))], 1
                        ),
                        d.n_elems(),
                    ),
                    d._lengths,
                    t_max,
                )
            padded.append(d)
        dt = DictTensor.cat([d._dt for d in padded])
        lengths = torch.cat([d._lengths for d in padded])
        if dt.empty():
            return TemporalDictTensor(lengths=lengths, n_timesteps=t_max)
        return TemporalDictTensor.trusted(dt, lengths, t_max)
