"""``DictTensor``: a batch of named tensors that share their first dimension and their device.

Invariant (checked at construction and on every write):
    every tensor has shape ``(B, *feat)`` with the same ``B``, and every tensor lives on the same
    device. An empty DictTensor (no key) is legal; it may still carry a batch size.

Operations that build a new DictTensor from one already checked (``index``, ``slice``, ``to``, ...)
skip the re-check: the invariant holds by construction, and skipping it keeps them close to the
cost of a plain ``dict`` comprehension.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import torch
from torch import Tensor

from rlstruct.devices import DeviceLike, as_device, same_device
from rlstruct.errors import DeviceContractError, KeyMismatchError, ShapeError
from rlstruct.rows import Index, masked_tensor, masked_tensors, row_index
from rlstruct.stacking import cat_tensors, stack_tensors

# The older private names, which the other containers import from here.
_as_device, _same_device, _row_index = as_device, same_device, row_index

__all__ = ["DictTensor", "masked_tensor", "masked_dicttensor", "Index"]


class _NamedTensors:
    """The read-only mapping protocol of a container of named tensors, over its
    ``{key: tensor}`` dict ``_tensors``: ``keys``, ``values``, ``items``, iteration and ``in``.
    :class:`DictTensor` holds that dict; :class:`~rlstruct.TemporalDictTensor` reads its
    DictTensor's."""

    __slots__ = ()
    _tensors: dict[str, Tensor]

    def keys(self) -> Iterable[str]:
        """The keys, in insertion order."""
        return self._tensors.keys()

    def values(self) -> Iterable[Tensor]:
        """The tensors, in key order."""
        return self._tensors.values()

    def items(self) -> Iterable[tuple[str, Tensor]]:
        """``(key, tensor)`` pairs, in key order."""
        return self._tensors.items()

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __contains__(self, key: object) -> bool:
        return key in self._tensors


class DictTensor(_NamedTensors):
    """A mapping ``str -> Tensor`` whose tensors are batch-first ``(B, *feat)`` on one device.

    Args:
        tensors: the named tensors; each must have the same first dimension ``B`` and live on
            the same device. ``None`` or ``{}`` gives an empty DictTensor.
        batch_size: the expected ``B``. Required to give an empty DictTensor a batch size;
            checked against the tensors otherwise.
        device: the expected device; checked against the tensors when given.

    Raises:
        ShapeError: a tensor is a scalar or its first dimension differs from the others'.
        DeviceContractError: tensors live on different devices (or not on ``device``).
        TypeError: a key is not a ``str`` or a value is not a tensor.

    Examples:
        >>> d = DictTensor({"x": torch.zeros(3, 2), "y": torch.arange(3)})
        >>> d.n_elems(), d.specs()["x"]
        (3, (torch.Size([2]), torch.float32))
        >>> d.index(torch.tensor([2, 0]))["y"]
        tensor([2, 0])
    """

    __slots__ = ("_tensors", "_batch_size", "_device")

    def __init__(
        self,
        tensors: Mapping[str, Tensor] | None = None,
        *,
        batch_size: int | None = None,
        device: DeviceLike | None = None,
    ) -> None:
        self._tensors: dict[str, Tensor] = {}
        self._batch_size: int | None = batch_size
        self._device: torch.device | None = as_device(device)
        if tensors:
            for key, value in tensors.items():
                self.set(key, value)

    @classmethod
    def trusted(
        cls, tensors: dict[str, Tensor], batch_size: int | None, device: torch.device | None
    ) -> DictTensor:
        """A DictTensor over ``tensors`` as they are, without a check or a copy.

        For fast paths that build tensors known to satisfy the invariant (each ``(B, *feat)``
        with ``B == batch_size``, all on ``device``); nothing is checked, so a caller that
        breaks it gets a DictTensor that fails later, far from the cause.

        Args:
            tensors: the ``{key: (B, *feat) tensor}`` dict; it is held, not copied.
            batch_size: ``B`` (None only for an empty DictTensor without one).
            device: the device every tensor lives on (None for an empty DictTensor).

        Returns:
            The DictTensor.
        """
        out = cls.__new__(cls)
        out._tensors = tensors
        out._batch_size = batch_size
        out._device = device
        return out

    @property
    def tensors(self) -> dict[str, Tensor]:
        """The ``{key: (B, *feat) tensor}`` dict itself, not a copy, for read-only fast paths
        (change it through :meth:`set` and :meth:`unset`, which check)."""
        return self._tensors

    # ------------------------------------------------------------------ mapping protocol
    def __getitem__(self, key: str) -> Tensor:
        if not isinstance(key, str):
            raise TypeError(
                f"DictTensor[...] takes a key (str), got {type(key).__name__}; "
                "use .index(idx) or .slice(a, b) to select rows"
            )
        try:
            return self._tensors[key]
        except KeyError:
            raise KeyMismatchError(
                f"no key {key!r} in DictTensor; keys are {sorted(self._tensors)}"
            ) from None

    def __setitem__(self, key: str, value: Tensor) -> None:
        self.set(key, value)

    def __delitem__(self, key: str) -> None:
        self.unset(key)

    # ------------------------------------------------------------------ invariant
    def set(self, key: str, value: Tensor) -> None:
        """Sets (or replaces) ``key`` in place, checking batch size and device.

        Args:
            key: the name.
            value: a tensor ``(B, *feat)`` on this DictTensor's device.

        Raises:
            ShapeError: ``value`` has no batch dimension or another ``B``.
            DeviceContractError: ``value`` lives on another device.
        """
        if not isinstance(key, str):
            raise TypeError(f"DictTensor keys are str, got {type(key).__name__} ({key!r})")
        if not isinstance(value, Tensor):
            raise TypeError(
                f"DictTensor values are torch.Tensor, got {type(value).__name__} for key {key!r}"
            )
        if value.dim() == 0:
            raise ShapeError(
                f"key {key!r}: a scalar tensor has no batch dimension; expected shape (B, ...), "
                "use t.reshape(1) or t.unsqueeze(0)"
            )
        b = value.shape[0]
        if self._batch_size is not None and b != self._batch_size:
            raise ShapeError(
                f"key {key!r} has batch size {b}, expected {self._batch_size} "
                f"(shape {tuple(value.shape)})"
            )
        device = value.device
        if self._device is not None and not same_device(device, self._device):
            raise DeviceContractError(
                f"key {key!r} is on {device}, expected {self._device} like the other tensors",
                key=key,
                expected=self._device,
                actual=device,
            )
        # Only once every check passed: a rejected write leaves the DictTensor as it was.
        self._batch_size = b
        self._device = device
        self._tensors[key] = value

    def unset(self, key: str) -> DictTensor:
        """Removes ``key`` in place and returns ``self``.

        Raises:
            KeyMismatchError: there is no such key.
        """
        if key not in self._tensors:
            raise KeyMismatchError(f"cannot unset {key!r}: keys are {sorted(self._tensors)}")
        del self._tensors[key]
        return self

    def unset_key(self, prefix: str) -> DictTensor:
        """Removes in place every key that starts with ``prefix`` and returns ``self``."""
        for key in [k for k in self._tensors if k.startswith(prefix)]:
            del self._tensors[key]
        return self

    # ------------------------------------------------------------------ description
    def n_elems(self) -> int:
        """The batch size ``B`` (0 for an empty DictTensor without a batch size)."""
        return self._batch_size or 0

    @property
    def batch_size(self) -> int | None:
        """``B``, or ``None`` for an empty DictTensor created without one."""
        return self._batch_size

    def device(self) -> torch.device | None:
        """The device of the tensors (``None`` for an empty DictTensor without a device)."""
        return self._device

    def empty(self) -> bool:
        """True when the DictTensor holds no key."""
        return not self._tensors

    def specs(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        """``{key: (shape_without_B, dtype)}``: what a buffer for these tensors needs."""
        return {k: (v.shape[1:], v.dtype) for k, v in self._tensors.items()}

    def __repr__(self) -> str:
        # Shapes and dtypes only: printing never reads values, so never syncs a GPU.
        lines = [f"DictTensor(B={self._batch_size}, device={self._device}"]
        for k, v in self._tensors.items():
            lines.append(f"  {k}: {tuple(v.shape)} {str(v.dtype).replace('torch.', '')}")
        return "\n".join(lines) + ")" if len(lines) > 1 else lines[0] + ", empty)"

    # ------------------------------------------------------------------ new DictTensors
    def map_tensors(self, fn: Callable[[Tensor], Tensor], batch_size: int | None) -> DictTensor:
        """A DictTensor of ``fn`` applied to each tensor, trusted (no check) to have batch size
        ``batch_size`` and to stay on this device; :meth:`apply` is the checked form.

        Args:
            fn: maps a ``(B, *feat)`` tensor to a ``(batch_size, *feat')`` one on the same
                device.
            batch_size: the batch size of the results.

        Returns:
            The new DictTensor (see :meth:`trusted`).
        """
        return DictTensor.trusted(
            {k: fn(v) for k, v in self._tensors.items()}, batch_size, self._device
        )

    def get(self, keys: str | Iterable[str], clone: bool = False) -> DictTensor:
        """A DictTensor with only ``keys`` (sharing memory unless ``clone``).

        Raises:
            KeyMismatchError: a key is missing.
        """
        if isinstance(keys, str):
            keys = [keys]
        out = {}
        for k in keys:
            if k not in self._tensors:
                raise KeyMismatchError(
                    f"no key {k!r} in DictTensor; keys are {sorted(self._tensors)}"
                )
            out[k] = self._tensors[k].clone() if clone else self._tensors[k]
        return DictTensor.trusted(out, self._batch_size, self._device)

    def clone(self) -> DictTensor:
        """A deep copy (new storage for every tensor)."""
        return self.map_tensors(Tensor.clone, self._batch_size)

    def detach(self) -> DictTensor:
        """The same tensors, detached from the autograd graph."""
        return self.map_tensors(Tensor.detach, self._batch_size)

    def apply(self, fn: Callable[[Tensor], Tensor]) -> DictTensor:
        """``fn`` applied to every tensor; the result is checked like a new DictTensor.

        Examples:
            >>> DictTensor({"x": torch.ones(2, 3)}).apply(lambda t: t * 2)["x"].sum().item()
            12.0
        """
        if not self._tensors:
            return DictTensor.trusted({}, self._batch_size, self._device)
        return DictTensor({k: fn(v) for k, v in self._tensors.items()})

    def to(self, device: DeviceLike, non_blocking: bool = False) -> DictTensor:
        """The DictTensor on ``device``; ``self`` when it is already there.

        Args:
            device: the target device.
            non_blocking: forwarded to ``Tensor.to`` (asynchronous copies from pinned memory).
        """
        device = as_device(device)
        if self._device is None or same_device(self._device, device):
            if self._device is None and not self._tensors:
                return DictTensor.trusted({}, self._batch_size, device)
            return self
        out = self.map_tensors(lambda t: t.to(device, non_blocking=non_blocking), self._batch_size)
        if self._tensors:
            out._device = next(iter(out._tensors.values())).device
        else:
            out._device = device
        return out

    def pin_memory(self) -> DictTensor:
        """Copies into page-locked memory (for fast, asynchronous host-to-GPU copies)."""
        return self.map_tensors(Tensor.pin_memory, self._batch_size)

    def share_memory_(self) -> DictTensor:
        """Moves every tensor to shared memory in place (for worker processes); returns self."""
        for v in self._tensors.values():
            v.share_memory_()
        return self

    def slice(self, a: int, b: int | None = None) -> DictTensor:
        """Rows ``a`` to ``b`` (excluded); ``slice(a)`` is row ``a`` with its batch dim kept.

        Unlike rlstructures, ``slice(a)`` keeps the batch dimension (B=1), so the result is still
        a valid DictTensor.
        """
        n = self.n_elems()
        if b is None:
            if not -n <= a < n:
                raise IndexError(f"row {a} is out of range for a batch of {n} rows")
            a = a % n
            b = a + 1
        start, stop, _ = slice(a, b).indices(n)
        size = max(0, stop - start)
        return self.map_tensors(lambda t: t[start:stop], size)

    def index(self, idx: Index) -> DictTensor:
        """Rows selected by ``idx`` (LongTensor, list of ints, int, or bool mask of shape (B,)).

        The batch dimension is always kept: an int gives B=1. A list of bools is a mask.

        Raises:
            IndexError: an int row out of range, or rows asked of an empty batch.
            ShapeError: a mask of the wrong length, or an index that is not 1-D integer or bool.
            TypeError: a bool or a uint8 tensor (ambiguous: use ``.bool()`` or ``.long()``).
        """
        n = self.n_elems()
        ridx = row_index(idx, n, self._device)
        if isinstance(ridx, slice):
            start, stop, step = ridx.indices(n)
            size = len(range(start, stop, step))
        elif ridx.dtype == torch.bool:
            if not self._tensors:
                return DictTensor.trusted({}, int(ridx.sum()), self._device)
            out = self.map_tensors(lambda t: t[ridx], None)
            out._batch_size = next(iter(out._tensors.values())).shape[0]
            return out
        else:
            size = ridx.shape[0]
            if n == 0 and size > 0:
                raise IndexError(f"cannot index {size} rows of an empty batch")
        return self.map_tensors(lambda t: t[ridx], size)

    def unfold(self) -> list[DictTensor]:
        """One DictTensor per row (each with B=1)."""
        return [self.slice(i) for i in range(self.n_elems())]

    def prepend_key(self, prefix: str) -> DictTensor:
        """A DictTensor whose keys are ``prefix + key`` (same tensors)."""
        return DictTensor.trusted(
            {prefix + k: v for k, v in self._tensors.items()}, self._batch_size, self._device
        )

    def truncate_key(self, prefix: str) -> DictTensor:
        """The keys that start with ``prefix``, with the prefix removed (same tensors).

        Examples:
            >>> d = DictTensor({"obs/x": torch.zeros(2), "act": torch.zeros(2)})
            >>> list(d.truncate_key("obs/").keys())
            ['x']
        """
        n = len(prefix)
        return DictTensor.trusted(
            {k[n:]: v for k, v in self._tensors.items() if k.startswith(prefix)},
            self._batch_size,
            self._device,
        )

    def __add__(self, other: DictTensor) -> DictTensor:
        """Merges two DictTensors with disjoint keys, the same B and the same device."""
        if not isinstance(other, DictTensor):
            return NotImplemented
        common = self._tensors.keys() & other._tensors.keys()
        if common:
            raise KeyMismatchError(f"cannot add DictTensors that share keys {sorted(common)}")
        out = DictTensor(self._tensors, batch_size=self._batch_size, device=self._device)
        if (
            other._batch_size is not None
            and out._batch_size is not None
            and other._batch_size != out._batch_size
        ):
            raise ShapeError(
                f"cannot add DictTensors of batch sizes {out._batch_size} and {other._batch_size}"
            )
        for k, v in other._tensors.items():
            out.set(k, v)
        if out._batch_size is None:
            out._batch_size = other._batch_size
        return out

    def copy_(self, src: DictTensor, src_idx: Index, dst_idx: Index) -> None:
        """In place: ``self[k][dst_idx] = src[k][src_idx]`` for every key of ``self``.

        Raises:
            KeyMismatchError: ``src`` lacks a key of ``self``.
        """
        missing = self._tensors.keys() - src._tensors.keys()
        if missing:
            raise KeyMismatchError(f"copy_: source lacks keys {sorted(missing)}")
        s = row_index(src_idx, src.n_elems(), src._device)
        d = row_index(dst_idx, self.n_elems(), self._device)
        for k, v in self._tensors.items():
            v[d] = src._tensors[k][s]

    def equal(self, other: DictTensor, rtol: float = 0.0, atol: float = 0.0) -> bool:
        """True when both hold the same keys, dtypes, shapes and (close) values.

        With the default tolerances the comparison is exact (NaNs compare equal).
        """
        if not isinstance(other, DictTensor) or self._tensors.keys() != other._tensors.keys():
            return False
        if self.n_elems() != other.n_elems():
            return False
        for k, v in self._tensors.items():
            w = other._tensors[k]
            if v.dtype != w.dtype or v.shape != w.shape:
                return False
            if w.device != v.device:
                w = w.to(v.device)
            if v.dtype.is_floating_point or v.dtype.is_complex:
                if not torch.allclose(v, w, rtol=rtol, atol=atol, equal_nan=True):
                    return False
            elif not torch.equal(v, w):
                return False
        return True

    # ------------------------------------------------------------------ several DictTensors
    @staticmethod
    def cat(dts: Sequence[DictTensor]) -> DictTensor:
        """Concatenates along the batch dimension; all must share keys, feature shapes, device.

        Raises:
            ValueError: ``dts`` is empty.
            KeyMismatchError: the key sets differ (the message names the keys).
        """
        out = cat_tensors([d._tensors for d in dts], [d._device for d in dts])
        if not out:
            return DictTensor.trusted({}, sum(d.n_elems() for d in dts), dts[0]._device)
        # The invariant holds by construction: one device (checked), and torch.cat gave every
        # key the same number of rows; re-checking each key would cost ~1 µs per key.
        return DictTensor.trusted(out, next(iter(out.values())).shape[0], dts[0]._device)

    @staticmethod
    def stack(dts: Sequence[DictTensor], dim: int = 0) -> DictTensor:
        """Stacks along a new dimension ``dim`` (0: the list becomes the batch; 1: a new axis
        after the batch, e.g. steps into ``(B, T, *feat)``).

        Raises:
            ValueError: ``dts`` is empty or ``dim`` is not 0 or 1.
            KeyMismatchError: the key sets differ.
        """
        out = stack_tensors([d._tensors for d in dts], [d._device for d in dts], dim)
        b = len(dts) if dim == 0 else dts[0]._batch_size
        return DictTensor(out, batch_size=b)


def masked_dicttensor(d0: DictTensor, d1: DictTensor, mask: Tensor) -> DictTensor:
    """Row-wise choice between two DictTensors with the same keys (see :func:`masked_tensor`)."""
    out = masked_tensors(d0._tensors, d1._tensors, mask)
    return DictTensor.trusted(out, d0._batch_size, d0._device)
