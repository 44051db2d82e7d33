"""A one-slot, thread-safe mailbox for weights: a learner thread publishes its newest
``state_dict``, the owner's thread takes it when it is ready (APPO, IMPALA). Re-exported by
:mod:`rlstruct.learners.thread`, beside the :class:`~rlstruct.learners.thread.LearnerThread`
that publishes into it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from torch import Tensor

__all__ = ["LatestWeights"]


class LatestWeights:
    """The learner thread's mailbox for weights: :meth:`put` keeps a CPU copy of the newest
    ``state_dict``, :meth:`take` hands it to the owner's thread once (thread-safe).

    The learner publishes after each update; the owner takes what is there when it is ready
    (e.g. before ``batcher.update``), so weights it had no time to use are simply replaced.

    Examples:
        >>> import torch
        >>> box = LatestWeights()
        >>> box.put({"w": torch.ones(2)}); box.put({"w": torch.zeros(2)})
        >>> box.take(), box.take(), box.published
        ({'w': tensor([0., 0.])}, None, 2)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._weights: dict[str, Tensor] | None = None
        #: How many times :meth:`put` was called.
        self.published = 0

    def put(self, state_dict: Mapping[str, Tensor]) -> None:
        """Keeps a detached CPU copy of ``state_dict`` (any device), replacing an untaken one."""
        weights = {k: v.detach().to("cpu", copy=True) for k, v in state_dict.items()}
        with self._lock:
            self._weights = weights
            self.published += 1

    def take(self) -> dict[str, Tensor] | None:
        """The weights put since the last call, or None if none were."""
        with self._lock:
            weights, self._weights = self._weights, None
        return weights
