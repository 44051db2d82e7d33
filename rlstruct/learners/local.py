"""The learner group of one rank, in this process: what ``--n-learners 1`` learns with.

Every algorithm learns through a learner group (:meth:`rlstruct.runs.run.Run.learner_group`),
whatever the number of ranks, so an algorithm has one learn path. With one rank the group is a
:class:`LocalLearner`: the algorithm's own model and one optimizer on the learner device, the
learn function called in the caller's thread, nothing started and nothing copied. It is the
group API of :class:`~rlstruct.learners.base.LearnerGroupBase` (``learn``, ``submit`` and
``collect``, ``state_dict``, ``optimizer``) over what an algorithm would otherwise hold itself,
so the one-rank path costs a function call (``benchmarks/learning.py`` measures PPO both ways).

Example:
    >>> import torch
    >>> from functools import partial
    >>> from rlstruct.blocks.optim import adam, gradient_step
    >>> model = torch.nn.Linear(2, 1)
    >>> def learn(ctx, batch):
    ...     loss = ctx.model(batch).pow(2).mean()
    ...     ctx.step(ctx.optimizer, loss, max_grad_norm=0.5)
    ...     return {"loss": loss.item()}
    >>> group = LocalLearner(model, partial(adam, lr=0.1), learn, torch.device("cpu"))
    >>> before = model.weight.clone()
    >>> stats = group.learn(torch.ones(4, 2))
    >>> sorted(stats), bool((model.weight != before).all())  # the caller's model learned
    (['loss'], True)
    >>> group.state_dict()["weight"] is not None, group.n_learners
    (True, 1)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from rlstruct.errors import BatcherStateError
from rlstruct.learners.base import LearnerGroupBase, LearnFn, OptimizerFactory
from rlstruct.learners.rank import RankContext

__all__ = ["LocalLearner"]


class LocalLearner(LearnerGroupBase):
    """One learner rank in this process, on ``model`` itself.

    Args:
        model: the algorithm's model, moved to ``device`` here; it learns in place (no copy).
        make_optimizer: ``make_optimizer(params, device=device)``: the one optimizer, built
            here (e.g. ``partial(rlstruct.blocks.optim.adam, lr=1e-3)``).
        learn: ``learn(ctx, batch, **kwargs) -> metrics`` (a
            :class:`~rlstruct.learners.rank.RankContext` of one rank: ``ctx.step`` is
            :func:`~rlstruct.blocks.optim.gradient_step`, the collectives return their inputs).
        device: the learner device; batches are moved to it.

    Raises:
        ConfigError: a factory or ``learn`` is not callable.
    """

    def __init__(self, model: nn.Module, make_optimizer: OptimizerFactory, learn: LearnFn,
                 device: torch.device) -> None:
        self._setup("LocalLearner", [], lambda: model, make_optimizer, learn,
                    model.state_dict(), timeout=1.0, start_timeout=1.0, bucket_mb=1.0)
        self.n_learners = 1
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self._optimizer = make_optimizer(self.model.parameters(), device=self.device)
        self._ctx = RankContext(0, 1, self.device, self.model, self._optimizer)
        self._learn = learn
        self._results: deque[dict[str, float]] = deque()
        self._closed = False

    @property
    def optimizer(self) -> Any:
        """The optimizer itself (what checkpoints hold)."""
        return self._optimizer

    def submit(self, batch: Any, **kwargs: Any) -> None:
        """Learns on ``batch`` (moved to the learner device) before it returns; :meth:`collect`
        then returns the metrics. ``kwargs`` go to the learn function (e.g. ``lr``).

        Raises:
            BatcherStateError: the learner is closed.
        """
        if self._closed:
            raise BatcherStateError("submit: the learner is closed")
        metrics = self._learn(self._ctx, batch.to(self.device), **kwargs)
        self._results.append({k: float(v) for k, v in dict(metrics or {}).items()})

    def collect(self, timeout: float | None = None) -> dict[str, float]:
        """The metrics of the oldest batch :meth:`submit` learned.

        Raises:
            BatcherStateError: nothing was submitted.
        """
        if not self._results:
            raise BatcherStateError("collect: no batch submitted (submit(batch) first)")
        return self._results.popleft()

    def optimizer_state_dict(self) -> dict[str, Any]:
        """The optimizer's state."""
        return self._optimizer.state_dict()

    def close(self, timeout: float = 10.0) -> None:
        """Nothing to stop; later calls to :meth:`submit` raise."""
        self._closed = True

    def _weights(self) -> dict[str, Tensor]:
        """The model's own state_dict (its tensors, on the learner device)."""
        return self.model.state_dict()

    def _load(self, state: Mapping[str, Tensor] | None, optimizer_state: dict | None) -> None:
        if self._results:
            raise BatcherStateError(f"load: {len(self._results)} batches' metrics to collect")
        if state is not None:
            self.model.load_state_dict(state)
        if optimizer_state is not None:
            self._optimizer.load_state_dict(optimizer_state)
