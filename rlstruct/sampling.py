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

from rlstruct import keys as K
from rlstruct.agent import Agent
from rlstruct.dicttensor import DictTensor

__all__ = ["CategoricalSampler", "ActorAgent", "PolicyAgent"]


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


class ActorAgent(Agent):
    """A memoryless actor over ``model(frame) -> (logits (n, A), value (n,))``: samples ``a ~
    softmax(logits)`` (the argmax on rows with ``agent_info["greedy"]``) and returns
    ``action``, its log-probability ``logp`` under the acting policy and, with ``store_value``,
    the critic's ``value``. Seeded by :meth:`seed` (a :class:`CategoricalSampler`).

    Args:
        model: the actor-critic (``rlstruct.nets.MLPActorCritic``, ``CNNActorCritic``...).
        store_value: also return ``value`` (PPO stores it; IMPALA recomputes it).
    """

    def __init__(self, model: torch.nn.Module, store_value: bool = True) -> None:
        self.model = model
        self.store_value = store_value
        self.sample = CategoricalSampler()

    def seed(self, seed: int) -> None:
        """Seeds the sampler."""
        self.sample.seed(seed)

    def __call__(
        self, state: DictTensor, observation: DictTensor, agent_info: DictTensor, history=None
    ) -> tuple[DictTensor, DictTensor]:
        """One step: ``({"action", "logp"[, "value"]}, state)`` for ``n`` rows."""
        logits, value = self.model(observation[K.FRAME])
        action = self.sample(logits, agent_info)
        logp = logits.log_softmax(-1).gather(1, action.unsqueeze(1)).squeeze(1)
        out = {K.ACTION_KEY: action, "logp": logp}
        if self.store_value:
            out["value"] = value
        return DictTensor(out), state


class PolicyAgent(Agent):
    """A memoryless actor over ``model(frame) -> (params (n, P), value (n,))`` whose
    ``model.head`` is a policy head (:class:`rlstruct.nets.HeadActorCritic`): any action space.

    Returns ``action`` (what the env receives: rescaled and clipped into a Box), ``sample`` (the
    head's own sample, unclipped: the one its log-prob is taken at), ``logp`` and, with
    ``store_value``, the critic's ``value``. Rows with ``agent_info["greedy"]`` play the head's
    greedy action. Samples come from the agent's own generator (seeded by :meth:`seed`, created
    on the device of the first params), so a batcher's seeds reproduce its collection.

    Args:
        model: the actor-critic; ``model.head`` an :class:`rlstruct.distributions.ActionHead`.
        store_value: also return ``value``.
    """

    def __init__(self, model: torch.nn.Module, store_value: bool = True) -> None:
        self.model = model
        self.store_value = store_value
        self._seed = 0
        self.generator: torch.Generator | None = None

    def seed(self, seed: int) -> None:
        """Restarts the random stream from ``seed`` (at the next call, on its device)."""
        self._seed, self.generator = seed, None

    def __call__(
        self, state: DictTensor, observation: DictTensor, agent_info: DictTensor, history=None
    ) -> tuple[DictTensor, DictTensor]:
        """One step: ``({"action", "sample", "logp"[, "value"]}, state)`` for ``n`` rows."""
        params, value = self.model(observation[K.FRAME])
        if self.generator is None or self.generator.device != params.device:
            self.generator = torch.Generator(params.device).manual_seed(self._seed)
        head = self.model.head
        greedy = agent_info["greedy"] if "greedy" in agent_info else None  # noqa: SIM401
        sample, action = head.act(params, self.generator, greedy)
        out = {K.ACTION_KEY: action, "sample": sample, "logp": head.log_prob(params, sample)}
        if self.store_value:
            out["value"] = value
        return DictTensor(out), state
