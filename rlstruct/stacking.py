"""Concatenating and stacking dicts of batch-first tensors ``{key: (B, *feat)}``: the checked
bodies of :meth:`DictTensor.cat <rlstruct.DictTensor.cat>` and
:meth:`DictTensor.stack <rlstruct.DictTensor.stack>`, whose errors name the item and the key at
fault.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from rlstruct.devices import same_device
from rlstruct.errors import DeviceContractError, KeyMismatchError, ShapeError

__all__ = ["cat_tensors", "stack_tensors"]


def _check_alike(
    items: Sequence[Mapping[str, Tensor]], devices: Sequence[torch.device | None], op: str
) -> None:
    """Same keys as item 0, and (when there is a key) the same device."""
    keys = items[0].keys()
    for i, d in enumerate(items[1:], 1):
        if d.keys() != keys:
            raise KeyMismatchError(
                f"{op}: item {i} has keys {sorted(d)}, expected {sorted(keys)} like item 0"
            )
    if not keys:
        return
    for i, device in enumerate(devices[1:], 1):
        if not same_device(device, devices[0]):
            raise DeviceContractError(
                f"{op}: item {i} is on {device}, expected {devices[0]} like item 0",
                expected=devices[0],
                actual=device,
            )


def cat_tensors(
    items: Sequence[Mapping[str, Tensor]], devices: Sequence[torch.device | None]
) -> dict[str, Tensor]:
    """``{key: torch.cat of that key over items}`` (``{}`` when the items hold no key).

    Args:
        items: the dicts, with the same keys and feature shapes.
        devices: the device of each item (``None`` for an empty one).

    Raises:
        ValueError: ``items`` is empty.
        KeyMismatchError: the key sets differ (the message names the keys).
        DeviceContractError: an item lives on another device than item 0.
        ShapeError: a key's feature shapes differ.
    """
    if not items:
        raise ValueError("DictTensor.cat needs at least one DictTensor")
    _check_alike(items, devices, "DictTensor.cat")
    out = {}
    for k in items[0]:
        try:
            out[k] = torch.cat([d[k] for d in items])
        except RuntimeError as e:
            raise ShapeError(f"DictTensor.cat: cannot concatenate key {k!r}: {e}") from e
    return out


def stack_tensors(
    items: Sequence[Mapping[str, Tensor]], devices: Sequence[torch.device | None], dim: int
) -> dict[str, Tensor]:
    """``{key: torch.stack of that key over items along dim}``.

    Args:
        items: the dicts, with the same keys and shapes.
        devices: the device of each item (``None`` for an empty one).
        dim: 0 (the list becomes the batch) or 1 (a new axis after the batch).

    Raises:
        ValueError: ``items`` is empty or ``dim`` is not 0 or 1.
        KeyMismatchError: the key sets differ.
        DeviceContractError: an item lives on another device than item 0.
        ShapeError: a key's shapes differ.
    """
    if not items:
        raise ValueError("DictTensor.stack needs at least one DictTensor")
    if dim not in (0, 1):
        raise ValueError(f"DictTensor.stack: dim must be 0 or 1, got {dim}")
    _check_alike(items, devices, "DictTensor.stack")
    out = {}
    for k in items[0]:
        try:
            out[k] = torch.stack([d[k] for d in items], dim=dim)
        except RuntimeError as e:
            raise ShapeError(f"DictTensor.stack: cannot stack key {k!r}: {e}") from e
    return out
