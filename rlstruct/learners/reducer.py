"""Bucketed, overlapped gradient all-reduce: what :meth:`~rlstruct.learners.rank.RankContext.step`
averages a rank's gradients with (a small DDP reducer)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["GradientReducer", "BUCKET_BYTES"]

#: Bytes of gradients per all-reduce bucket, like DDP's default bucket.
BUCKET_BYTES = 25 * 2**20


class GradientReducer:
    """Bucketed, overlapped gradient all-reduce (a small DDP reducer).

    Parameters are grouped into buckets in reverse order (backward produces the last layers'
    gradients first), up to about 25 MB of one dtype and device each. While armed, a
    post-accumulate-grad hook counts each bucket's gradients; buckets are launched strictly in
    index order (so every rank issues the same collectives in the same order) as soon as they
    and every bucket before them are complete. :meth:`finish` launches what is left, with the
    gradients that exist (the same set on every rank: same model, same loss), waits, divides
    by the number of ranks and writes the means back.
    """

    def __init__(self, params: list[nn.Parameter], bucket_bytes: int = BUCKET_BYTES) -> None:
        self.buckets: list[list[nn.Parameter]] = []
        size = 0
        for p in reversed([p for p in params if p.requires_grad]):
            nbytes = p.numel() * p.element_size()
            last = self.buckets[-1][0] if self.buckets else None
            if (last is None or size + nbytes > bucket_bytes or p.dtype != last.dtype
                    or p.device != last.device):
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += nbytes
        self._bucket_of = {id(p): k for k, bucket in enumerate(self.buckets) for p in bucket}
        self._armed = False
        self._missing: list[int] = []
        self._next = 0
        self._work: list[tuple[list[nn.Parameter], Tensor, Any]] = []
        for bucket in self.buckets:
            for p in bucket:
                p.register_post_accumulate_grad_hook(self._ready)

    def arm(self) -> None:
        """Starts counting gradients for one backward."""
        self._armed, self._next, self._work = True, 0, []
        self._missing = [len(bucket) for bucket in self.buckets]

    def _ready(self, p: nn.Parameter) -> None:
        if not self._armed:
            return
        self._missing[self._bucket_of[id(p)]] -= 1
        while self._next < len(self.buckets) and self._missing[self._next] == 0:
            self._launch(self.buckets[self._next])
            self._next += 1

    def _launch(self, bucket: list[nn.Parameter]) -> None:
        params = [p for p in bucket if p.grad is not None]
        if params:
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            self._work.append((params, flat, dist.all_reduce(flat, async_op=True)))

    def finish(self, world_size: int) -> None:
        """Launches the buckets backward left, waits for all, writes the means back."""
        if not self._armed:
            self._next, self._work = 0, []
        for bucket in self.buckets[self._next:]:
            self._launch(bucket)
        self._armed, self._next = False, len(self.buckets)
        for params, flat, handle in self._work:
            handle.wait()
            flat.div_(world_size)
            views = flat.split([p.numel() for p in params])
            torch._foreach_copy_([p.grad for p in params],
                                 [v.view_as(p) for v, p in zip(views, params)])
        self._work = []
