"""The wire format of ``RayBatcher``: tensors as CPU numpy arrays, which Ray serialises without a
copy (zero-copy reads from its object store on the same node).

Nothing here imports Ray.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["to_wire", "from_wire", "readonly_ok"]


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
