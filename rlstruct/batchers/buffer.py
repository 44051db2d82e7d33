"""The slot buffer: every tensor a batcher writes, allocated once from specs, written by index.

Layout: one row per env (``R`` rows = all envs of all workers), ``T`` steps.

- ``steps[key]``: ``(R, T, *feat)`` for the keys ``observation/*``, ``action/*``,
  ``_observation/*``;
- ``info[key]``: ``(R, *feat)`` for ``agent_info/*``, ``env_info/*``, ``agent_state/*``,
  ``env_id`` and ``policy_version``, written at segment start;
- ``lengths``: ``(R,)`` int64, the valid steps of each row in the current segment.

Writers check keys, shapes and dtypes against the specs (a wrong dtype is an error, never a
silent cast). Readers get copies: the batch handed to the learner never aliases the buffer the
workers are writing into.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from rlstruct.dicttensor import DictTensor
from rlstruct.errors import KeyMismatchError, ShapeError
from rlstruct.temporal import TemporalDictTensor
from rlstruct.trajectories import Trajectories

__all__ = ["SlotBuffer", "Specs"]

#: ``{key: (shape without batch (and time), dtype)}``
Specs = Mapping[str, tuple[torch.Size, torch.dtype]]


def _alloc(specs: Specs, lead: tuple[int, ...], device: torch.device, shared: bool) -> dict:
    out = {}
    for key, (shape, dtype) in specs.items():
        t = torch.zeros(lead + tuple(shape), dtype=dtype, device=device)
        out[key] = t.share_memory_() if shared else t
    return out


class SlotBuffer:
    """Preallocated storage for the segments of ``n_rows`` envs over ``n_timesteps`` steps.

    Args:
        n_rows: ``R``, one row per env.
        n_timesteps: ``T``.
        step_specs: specs of the per-step keys (prefixed: ``observation/frame``, ...).
        info_specs: specs of the per-row info keys.
        device: where the buffer lives.
        shared: put the tensors in shared memory (multi-process batchers).
    """

    def __init__(
        self,
        n_rows: int,
        n_timesteps: int,
        step_specs: Specs,
        info_specs: Specs,
        device: torch.device | str = "cpu",
        shared: bool = False,
    ) -> None:
        device = torch.device(device)
        self.n_rows = n_rows
        self.n_timesteps = n_timesteps
        self.step_specs = dict(step_specs)
        self.info_specs = dict(info_specs)
        self.steps: dict[str, Tensor] = _alloc(step_specs, (n_rows, n_timesteps), device, shared)
        self.info: dict[str, Tensor] = _alloc(info_specs, (n_rows,), device, shared)
        self.lengths = torch.zeros(n_rows, dtype=torch.long, device=device)
        if shared:
            self.lengths.share_memory_()
        # Per prefix: (full key, buffer tensor, expected feature shape, dtype), in a fixed order.
        self._plan: dict[str, list[tuple[str, str, Tensor, tuple, torch.dtype]]] = {}
        for key, (shape, dtype) in self.step_specs.items():
            prefix, _, leaf = key.partition("/")
            self._plan.setdefault(prefix + "/", []).append(
                (leaf, key, self.steps[key], tuple(shape), dtype)
            )

    def nbytes(self) -> int:
        """Bytes of all the buffer's tensors."""
        tensors = [*self.steps.values(), *self.info.values(), self.lengths]
        return sum(t.numel() * t.element_size() for t in tensors)

    def bytes_per_transition(self) -> float:
        """Buffer bytes per stored transition (one row, one step)."""
        return sum(t[0, 0].numel() * t.element_size() for t in self.steps.values())

    def _check(self, prefix: str, values: DictTensor, n: int, where: str) -> None:
        plan = self._plan.get(prefix, [])
        if len(values._tensors) != len(plan) or any(p[0] not in values for p in plan):
            expected = sorted(p[0] for p in plan)
            raise KeyMismatchError(
                f"{where}: {prefix[:-1]} has keys {sorted(values.keys())}, expected {expected} "
                "(the keys seen at the first step must stay the same)"
            )
        for leaf, _key, _buf, shape, dtype in plan:
            v = values._tensors[leaf]
            if v.dtype != dtype or v.shape[1:] != shape or v.shape[0] != n:
                raise ShapeError(
                    f"{where}: {prefix}{leaf} is {tuple(v.shape)} {v.dtype}, expected "
                    f"{(n, *shape)} {dtype} (no silent cast)"
                )

    def write_step(
        self, prefix: str, values: DictTensor, rows: Tensor | slice, n: int, t: int, where: str
    ) -> None:
        """Writes ``values`` (n rows, leaf keys) into ``steps[prefix + leaf][rows, t]``.

        Args:
            prefix: ``"observation/"``, ``"action/"`` or ``"_observation/"``.
            values: DictTensor ``(n, *feat)`` with exactly the leaf keys of ``prefix``.
            rows: buffer rows (a slice when they are contiguous, the fast path).
            n: number of rows.
            t: the time step.
            where: context for error messages (worker, step).
        """
        self._check(prefix, values, n, where)
        tensors = values._tensors
        if isinstance(rows, slice):
            for leaf, _key, buf, _shape, _dtype in self._plan[prefix]:
                buf[rows, t].copy_(tensors[leaf])
        else:
            for leaf, _key, buf, _shape, _dtype in self._plan[prefix]:
                buf[rows, t] = tensors[leaf]

    def write_info(self, values: Mapping[str, Tensor], rows: Tensor | slice) -> None:
        """Writes per-row info (full keys) into ``info[key][rows]``."""
        for key, v in values.items():
            buf = self.info[key]
            if v.dtype != buf.dtype or v.shape[1:] != buf.shape[1:]:
                raise ShapeError(
                    f"info key {key!r} is {tuple(v.shape)} {v.dtype}, expected "
                    f"(n, {', '.join(map(str, buf.shape[1:]))}) {buf.dtype}"
                )
            buf[rows] = v

    def read(self, rows: Tensor | None = None) -> Trajectories:
        """A copy of the rows with at least one valid step, shortened to the longest row.

        Args:
            rows: restrict to these rows (default: all rows with a valid step).
        """
        lengths = self.lengths
        if rows is None:
            rows = torch.nonzero(lengths > 0).squeeze(1)
        sel = lengths.index_select(0, rows)
        t_max = int(sel.max()) if sel.numel() else 0
        steps = {k: v[:, :t_max].index_select(0, rows) for k, v in self.steps.items()}
        info = {k: v.index_select(0, rows) for k, v in self.info.items()}
        n = rows.shape[0]
        device = lengths.device
        return Trajectories(
            DictTensor._trusted(info, n, device),
            TemporalDictTensor._trusted(DictTensor._trusted(steps, n, device), sel, t_max),
        )
