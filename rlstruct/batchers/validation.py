"""Checks run in the calling process before any worker starts: what can be sent to a worker.

A bad configuration costs milliseconds and leaves no process behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cloudpickle
import torch
from torch import nn

from rlstruct.dicttensor import DictTensor

__all__ = ["check_picklable", "find_non_cpu"]


def check_picklable(**objects: Any) -> None:
    """Checks that each named object can be sent to a worker process (with cloudpickle).

    Raises:
        TypeError: naming the first argument that cannot be pickled and why.
    """
    for name, obj in objects.items():
        try:
            cloudpickle.dumps(obj)
        except Exception as e:  # pickling raises many types (TypeError, PicklingError, ...)
            raise TypeError(
                f"{name} cannot be sent to a worker process: {type(e).__name__}: {e}. "
                "Factories and their arguments must be picklable (lambdas and closures are fine; "
                "open files, locks, sockets and CUDA streams are not)"
            ) from e


def find_non_cpu(obj: Any, path: str = "", depth: int = 0) -> list[str]:
    """Paths (like ``agent_args['model']``) of tensors or modules in ``obj`` not on the CPU."""
    if depth > 6:
        return []
    if isinstance(obj, torch.Tensor):
        return [f"{path} on {obj.device}"] if obj.device.type != "cpu" else []
    if isinstance(obj, nn.Module):
        for t in list(obj.parameters()) + list(obj.buffers()):
            if t.device.type != "cpu":
                return [f"{path} (a {type(obj).__name__}) on {t.device}"]
        return []
    if isinstance(obj, DictTensor):
        device = obj.device()
        return [f"{path} on {device}"] if device is not None and device.type != "cpu" else []
    found: list[str] = []
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            found += find_non_cpu(v, f"{path}[{k!r}]", depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            found += find_non_cpu(v, f"{path}[{i}]", depth + 1)
    return found
