"""Rows of batch-first tensors ``(B, *feat)``: row indices that keep the batch dimension, and
row-wise choices between two tensors (or two dicts of them) under a ``(B,)`` mask.

:class:`~rlstruct.DictTensor`, :class:`~rlstruct.TemporalDictTensor` and the trajectory
containers select rows through :func:`row_index`; :func:`masked_tensor` is also re-exported by
:mod:`rlstruct.dicttensor` and ``rlstruct``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from rlstruct.errors import KeyMismatchError, ShapeError

__all__ = ["Index", "row_index", "row_mask", "masked_tensor", "masked_tensors"]

#: What ``index`` accepts: an int, a sequence of ints, a LongTensor of rows or a bool mask (B,).
Index = int | Sequence[int] | Tensor


def row_index(idx: Index, n: int, device: torch.device | None) -> Tensor | slice:
    """Normalise a row index so that indexing keeps the batch dimension.

    Args:
        idx: an int (a one-row slice), a slice, a sequence of ints or bools, or a 1-D integer
            or bool tensor.
        n: the number of rows ``B``.
        device: the device of the tensors to index (a tensor index moves there).

    Returns:
        A slice or a 1-D integer or bool tensor.

    Raises:
        IndexError: an int out of range.
        ShapeError: a mask of the wrong length, or an index that is not 1-D integer or bool.
        TypeError: a bool or a uint8 tensor (ambiguous).

    Examples:
        >>> row_index(-1, 3, None)
        slice(2, 3, None)
    """
    if isinstance(idx, bool):
        raise TypeError("index() takes an int, a sequence of ints or a tensor, not a bool")
    if isinstance(idx, int):
        if not -n <= idx < n:
            raise IndexError(f"row {idx} is out of range for a batch of {n} rows")
        idx = idx % n
        return slice(idx, idx + 1)
    if isinstance(idx, slice):
        return idx
    if not isinstance(idx, Tensor):
        # Keep the sequence's own dtype: [True, False] is a mask and [1.5] an error, not rows
        # 1, 0 and 1 as a cast to long would make them; only [] needs a dtype.
        idx = torch.as_tensor(idx)
        if idx.numel() == 0:
            idx = idx.long()
    if idx.dtype == torch.uint8:
        # torch reads a uint8 index as a (deprecated) mask, which would break the batch size.
        raise TypeError(
            "row index has dtype torch.uint8, which is ambiguous; use .bool() for a row mask "
            "or .long() for row numbers"
        )
    if idx.dtype == torch.bool:
        if idx.shape != (n,):
            raise ShapeError(f"boolean row mask has shape {tuple(idx.shape)}, expected ({n},)")
    elif idx.dtype.is_floating_point or idx.dim() != 1:
        raise ShapeError(
            f"row index must be a 1-D integer or bool tensor, got shape {tuple(idx.shape)} "
            f"and dtype {idx.dtype}"
        )
    if device is not None and idx.device != device and idx.device.type != "cpu":
        idx = idx.to(device)
    return idx


def row_mask(mask: Tensor, like: Tensor, name: str) -> Tensor:
    """``mask`` ``(B,)`` as a bool tensor on ``like``'s device that broadcasts over ``like``
    ``(B, *feat)``.

    Raises:
        ShapeError: ``mask`` is not one flag per row of ``like`` (the message starts with
            ``name``).
    """
    if mask.dim() != 1 or mask.shape[0] != like.shape[0]:
        raise ShapeError(
            f"{name}: mask has shape {tuple(mask.shape)}, expected ({like.shape[0]},) "
            "(one flag per row)"
        )
    mask = mask.to(device=like.device, dtype=torch.bool)
    return mask.view((-1,) + (1,) * (like.dim() - 1))


def masked_tensor(t0: Tensor, t1: Tensor, mask: Tensor) -> Tensor:
    """Row-wise choice: row b of the result is ``t1[b]`` where ``mask[b]`` else ``t0[b]``.

    Exact for every dtype (no detour through float) and for tensors of any rank.

    Args:
        t0: tensor ``(B, *feat)`` taken where the mask is false.
        t1: tensor ``(B, *feat)`` taken where the mask is true.
        mask: ``(B,)`` bool (or 0/1) tensor.

    Examples:
        >>> masked_tensor(torch.zeros(3, 2), torch.ones(3, 2), torch.tensor([0, 1, 0]))[:, 0]
        tensor([0., 1., 0.])
    """
    if t0.shape != t1.shape:
        raise ShapeError(f"masked_tensor: shapes differ: {tuple(t0.shape)} vs {tuple(t1.shape)}")
    return torch.where(row_mask(mask, t0, "masked_tensor"), t1, t0)


def masked_tensors(
    d0: Mapping[str, Tensor], d1: Mapping[str, Tensor], mask: Tensor
) -> dict[str, Tensor]:
    """:func:`masked_tensor` key by key over two dicts with the same keys and shapes (the body
    of :func:`~rlstruct.masked_dicttensor`).

    Raises:
        KeyMismatchError: the key sets differ.
        ShapeError: a key's shapes differ, or the mask is not one flag per row.
    """
    if d0.keys() != d1.keys():
        raise KeyMismatchError(f"masked_dicttensor: keys differ: {sorted(d0)} vs {sorted(d1)}")
    out = {}
    for k, v in d0.items():
        w = d1[k]
        if v.shape != w.shape:
            raise ShapeError(
                f"masked_dicttensor: key {k!r} has shapes {tuple(v.shape)} and {tuple(w.shape)}"
            )
        out[k] = torch.where(row_mask(mask, v, f"masked_dicttensor key {k!r}"), w, v)
    return out
