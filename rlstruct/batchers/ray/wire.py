"""The wire format of ``RayBatcher``: tensors as CPU numpy arrays, which Ray serialises without a
copy (zero-copy reads from its object store on the same node), and how an actor's segment lands
in the driver's buffer (:func:`write_rows`).

Nothing here imports Ray.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from rlstruct.batchers.buffer import SlotBuffer

__all__ = ["to_wire", "from_wire", "readonly_ok", "write_rows"]


def to_wire(t: torch.Tensor) -> Any:
    """A CPU numpy array for Ray's zero-copy serialisation (a CPU tensor for dtypes numpy lacks,
    such as bfloat16)."""
    t = t.detach().cpu()
    try:
        return t.numpy()
    except TypeError:
        return t.clone()


@contextlib.contextmanager
def readonly_ok() -> Iterator[None]:
    """Arrays read from Ray's object store are read-only views; they are only ever copied."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*")
        yield


def from_wire(x: Any) -> torch.Tensor:
    """The tensor view of what :func:`to_wire` sent (call under :func:`readonly_ok`)."""
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def write_rows(buffer: SlotBuffer, rows: slice, value: Mapping[str, Any]) -> None:
    """Copies an actor's answer to ``execute`` (its segment's ``steps``, ``info`` and
    ``lengths`` on the wire, ``t`` steps long) into its ``rows`` of the driver's ``buffer``."""
    t = value["t"]
    with readonly_ok():
        for k, v in value["steps"].items():
            buffer.steps[k][:t, rows].copy_(from_wire(v))
        for k, v in value["info"].items():
            buffer.info[k][rows].copy_(from_wire(v))
        buffer.lengths[rows].copy_(from_wire(value["lengths"]))
