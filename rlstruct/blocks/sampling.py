"""Reproducible action sampling inside agents, on whatever device the agent runs.

A batcher seeds its agent (``agent.seed(s)``) and then moves it to its device; an agent that
samples with a generator of its own must therefore create that generator lazily, on the device
of its first logits. :class:`CategoricalSampler` does exactly that, and takes the argmax on the
rows that ``agent_info["greedy"]`` marks (how evaluation asks for the greedy policy:
:func:`greedy_info`). The agents honour an observation's ``action_mask`` (acting) and the stored
``observation/action_mask`` (replaying): :mod:`rlstruct.blocks.masks`. The log-probability and
entropy that losses need are in :mod:`rlstruct.blocks.functional` (``categorical_log_prob``,
``categorical_entropy``).

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
    >>> sample(logits, greedy_info()).tolist()  # one row of agent_info serves every row
    [1, 0]
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlstruct import keys as K
from rlstruct.agent import Agent
from rlstruct.blocks.distributions import ActionHead
from rlstruct.blocks.functional import categorical_log_prob
from rlstruct.blocks.masks import mask_head_params, mask_logits, observation_mask, stored_mask
from rlstruct.blocks.obs_input import model_input
from rlstruct.dicttensor import DictTensor
from rlstruct.trajectories import Trajectories

__all__ = [
    "CategoricalSampler",
    "ActorAgent",
    "HeadSampler",
    "PolicyAgent",
    "GREEDY",
    "greedy_info",
]

GREEDY = "greedy"
"""The ``agent_info`` key that asks for the argmax action on its rows."""


def greedy_info() -> DictTensor:
    """The ``agent_info`` of greedy evaluation: one row ``{"greedy": True}``, which a batcher
    broadcasts to all its rows (pass it to ``Run.evaluator`` or ``Evaluator``)."""
    return DictTensor({GREEDY: torch.ones(1, dtype=torch.bool)})


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

    def _generator(self, device: torch.device) -> torch.Generator:
        if self.generator is None or self.generator.device != device:
            self.generator = torch.Generator(device).manual_seed(self._seed)
        return self.generator

    def __call__(self, logits: Tensor, agent_info: DictTensor) -> Tensor:
        """One action per row of ``logits`` ``(n, A)``: int64 ``(n,)`` on their device; the
        argmax on rows where ``agent_info["greedy"]`` (bool, ``(n,)``, any device) is true."""
        generator = self._generator(logits.device)
        action = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)
        if GREEDY in agent_info:
            action = torch.where(agent_info[GREEDY].to(logits.device), logits.argmax(-1), action)
        return action


class _ModelAgent(Agent):
    """What :class:`ActorAgent` and :class:`PolicyAgent` share: a memoryless actor-critic
    ``model(frame) -> (out (n, P), value (n,))``, a seeded sampler (``_new_sampler``), and the
    replay of stored observations (``out`` under the key ``_replay_key``)."""

    _new_sampler: type[CategoricalSampler]
    _replay_key: str

    def __init__(
        self, model: torch.nn.Module, store_value: bool = True, replay_next_value: bool = False
    ) -> None:
        self.model = model
        self.store_value = store_value
        self.replay_next_value = replay_next_value
        self.sample = self._new_sampler()

    def seed(self, seed: int) -> None:
        """Seeds the sampler."""
        self.sample.seed(seed)

    def __call__(
        self, state: DictTensor, observation: DictTensor, agent_info: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        """One step for ``n`` rows: ``({"action", "logp"[, "value"]}, state)``, with ``sample``
        too for a :class:`PolicyAgent`."""
        out, value = self.model(model_input(observation))
        step = self._act(self._mask(out, observation_mask(observation)), agent_info)
        if self.store_value:
            step[K.VALUE] = value
        return DictTensor(step), state

    def _act(self, out: Tensor, agent_info: DictTensor) -> dict[str, Tensor]:
        """What the agent returns for the model's output ``out`` (without ``value``)."""
        raise NotImplementedError

    def _mask(self, out: Tensor, mask: Tensor | None) -> Tensor:
        """The model's output with the illegal actions' logits masked (``mask`` ``(n, A)``,
        or None: unchanged; :mod:`rlstruct.blocks.masks`)."""
        return mask_logits(out, mask)

    def call_replay(
        self, trajectories: Trajectories, t: int, state: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        """``({"logits" or "params", "value"[, "next_value"]}, state)`` of step ``t`` of stored
        trajectories ``(B, T, ...)``: the model's outputs with gradients (``logits`` for an
        :class:`ActorAgent`, ``params`` for a :class:`PolicyAgent`), next_value without."""
        steps = trajectories.trajectories
        out, value = self.model(model_input(steps, K.OBSERVATION)[:, t])
        replayed = {self._replay_key: self._mask(out, stored_mask(steps, t)), K.VALUE: value}
        if self.replay_next_value:
            with torch.no_grad():  # V(s') is a target: no gradient flows into it
                replayed["next_value"] = self.model(model_input(steps, K.NEXT_OBSERVATION)[:, t])[1]
        return DictTensor(replayed), state


class ActorAgent(_ModelAgent):
    """A memoryless actor over ``model(frame) -> (logits (n, A), value (n,))``: samples ``a ~
    softmax(logits)`` (the argmax on rows with ``agent_info["greedy"]``) and returns
    ``action``, its log-probability ``logp`` under the acting policy and, with ``store_value``,
    the critic's ``value``. Seeded by :meth:`seed` (a :class:`CategoricalSampler`).

    :meth:`call_replay` (what ``replay_agent_stateless`` calls on the learner) samples nothing:
    it returns the differentiable ``logits`` and ``value`` of the stored observations, and with
    ``replay_next_value`` the gradient-free ``next_value``, V of the TRUE next observations.

    Args:
        model: the actor-critic (``rlstruct.blocks.nets.MLPActorCritic``, ``CNNActorCritic``...).
        store_value: also return ``value`` when acting (PPO stores it; IMPALA recomputes it).
        replay_next_value: :meth:`call_replay` also returns ``next_value`` (the replayed
            trajectories must hold ``_observation/frame``).
    """

    _new_sampler = CategoricalSampler
    _replay_key = "logits"

    def _act(self, logits: Tensor, agent_info: DictTensor) -> dict[str, Tensor]:
        """``{"action", "logp"}`` of ``n`` rows of logits ``(n, A)``."""
        action = self.sample(logits, agent_info)
        return {K.ACTION_KEY: action, K.LOGP: categorical_log_prob(logits, action)}


class HeadSampler(CategoricalSampler):
    """Samples from a policy head (:mod:`rlstruct.blocks.distributions`) with its own seeded
    generator,
    created like :class:`CategoricalSampler`'s on the device of the params; rows with
    ``agent_info["greedy"]`` play the head's greedy action. For a categorical head the draws
    are :class:`CategoricalSampler`'s."""

    def __call__(  # type: ignore[override]
        self, head: ActionHead, params: Tensor, agent_info: DictTensor
    ) -> tuple[Tensor, Tensor]:
        """``(sample, env action)`` for each row of ``params`` ``(n, P)``: the head's own
        (unclipped) sample, for the log-prob, and the action the env receives."""
        greedy = agent_info[GREEDY] if GREEDY in agent_info else None  # noqa: SIM401
        return head.act(params, self._generator(params.device), greedy)


class PolicyAgent(_ModelAgent):
    """A memoryless actor over ``model(frame) -> (params (n, P), value (n,))`` whose
    ``model.head`` is a policy head (:class:`rlstruct.blocks.nets.HeadActorCritic`): any action
    space.

    Returns ``action`` (what the env receives: rescaled and clipped into a Box), ``sample`` (the
    head's own sample, unclipped: the one its log-prob is taken at), ``logp`` and, with
    ``store_value``, the critic's ``value``. Rows with ``agent_info["greedy"]`` play the head's
    greedy action. Samples come from a :class:`HeadSampler` (seeded by :meth:`seed`), so a
    batcher's seeds reproduce its collection; for a categorical head the draws are
    :class:`ActorAgent`'s. :meth:`call_replay` returns ``params`` (not ``logits``) and
    ``value``: a loss rebuilds the distribution with ``model.head``.

    Args:
        model: the actor-critic; ``model.head`` an
            :class:`rlstruct.blocks.distributions.ActionHead`.
        store_value: also return ``value`` when acting.
        replay_next_value: :meth:`call_replay` also returns ``next_value`` (the replayed
            trajectories must hold ``_observation/frame``).
    """

    _new_sampler = HeadSampler
    _replay_key = "params"

    def _mask(self, out: Tensor, mask: Tensor | None) -> Tensor:
        """The head's params with the mask applied (a categorical head's logits)."""
        return mask_head_params(self.model.head, out, mask)

    def _act(self, params: Tensor, agent_info: DictTensor) -> dict[str, Tensor]:
        """``{"action", "sample", "logp"}`` of ``n`` rows of head params ``(n, P)``."""
        head = self.model.head
        sample, action = self.sample(head, params, agent_info)
        return {K.ACTION_KEY: action, K.SAMPLE: sample, K.LOGP: head.log_prob(params, sample)}
