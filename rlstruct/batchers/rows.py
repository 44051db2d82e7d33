"""Per-row info (``agent_info``, ``env_info``): an example broadcast to one row per env."""

from __future__ import annotations

import torch

from rlstruct.dicttensor import DictTensor
from rlstruct.errors import ConfigError

__all__ = ["broadcast_rows"]


def broadcast_rows(example: DictTensor | None, n: int, name: str) -> DictTensor:
    """``example`` as ``n`` rows on the CPU: kept if it has ``n`` rows, repeated if it has one.

    Args:
        example: a DictTensor with 1 or ``n`` rows, or None (an empty DictTensor of ``n`` rows).
        n: the number of rows wanted.
        name: the argument's name, for the error message.

    Raises:
        ConfigError: another number of rows.
    """
    if example is None or example.empty():
        return DictTensor(batch_size=n, device="cpu")
    example = example.to("cpu")
    b = example.n_elems()
    if b == n:
        return example.clone()
    if b == 1:
        return example.index(torch.zeros(n, dtype=torch.long))
    raise ConfigError(f"{name} has {b} rows, expected {n} (one per env) or 1 (shared by all)")
