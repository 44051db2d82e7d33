"""The agent of a recurrent actor-critic, and what its learners share.

A :class:`RecurrentAgent` runs a :class:`~rlstruct.blocks.zoo.RecurrentActorCritic`. Its state
is ``{"h": (n, S)}``, zeros at an episode's start: where ``observation["initial_state"]`` is
true it restarts from zeros before the step, during acquisition and during replay alike. A
batcher stores the state at each segment's start as ``info["agent_state/h"]``, and
``replay_agent`` restarts from it, so the learner re-runs the memory the actors had. The agent
also returns ``h``, its state after each step (stored as ``action/h``): the state under which
the step's next observation is valued at a segment's end or a truncation (the bootstrap,
:func:`bootstrap_values`), with no second pass over the segment.

Example:
    >>> from gymnasium import spaces
    >>> from rlstruct.blocks.distributions import space_spec
    >>> from rlstruct.blocks.zoo import actor_critic
    >>> agent = RecurrentAgent(actor_critic("mlp-gru", (3,), space_spec(spaces.Discrete(2)), 8))
    >>> state = agent.initial_state(DictTensor(), 4)
    >>> obs = DictTensor({"frame": torch.zeros(4, 3),
    ...                   "initial_state": torch.ones(4, dtype=torch.bool)})
    >>> out, state = agent(state, obs, DictTensor())
    >>> sorted(out.keys()), state["h"].shape
    (['action', 'h', 'logp', 'sample', 'value'], torch.Size([4, 16]))
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rlstruct import keys as K
from rlstruct.agent import Agent
from rlstruct.agent_replay import replay_agent
from rlstruct.blocks.masks import mask_head_params, mask_keys, observation_mask, stored_mask
from rlstruct.blocks.obs_input import input_keys, model_input
from rlstruct.blocks.sampling import HeadSampler
from rlstruct.dicttensor import DictTensor, masked_dicttensor
from rlstruct.temporal import TemporalDictTensor
from rlstruct.trajectories import Trajectories

__all__ = ["STATE", "STORED_STATE", "RecurrentAgent", "replay_rows", "bootstrap_steps",
           "bootstrap_values"]

#: The key of the state in the agent state (``agent_state/h`` in the info) and in its outputs.
STATE = "h"
#: Where the trajectories hold the state after each step.
STORED_STATE = K.ACTION + STATE


class RecurrentAgent(Agent):
    """Acts with a recurrent actor-critic ``model(frame, h) -> (params, value, h')``
    (:class:`~rlstruct.blocks.zoo.RecurrentActorCritic`) whose ``model.head`` is a policy head.

    ``__call__`` returns ``action`` (what the env receives), ``sample`` (the head's own sample,
    the one its log-prob is taken at), ``logp``, ``value`` (with ``store_value``) and ``h``;
    rows with ``agent_info["greedy"]`` play the head's greedy action. ``call_replay`` samples
    nothing: it returns the differentiable head params (under ``replay_key``) and ``value`` of
    the stored observations, and ``h``.

    Args:
        model: the recurrent actor-critic.
        replay_key: the key of the params in ``call_replay``'s outputs (``"logits"`` where a
            loss reads logits, as IMPALA's and APPO's do).
        store_value: also return ``value`` when acting.
    """

    def __init__(self, model: nn.Module, replay_key: str = "params",
                 store_value: bool = True) -> None:
        self.model, self.replay_key, self.store_value = model, replay_key, store_value
        self.sample = HeadSampler()

    def seed(self, seed: int) -> None:
        """Seeds the sampler."""
        self.sample.seed(seed)

    def initial_state(self, agent_info: DictTensor, n: int) -> DictTensor:
        """``{"h": zeros (n, S)}`` on the model's device."""
        weight = next(self.model.parameters())
        return DictTensor({STATE: weight.new_zeros(n, self.model.state_size)})

    def step(self, state: DictTensor, observation: DictTensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(params (n, P), value (n,), h' (n, S))`` of one step; the state restarts from
        zeros on the rows where ``observation["initial_state"]``; the params of a categorical
        head are masked by the observation's ``action_mask`` (:mod:`rlstruct.blocks.masks`)."""
        fresh = self.initial_state(DictTensor(), observation.n_elems())
        state = masked_dicttensor(state, fresh, observation[K.INITIAL_STATE])
        params, value, h = self.model(model_input(observation), state[STATE])
        return mask_head_params(self.model.head, params, observation_mask(observation)), value, h

    def __call__(
        self, state: DictTensor, observation: DictTensor, agent_info: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        """One step for ``n`` rows: ``({"action", "sample", "logp"[, "value"], "h"}, {"h"})``."""
        params, value, h = self.step(state, observation)
        head = self.model.head
        sample, action = self.sample(head, params, agent_info)
        out = {K.ACTION_KEY: action, K.SAMPLE: sample, K.LOGP: head.log_prob(params, sample),
               STATE: h}
        if self.store_value:
            out[K.VALUE] = value
        return DictTensor(out), DictTensor({STATE: h})

    def call_replay(
        self, trajectories: Trajectories, t: int, state: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        """``({replay_key, "value", "h"}, {"h"})`` of step ``t`` of stored trajectories
        ``(B, T, ...)``, with gradients."""
        steps = trajectories.trajectories
        observation = steps.get([*input_keys(steps.keys()), K.OBS_INITIAL_STATE] + mask_keys(steps))
        observation = observation.temporal_index(t).truncate_key(K.OBSERVATION)
        params, value, h = self.step(state, observation)
        return DictTensor({self.replay_key: params, K.VALUE: value, STATE: h}), \
            DictTensor({STATE: h})

    def replay_sequence(self, trajectories: Trajectories) -> TemporalDictTensor:
        """What :func:`~rlstruct.agent_replay.replay_agent` returns, with gradients, with the
        encoder of every step run as one batch (``model.forward_sequence``): the learners'
        fast replay of whole rows (:func:`replay_rows`).

        Starts from the state stored at the segment's start (``info["agent_state/h"]``), or
        zeros when none is stored, and restarts from zeros where
        ``observation/initial_state``, as acting and ``replay_agent`` do.

        Args:
            trajectories: info ``(B, ...)`` and steps ``(B, T, *feat)``.

        Returns:
            ``{replay_key (B, T, P), "value" (B, T), "h" (B, T, S)}`` with the trajectories'
            lengths; the outputs on padding steps are meaningless, as ``replay_agent``'s.
            ``h`` is whole after the steps a bootstrap reads (:func:`bootstrap_steps`; each
            row's last valid step where the steps hold no ``_observation/terminated``); an
            LSTM's cell half may be NaN after the others (``Core.sequence``).
        """
        steps = trajectories.trajectories
        b, n_t = steps.n_elems(), steps.n_timesteps()
        stored = trajectories.info.truncate_key(K.AGENT_STATE)
        state = (stored if not stored.empty() else self.initial_state(DictTensor(), b))[STATE]
        params, value, h = self.model.forward_sequence(
            model_input(steps, K.OBSERVATION), state, steps[K.OBS_INITIAL_STATE],
            bootstrap_steps(steps) if K.NEXT_TERMINATED in steps else _last_steps(steps))
        mask = stored_mask(steps)
        if mask is not None:
            params = mask_head_params(self.model.head, params.flatten(0, 1),
                                      mask.flatten(0, 1)).view(params.shape)
        out = DictTensor.trusted({self.replay_key: params, K.VALUE: value, STATE: h}, b,
                                 params.device)
        return TemporalDictTensor.trusted(out, steps.lengths, n_t)


def replay_rows(agent: Agent, trajectories: Trajectories) -> TemporalDictTensor:
    """A recurrent learner's replay of whole rows ``(B, T, *feat)`` from their stored start
    state, with gradients: :meth:`RecurrentAgent.replay_sequence` for a
    :class:`RecurrentAgent` whose model has ``forward_sequence`` (the zoo's, behind a
    multi-input encoder or not: every step's encoder in one batch, the cell's steps fused;
    the same outputs to float rounding, many times faster on Pong's ``cnn-lstm``),
    :func:`~rlstruct.agent_replay.replay_agent` step by step for any other agent (a
    :class:`~rlstruct.checks.CheckDevice` around one included, so that its checks run)."""
    if (isinstance(agent, RecurrentAgent) and hasattr(agent.model, "forward_sequence")
            and trajectories.trajectories.n_timesteps() > 0):
        return agent.replay_sequence(trajectories)
    return replay_agent(agent, trajectories)


def _last_steps(steps: TemporalDictTensor) -> Tensor:
    t = torch.arange(steps.n_timesteps(), device=steps.lengths.device)
    return t == steps.lengths.unsqueeze(1) - 1


def bootstrap_steps(steps: TemporalDictTensor) -> Tensor:
    """``(B, T)`` bool: the steps whose next observation is not the next step's (an episode's
    end, a row's last valid step), where :func:`bootstrap_values` reads the state."""
    return steps[K.NEXT_TERMINATED] | steps[K.NEXT_TRUNCATED] | _last_steps(steps)


def bootstrap_values(model: nn.Module, traj: Trajectories, value: Tensor, h: Tensor) -> Tensor:
    """``V'`` ``(B, T)``: the value of each step's TRUE next observation, gradient-free.

    Inside an episode and a segment it is the next step's ``value``; where the next
    observation is not the next step's (an episode's end, a row's last step) the model values
    ``_observation/frame`` under ``h``, the state after the step. A terminated step's ``V'``
    is then masked by the returns' maths (``terminated`` stops the bootstrap).

    Args:
        model: a recurrent actor-critic with ``value(frame, h)``.
        traj: the trajectories ``(B, T, ...)``, with ``_observation/frame``.
        value: ``(B, T)`` values of the stored observations (stored or replayed).
        h: ``(B, T, S)`` the state after each step (stored ``action/h`` or replayed ``h``).
    """
    steps = traj.trajectories
    need = bootstrap_steps(steps)
    next_value = torch.cat([value[:, 1:], value[:, -1:]], 1).detach().clone()
    if bool(need.any()):
        with torch.no_grad():
            next_obs = model_input(steps, K.NEXT_OBSERVATION)[need]
            next_value[need] = model.value(next_obs, h[need]).to(value.dtype)
    return next_value
