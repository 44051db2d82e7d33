"""The slot buffer: every tensor a batcher writes, allocated once from specs, written by index.

Layout: one row per env (``R`` rows = all envs of all workers), ``T`` steps.

- ``steps[key]``: ``(T, R, *feat)``, TIME-MAJOR, for the keys ``observation/*``, ``action/*``,
  ``_observation/*``: a step of contiguous rows is one contiguous block, so the per-step writes
  of thousands of envs are plain memory copies (row-major, ``(R, T, ...)``, they were strided
  and cost 20x more at 4096 envs). :meth:`SlotBuffer.read` hands out ``(B, T, ...)`` copies;
- ``info[key]``: ``(R, *feat)`` for ``agent_info/*``, ``env_info/*``, ``agent_state/*``,
  ``env_id`` and ``policy_version``, written at segment start;
- ``lengths``: ``(R,)`` int64, the valid steps of each row in the current segment.

Writers check keys, shapes and dtypes against the specs (a wrong dtype is an error, never a
silent cast). Readers get copies: the batch handed to the learner never aliases the buffer the
workers are writing into.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter

import torch
from torch import Tensor

from rlstruct import keys as K
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
        self.steps: dict[str, Tensor] = _alloc(step_specs, (n_timesteps, n_rows), device, shared)
        self.info: dict[str, Tensor] = _alloc(info_specs, (n_rows,), device, shared)
        self.lengths = torch.zeros(n_rows, dtype=torch.long, device=device)
        self._pinned: bool | None = None
        self._registered: list[Tensor] = []
        if shared:
            self.lengths.share_memory_()
        # Per prefix: (leaf, full key, buffer tensor, feature shape, dtype), in a fixed order.
        self._plan: dict[str, list[tuple[str, str, Tensor, tuple, torch.dtype]]] = {}
        for key, (shape, dtype) in self.step_specs.items():
            prefix, _, leaf = key.partition("/")
            self._plan.setdefault(prefix + "/", []).append(
                (leaf, key, self.steps[key], tuple(shape), dtype)
            )
        # Views ``buf[t, rows]`` for contiguous row ranges, built once per (prefix, rows, t):
        # building a view costs as much as the copy itself in the hot loop.
        self._views: dict[tuple[int, int], list[list[Tensor] | None]] = {}
        #: The step prefixes, in the order :meth:`write_steps` takes them.
        self._order = (K.OBSERVATION, K.ACTION, K.NEXT_OBSERVATION)
        for prefix in self._order:
            self._plan.setdefault(prefix, [])
        # What write_steps checks, per prefix: the number of keys and a getter of the tensors in
        # plan order (KeyError when one is missing); then every tensor's dtype, and its shape
        # against ``(n, *feat)`` (per n, built once).
        leaves = [[e[0] for e in self._plan[p]] for p in self._order]
        self._getters = [(len(ls), itemgetter(*ls) if ls else None) for ls in leaves]
        self._dtypes = [e[4] for p in self._order for e in self._plan[p]]
        self._shapes: dict[int, list[torch.Size]] = {}

    def nbytes(self) -> int:
        """Bytes of all the buffer's tensors."""
        tensors = [*self.steps.values(), *self.info.values(), self.lengths]
        return sum(t.numel() * t.element_size() for t in tensors)

    def bytes_per_transition(self) -> float:
        """Buffer bytes per stored transition (one row, one step)."""
        return sum(t[0, 0].numel() * t.element_size() for t in self.steps.values())

    def _check_group(self, prefix: str, values: DictTensor, n: int, where: str) -> None:
        """Raises the error that names the first key of ``values`` that does not match the
        specs of ``prefix`` (the slow path of :meth:`write_steps`, once a check failed)."""
        plan = self._plan.get(prefix, [])
        expected = sorted(p[0] for p in plan)
        if sorted(values.keys()) != expected:
            raise KeyMismatchError(
                f"{where}: {prefix[:-1]} has keys {sorted(values.keys())}, expected {expected} "
                "(the keys seen at the first step must stay the same)"
            )
        for leaf, _key, _buf, shape, dtype in plan:
            v = values.tensors[leaf]
            if v.dtype != dtype or v.shape[1:] != shape or v.shape[0] != n:
                raise ShapeError(
                    f"{where}: {prefix}{leaf} is {tuple(v.shape)} {v.dtype}, expected "
                    f"{(n, *shape)} {dtype} (no silent cast)"
                )

    def _row_views(self, rows: slice, t: int) -> list[Tensor]:
        """Views ``buf[t, rows]`` of every step key, in plan order (built once, then cached)."""
        per_t = self._views.get((rows.start, rows.stop))
        if per_t is None:
            per_t = self._views[(rows.start, rows.stop)] = [None] * self.n_timesteps
        views = per_t[t]
        if views is None:
            views = per_t[t] = [e[2][t, rows] for p in self._order for e in self._plan[p]]
        return views

    def write_steps(
        self, groups: Sequence[DictTensor], rows: Tensor | slice, n: int, t: int, where: str
    ) -> None:
        """Writes one step of every prefix into ``steps[prefix + leaf][t, rows]``.

        Keys, shapes and dtypes are checked against the specs: a mismatch raises (no cast).

        Args:
            groups: DictTensors ``(n, *feat)`` with the leaf keys of ``observation/``,
                ``action/`` and ``_observation/``, in that order.
            rows: buffer rows (a slice when they are contiguous: the fast path, one batched copy).
            n: number of rows.
            t: the time step.
            where: context for error messages (worker, step).
        """
        sources: list[Tensor] = []
        try:
            for (count, get), values in zip(self._getters, groups):
                tensors = values.tensors
                if len(tensors) != count:
                    raise KeyError
                if count == 1:  # itemgetter of one key returns the tensor, not a tuple
                    sources.append(get(tensors))
                elif count:
                    sources += get(tensors)
            shapes = self._shapes.get(n)
            if shapes is None:
                shapes = self._shapes[n] = [
                    torch.Size((n, *e[3])) for p in self._order for e in self._plan[p]
                ]
            dtypes = [v.dtype for v in sources]
            ok = dtypes == self._dtypes and [v.shape for v in sources] == shapes
        except KeyError:
            ok = False
        if not ok:
            for prefix, values in zip(self._order, groups):
                self._check_group(prefix, values, n, f"{where}, step {t}")
            raise AssertionError(f"{where}, step {t}: mismatch not found")  # pragma: no cover
        if isinstance(rows, slice):
            # One dispatch for all the copies: per-copy overhead dominates these tiny writes.
            torch._foreach_copy_(self._row_views(rows, t), sources)
        else:
            plans = (e for p in self._order for e in self._plan[p])
            for entry, v in zip(plans, sources):
                entry[2][t, rows] = v

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

    def pin(self) -> bool:
        """Page-locks the buffer's CPU tensors in place (``cudaHostRegister``), so that
        :meth:`read` can copy them straight to a GPU, asynchronously. Best effort: False when
        there is no CUDA or registration fails (then reads to a GPU go through a CPU copy)."""
        if self._pinned is not None:
            return self._pinned
        self._pinned = False
        if self.lengths.device.type != "cpu" or not torch.cuda.is_available():
            return False
        cudart = torch.cuda.cudart()
        for t in self._host_tensors():
            if int(cudart.cudaHostRegister(t.data_ptr(), t.untyped_storage().nbytes(), 0)) != 0:
                self.unpin()
                return False
            self._registered.append(t)
        self._pinned = True
        return True

    def unpin(self) -> None:
        """Undoes :meth:`pin` (before the memory is freed)."""
        if self._registered:
            cudart = torch.cuda.cudart()
            for t in self._registered:
                cudart.cudaHostUnregister(t.data_ptr())
        self._registered, self._pinned = [], None

    def _host_tensors(self) -> list[Tensor]:
        return [t for t in (*self.steps.values(), *self.info.values(), self.lengths) if t.numel()]

    def read(self, rows: Tensor | None = None, device: torch.device | None = None) -> Trajectories:
        """A copy of the rows with at least one valid step, shortened to the longest row.

        One copy: from the buffer to the result. With a CUDA ``device`` and a pinned buffer
        (:meth:`pin`) whose rows are all valid for the whole segment (the usual auto-reset
        case), that one copy goes straight to the GPU, non-blocking on the current stream
        (so the learner's kernels queue behind it); otherwise it goes through a CPU copy.

        Args:
            rows: restrict to these rows (default: all rows with a valid step).
            device: where the result lives (default: the buffer's device).
        """
        lengths = self.lengths
        target = torch.device(device) if device is not None else lengths.device
        if (
            rows is None
            and target.type == "cuda"
            and self._pinned
            and bool((lengths == self.n_timesteps).all())
        ):
            n, t_max = self.n_rows, self.n_timesteps
            steps = {
                k: v.to(target, non_blocking=True).transpose(0, 1).contiguous()
                for k, v in self.steps.items()
            }
            info = {k: v.to(target, non_blocking=True) for k, v in self.info.items()}
            sel = lengths.to(target, non_blocking=True)
            # The buffer may be rewritten once the caller lets the workers go on.
            torch.cuda.current_stream(target).synchronize()
            return Trajectories(
                DictTensor.trusted(info, n, target),
                TemporalDictTensor.trusted(DictTensor.trusted(steps, n, target), sel, t_max),
            )
        if rows is None:
            rows = torch.nonzero(lengths > 0).squeeze(1)
        sel = lengths.index_select(0, rows)
        t_max = int(sel.max()) if sel.numel() else 0
        # One copy per key, gathering (T, R) into (B, T): index_select allocates contiguously.
        steps = {k: v[:t_max].transpose(0, 1).index_select(0, rows) for k, v in self.steps.items()}
        info = {k: v.index_select(0, rows) for k, v in self.info.items()}
        n = rows.shape[0]
        device = lengths.device
        if target != device:
            batch = Trajectories(
                DictTensor.trusted(info, n, device),
                TemporalDictTensor.trusted(DictTensor.trusted(steps, n, device), sel, t_max),
            )
            return batch.to(target)
        return Trajectories(
            DictTensor.trusted(info, n, device),
            TemporalDictTensor.trusted(DictTensor.trusted(steps, n, device), sel, t_max),
        )
