"""What IMPALA and APPO share to learn with every model of the zoo (:mod:`rlstruct.blocks.zoo`),
recurrent ones included: the behaviour agent, the replay of a segment's logits and values, and
APPO's minibatches of whole rows.

A feed-forward model is replayed in ONE batched call over the segment's ``B * T`` steps
(``replay_agent_stateless``); a recurrent one from the state the batcher stored at the
segment's start (``replay_rows`` from ``info["agent_state/h"]``: the encoder of every step in
one batch, the cell step by step; the agent restarts from zeros at episode starts, as while
acting). Either way the learner gets the logits and
values with gradients, and ``V'`` of the true next observations without
(:func:`~rlstruct.blocks.recurrent.bootstrap_values` for a recurrent model).

Example:
    >>> from gymnasium import spaces
    >>> from rlstruct.blocks.distributions import space_spec
    >>> from rlstruct.blocks.zoo import actor_critic
    >>> space = space_spec(spaces.Discrete(2))
    >>> type(behaviour_agent(actor_critic("mlp-lstm", (2,), space, 8))).__name__
    'RecurrentAgent'
    >>> type(behaviour_agent(actor_critic("mlp", (2,), space, 8))).__name__
    'ActorAgent'
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from rlstruct import keys as K
from rlstruct.agent import Agent
from rlstruct.agent_replay import replay_agent_stateless
from rlstruct.batchers.make import default_processes
from rlstruct.blocks.masks import mask_logits, stored_mask
from rlstruct.blocks.obs_input import model_input
from rlstruct.blocks.recurrent import STATE, RecurrentAgent, bootstrap_values, replay_rows
from rlstruct.blocks.sampling import ActorAgent
from rlstruct.blocks.zoo import is_recurrent
from rlstruct.dicttensor import DictTensor
from rlstruct.trajectories import Trajectories

__all__ = ["behaviour_agent", "replay_segment", "replay_transitions", "evaluate_segment",
           "minibatch_problems", "minibatches", "segment_rows"]


def behaviour_agent(model: nn.Module, replay_next_value: bool = False) -> Agent:
    """The categorical agent of a zoo model: it samples ``a ~ softmax(logits)`` (the argmax on
    rows with ``agent_info["greedy"]``) and stores ``action`` and its log-probability ``logp``
    under the acting policy, no value. Replayed, it returns the differentiable ``logits`` and
    ``value`` of the stored observations.

    A recurrent model gets a :class:`~rlstruct.blocks.recurrent.RecurrentAgent` (it also stores
    ``h``, its state after each step, and its replay returns ``h``); a feed-forward one an
    :class:`~rlstruct.blocks.sampling.ActorAgent`, whose replay also returns ``next_value``
    (V of the true next observations, no gradient) with ``replay_next_value``.
    """
    if is_recurrent(model):
        return RecurrentAgent(model, replay_key="logits", store_value=False)
    return ActorAgent(model, store_value=False, replay_next_value=replay_next_value)


def replay_segment(agent: Agent, traj: Trajectories) -> tuple[Tensor, Tensor, Tensor]:
    """``(logits (B, T, A), value (B, T), next_value (B, T))`` of a segment under the agent's
    model: logits and values with gradients (unless called under ``torch.no_grad()``),
    ``next_value`` (V of each step's true next observation) without.

    Args:
        agent: a :func:`behaviour_agent` (or a ``CheckDevice`` around one; a feed-forward one
            built with ``replay_next_value=True``), on the segment's device.
        traj: the segment ``(B, T, ...)``, with ``_observation/frame`` (and, for a recurrent
            model, the ``agent_state/h`` the batcher stored).
    """
    if is_recurrent(agent.model):
        out = replay_rows(agent, traj)
        value = out[K.VALUE]
        return out["logits"], value, bootstrap_values(agent.model, traj, value.detach(),
                                                      out[STATE])
    out = replay_agent_stateless(agent, traj)
    return out["logits"], out[K.VALUE], out["next_value"]


def replay_transitions(agent: Agent, minibatch: DictTensor | Trajectories,
                       keys: list[str]) -> tuple[DictTensor, DictTensor]:
    """``(new, data)``: the replayed ``logits`` and ``value`` (with gradients) of a minibatch's
    ``N`` valid steps, ``(N, A)`` and ``(N,)``, and its ``keys`` ``(N, ...)``, in the same order.

    A minibatch of transitions (a DictTensor, a feed-forward agent) is replayed in one call;
    whole rows (Trajectories, a recurrent agent) are replayed from their stored state, and
    their valid steps taken row after row.
    """
    if isinstance(minibatch, Trajectories):
        new = replay_rows(agent, minibatch).get(["logits", K.VALUE]).to_transitions()
        return new, minibatch.trajectories.get(keys).to_transitions()
    return replay_agent_stateless(agent, minibatch), minibatch


def minibatch_problems(minibatch_size: int, n_timesteps: int, layout: Any) -> list[str]:
    """What is wrong with the minibatches of a recurrent learner, as sentences for
    ``Config.problems``: a minibatch of ``minibatch_size`` transitions must hold whole rows
    (segments of ``n_timesteps`` steps), and the ``B`` rows of a segment of ``layout`` (a
    :class:`~rlstruct.runs.layout.LayoutConfig`, :func:`segment_rows`) must split into such
    minibatches."""
    rows = minibatch_size // n_timesteps
    n_rows = segment_rows(layout.n_processes, layout.n_envs, layout.batcher_device)
    if minibatch_size % n_timesteps or rows < 1:
        return [f"a recurrent model learns on minibatches of whole segments: minibatch_size "
                f"({minibatch_size}) must be a multiple of n_timesteps ({n_timesteps})"]
    if n_rows % rows:
        return [f"a recurrent model learns on minibatches of whole segments: the {n_rows} rows "
                f"of a segment (n_processes x n_envs) do not split into minibatches of {rows} "
                f"rows (minibatch_size {minibatch_size} / n_timesteps {n_timesteps}): make "
                f"them a multiple of {rows}"]
    return []


def evaluate_segment(agent: Agent, traj: Trajectories) -> tuple[Tensor, Tensor, Tensor]:
    """``(logits (B, T, A), value (B, T), next_value (B, T))`` of a segment, no gradient: a
    recurrent model replayed from its stored state (:func:`replay_segment`), a feed-forward
    one (``model(frame) -> (logits, value)`` and ``model.value``) in two batched calls; the
    logits masked by the stored ``observation/action_mask``, if any."""
    steps, model = traj.trajectories, agent.model
    with torch.no_grad():
        if is_recurrent(model):
            return replay_segment(agent, traj)
        shape = steps[K.NEXT_REWARD].shape
        logits, value = model(model_input(steps, K.OBSERVATION).flatten(0, 1))
        mask = stored_mask(steps)
        logits = mask_logits(logits, None if mask is None else mask.flatten(0, 1))
        next_value = model.value(model_input(steps, K.NEXT_OBSERVATION).flatten(0, 1)).view(shape)
        return logits.view(*shape, -1), value.view(shape), next_value


def segment_rows(n_processes: int, n_envs: int, batcher_device: str) -> int:
    """``B``, the rows of a segment of a layout: ``n_processes x n_envs`` on the CPU batcher
    (0 processes: one per core), ``n_envs`` on a device batcher."""
    if batcher_device != "cpu":
        return n_envs
    return (n_processes or default_processes()) * n_envs


def minibatches(batch: DictTensor | Trajectories, minibatch_size: int,
                n_timesteps: int) -> Iterator[DictTensor | Trajectories]:
    """One epoch's shuffled minibatches of a batch: of ``minibatch_size`` transitions (a
    DictTensor ``(N, ...)``), or of whole rows (``minibatch_size / n_timesteps`` of them, the
    last fewer if they do not divide ``B``) of Trajectories, each with its stored state."""
    rows = max(1, minibatch_size // n_timesteps) if isinstance(batch, Trajectories) \
        else minibatch_size
    order = torch.randperm(batch.n_elems(), device=batch.device())
    for idx in order.split(rows):
        yield batch.index(idx)
