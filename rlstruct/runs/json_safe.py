"""Values in JSON's types: :func:`json_safe`, what ``config.json``, ``summary.json`` and the
checkpoints' ``config`` record (:func:`rlstruct.runs.config.config_to_dict` is its form for a
config).

Example:
    >>> import math, torch
    >>> json_safe({"t": (1, 2), "x": math.inf, "d": torch.device("cpu")})
    {'t': [1, 2], 'x': 'inf', 'd': 'cpu'}
    >>> json_safe(math.nan, nonfinite=None) is None
    True
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["json_safe"]


def json_safe(value: Any, nonfinite: Any = str) -> Any:
    """``value`` in JSON's types.

    Tuples become lists; a dataclass the dict of its fields; paths, devices and dtypes strings;
    enums their value; tensors and numpy values plain numbers or lists; classes and functions
    their dotted name; anything else its ``repr``.

    Args:
        value: any value.
        nonfinite: what a non-finite float becomes: ``nonfinite(value)`` when it is callable
            (the default, ``str``: ``"nan"``, ``"inf"``), else the value itself (``None``).
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return nonfinite(value) if callable(nonfinite) else nonfinite
    if isinstance(value, enum.Enum):
        return json_safe(value.value, nonfinite)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_safe(getattr(value, f.name), nonfinite)
                for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, nonfinite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, nonfinite) for v in value]
    if isinstance(value, (set, frozenset)):
        return [json_safe(v, nonfinite) for v in sorted(value, key=repr)]
    if isinstance(value, torch.Tensor):
        return json_safe(value.detach().cpu().tolist(), nonfinite)
    if isinstance(value, (np.generic, np.ndarray)):
        return json_safe(value.tolist(), nonfinite)
    if isinstance(value, (Path, torch.device, torch.dtype)):
        return str(value)
    if isinstance(value, type) or callable(value):
        module = getattr(value, "__module__", None)
        name = getattr(value, "__qualname__", None)
        if name is not None:
            return f"{module}.{name}" if module else name
    return repr(value)
