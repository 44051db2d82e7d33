"""Reproducible action sampling inside agents, on whatever device the agent runs.

A batcher seeds its agent (``agent.seed(s)``) and then moves it to its device; an agent that
samples with a generator of its own must therefore create that generator lazily, on the device
of its first logits. :class:`CategoricalSampler` does exactly that, and takes the argmax on the
rows that ``agent_info["greedy"]`` marks (how evaluation asks for the greedy policy).

Example:
    >>> import torch
    >>> from rlstruct import DictTensor
    >>> sample = CategoricalSampler()
    >>> sample.seed(0)
    >>> logits = torch.tensor([[0.0, 5.0], [5.0, 0.0]])
    >>> sample(logits, DictTensor({"greedy": torch.tensor([True, True])})).tolist()
    [1, 0]
    >>> first = sample(logits, DictTensor())
    >>> sample.seed(0)
    >>> sample(logits, DictTensor()).equal(first)  # the same seed, the same draws
    True
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlstruct.dicttensor import DictTensor

__all__ = ["CategoricalSampler"]


class CategoricalSampler:
    """Samples ``a ~ softmax(logits)`` per row from its own seeded generator.

    The generator lives on the device of the logits (created at the first call, and again if
    the logits move to another device), seeded with the last :meth:`seed`, 0 by default.
    """

    def __init__(self) -> None:
        self._seed = 0
        self.generator: torch.Generator | None = None

    def seed(self, seed: int) -> None:
        """Restarts the random stream from ``seed`` (at the next call, on its device)."""
        self._seed, self.generator = seed, None

    def __call__(self, logits: Tensor, agent_info: DictTensor) -> Tensor:
        """One action per row of ``logits`` ``(n, A)``: int64 ``(n,)`` on their device; the
        argmax on rows where ``agent_info["greedy"]`` (bool, ``(n,)``, any device) is true."""
        if self.generator is None or self.generator.device != logits.device:
            self.generator = torch.Generator(logits.device).manual_seed(self._seed)
        action = torch.multinomial(logits.softmax(-1), 1, generator=self.generator).squeeze(1)
        if "greedy" in agent_info:
            action = torch.where(agent_info["greedy"].to(logits.device), logits.argmax(-1), action)
        return action
