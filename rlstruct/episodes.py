"""Episode bookkeeping over consecutive trajectory segments (for logging training returns)."""

from __future__ import annotations

import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.temporal import TemporalDictTensor

__all__ = ["EpisodeReturns"]

_REWARD = K.NEXT_OBSERVATION + K.REWARD
_DONE = K.NEXT_OBSERVATION + K.DONE


class EpisodeReturns:
    """Returns of the episodes that end in consecutive auto-reset segments (row ``b`` is env
    ``b`` in every segment), vectorised over time: the return so far of every unfinished
    episode is carried from one segment to the next."""

    def __init__(self) -> None:
        self.carry: Tensor | None = None

    def __call__(self, steps: TemporalDictTensor) -> tuple[Tensor, Tensor]:
        """``(returns, lengths)`` of the episodes that ended in ``steps``."""
        valid = steps.mask()
        reward = torch.where(valid, steps[_REWARD], 0.0)
        done = steps[_DONE] & valid
        if self.carry is None:
            self.carry = torch.zeros_like(reward[:, 0])
        total = self.carry.unsqueeze(1) + reward.cumsum(1)
        t = torch.arange(done.shape[1], device=done.device).expand_as(done)
        ended = torch.where(done, t, -1).cummax(1).values  # the last episode end at or before t
        ended = torch.cat([torch.full_like(ended[:, :1], -1), ended[:, :-1]], 1)  # ... before t
        start = torch.where(ended >= 0, total.gather(1, ended.clamp(min=0)), 0.0)
        episode = total - start  # the return of the episode running at t, up to t
        self.carry = torch.where(done[:, -1], 0.0, episode[:, -1])
        return episode[done], steps[K.NEXT_OBSERVATION + K.ENV_STEP][done]
