"""Test helper agents (importable by every test file: ``from agents import ...``).

Every agent follows the :mod:`rlstruct.agent` contract and reads only ``observation["frame"]``
(any integer or float tensor ``(n, *feat)``; a counter env gives int64 ``(n, 3)``):

- :class:`DeterministicAgent`: memoryless; ``action = frame.reshape(n, -1).sum(-1) % n_actions``.
- :class:`RecurrentAgent`: state ``h`` float32 ``(n, k)``, reset where
  ``observation["initial_state"]``; the action depends on the whole episode so far.
- :class:`MLPAgent`: an ``nn.Module`` ``model``, actions sampled from a seeded
  ``torch.Generator``, greedy rows where ``agent_info["greedy"]`` is true.

All outputs are on the device of ``frame``; none of them allocate on another device.
:func:`collect_counter` is a reference acquisition loop over a synthetic counter env, for replay
tests.

Examples:
    >>> obs = DictTensor({"frame": torch.tensor([[0, 1, 2], [4, 0, 0]])})
    >>> action, state = DeterministicAgent(3)(DictTensor(batch_size=2), obs, DictTensor())
    >>> action["action"].tolist(), action["logits"].tolist()
    ([0, 1], [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlstruct import keys as K
from rlstruct.agent import Agent
from rlstruct.dicttensor import DeviceLike, DictTensor, masked_dicttensor
from rlstruct.temporal import TemporalDictTensor
from rlstruct.trajectories import Trajectories

__all__ = [
    "DeterministicAgent",
    "RecurrentAgent",
    "MLPAgent",
    "counter_observation",
    "collect_counter",
]


def _flat_frame(observation: DictTensor, key: str) -> torch.Tensor:
    frame = observation[key]
    return frame.reshape(frame.shape[0], -1)


class DeterministicAgent(Agent):
    """Memoryless; the action is a pure function of the observation.

    ``action = frame.reshape(n, -1).sum(-1).long() % n_actions`` (int64 ``(n,)``; integer
    frames sum in int64) and ``logits = one_hot(action, n_actions)`` (float32
    ``(n, n_actions)``). State and ``agent_info`` are ignored; ``new_state`` is ``state``.
    Counts its calls in ``n_calls``.

    Args:
        n_actions: number of discrete actions.
        key: the observation key read (default ``"frame"``).
    """

    def __init__(self, n_actions: int = 3, key: str = K.FRAME) -> None:
        self.n_actions = n_actions
        self.key = key
        self.n_calls = 0

    def __call__(
        self,
        state: DictTensor,
        observation: DictTensor,
        agent_info: DictTensor,
    ) -> tuple[DictTensor, DictTensor]:
        self.n_calls += 1
        action = _flat_frame(observation, self.key).sum(-1).long() % self.n_actions
        logits = nn.functional.one_hot(action, self.n_actions).float()
        return DictTensor({"action": action, "logits": logits}), state


class RecurrentAgent(Agent):
    """Recurrent, exactly reproducible (integer-valued float32 arithmetic).

    State ``{"h": float32 (n, k)}``, zeros at start (:meth:`initial_state`, on ``self.device``).
    At each step, with ``x = frame.reshape(n, -1).sum(-1, keepdim=True).float()``:

    1. ``h = 0`` on the rows where ``observation["initial_state"]`` is true
       (``masked_dicttensor(state, initial_state(...), initial_state)``);
    2. ``h' = (3 * h + x + arange(k)) % 97``;
    3. ``action = h'.sum(-1).long() % n_actions`` (int64 ``(n,)``), plus ``logits =
       one_hot(action)`` float32 ``(n, n_actions)`` and ``h_sum = h'.sum(-1)`` float32 ``(n,)``.

    Returns ``({"action", "logits", "h_sum"}, {"h": h'})``. The action depends on every step of
    the episode so far, so a replay that does not carry or restore the state gets it wrong.

    Args:
        n_actions: number of discrete actions.
        k: width of the state.
        key: the observation key read (default ``"frame"``).
    """

    def __init__(self, n_actions: int = 3, k: int = 4, key: str = K.FRAME) -> None:
        self.n_actions = n_actions
        self.k = k
        self.key = key
        self.device = torch.device("cpu")

    def to(self, device: DeviceLike) -> RecurrentAgent:
        """Records ``device`` as the device of new states."""
        self.device = torch.device(device)
        return self

    def initial_state(self, agent_info: DictTensor, n: int) -> DictTensor:
        return DictTensor({"h": torch.zeros(n, self.k, device=self.device)})

    def __call__(
        self,
        state: DictTensor,
        observation: DictTensor,
        agent_info: DictTensor,
    ) -> tuple[DictTensor, DictTensor]:
        n = observation.n_elems()
        reset = observation[K.INITIAL_STATE]
        state = masked_dicttensor(state, self.initial_state(agent_info, n), reset)
        x = _flat_frame(observation, self.key).sum(-1, keepdim=True).float()
        steps = torch.arange(self.k, device=x.device, dtype=torch.float32)
        h = torch.remainder(3 * state["h"] + x + steps, 97.0)
        h_sum = h.sum(-1)
        action = h_sum.long() % self.n_actions
        logits = nn.functional.one_hot(action, self.n_actions).float()
        output = DictTensor({"action": action, "logits": logits, "h_sum": h_sum})
        return output, DictTensor({"h": h})


class MLPAgent(Agent):
    """A stochastic, memoryless policy with one ``nn.Module``, ``model`` (so the default
    ``update`` loads its ``state_dict``).

    - ``logits = model(frame.reshape(n, -1).float())``, ``model = Linear(obs_dim, hidden) ->
      Tanh -> Linear(hidden, n_actions)``, weights drawn under ``torch.manual_seed(init_seed)``
      without touching the global random state.
    - ``sampled = multinomial(softmax(logits), 1)`` drawn from ``self.generator``: a
      ``torch.Generator`` on the logits' device, seeded with the :meth:`seed` value (default
      0), re-created freshly seeded after ``seed()`` or when the device changes. One draw per
      row at every call, greedy or not, so greedy flags do not shift the random stream.
    - ``action = where(greedy, argmax(logits), sampled)`` with ``greedy =
      agent_info["greedy"]`` (bool ``(n,)``, moved to the logits' device) when present, else
      all false.

    Returns ``({"action": int64 (n,), "logits": float32 (n, n_actions)}, state)``; ``logits``
    carries gradients. Pickles with its generator's position.

    Args:
        obs_dim: number of elements of one row of ``frame``.
        n_actions: number of discrete actions.
        hidden: hidden width.
        init_seed: seed of the weight initialisation.
    """

    def __init__(
        self, obs_dim: int = 3, n_actions: int = 3, hidden: int = 16, init_seed: int = 0
    ) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            self.model = nn.Sequential(
                nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, n_actions)
            )
        self.n_actions = n_actions
        self._seed = 0
        self.generator: torch.Generator | None = None

    def seed(self, seed: int) -> None:
        """Seeds the sampling generator (a fresh one is made on the next call)."""
        self._seed = seed
        self.generator = None

    def _generator(self, device: torch.device) -> torch.Generator:
        if self.generator is None or self.generator.device != device:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(self._seed)
        return self.generator

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        if state["generator"] is not None:  # ship the stream position, not the object
            state["generator"] = (state["generator"].device, state["generator"].get_state())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        generator = state.pop("generator")
        vars(self).update(state)
        self.generator = None
        if generator is not None:
            device, rng_state = generator
            self.generator = torch.Generator(device=device)
            self.generator.set_state(rng_state)

    def __call__(
        self,
        state: DictTensor,
        observation: DictTensor,
        agent_info: DictTensor,
    ) -> tuple[DictTensor, DictTensor]:
        logits = self.model(_flat_frame(observation, K.FRAME).float())
        probs = torch.softmax(logits.detach(), -1)
        sampled = torch.multinomial(probs, 1, generator=self._generator(logits.device))
        action = sampled.squeeze(1)
        if "greedy" in agent_info:
            greedy = agent_info["greedy"].to(logits.device, torch.bool)
            action = torch.where(greedy, logits.detach().argmax(-1), action)
        return DictTensor({"action": action, "logits": logits}), state


# ---------------------------------------------------------------------------------- collection
def counter_observation(
    step: int, n: int, last_action: torch.Tensor | None = None, device: DeviceLike = "cpu"
) -> DictTensor:
    """The observation of a synthetic auto-reset counter env at global step ``step``.

    Row ``b`` plays episodes of length ``L_b = 2 + b % 4``; at step ``s`` it is in episode
    ``e = s // L_b`` at step ``k = s % L_b`` and shows ``frame = [b, e, k]`` (int64 ``(n, 3)``),
    ``initial_state = (k == 0)``, ``reward = k`` (float32), ``terminated = done =
    (k == L_b - 1)``, ``truncated = False``, ``env_step = k`` and ``last_action`` (int64, 0 at
    episode starts).
    """
    b = torch.arange(n, device=device)
    length = 2 + b % 4
    e, k = step // length, step % length
    first = k == 0
    if last_action is None:
        last_action = torch.zeros(n, dtype=torch.long, device=device)
    last_action = torch.where(first, torch.zeros_like(last_action), last_action)
    return DictTensor(
        {
            K.FRAME: torch.stack([b, e, k], -1),
            K.REWARD: k.float(),
            K.TERMINATED: k == length - 1,
            K.TRUNCATED: torch.zeros(n, dtype=torch.bool, device=device),
            K.DONE: k == length - 1,
            K.INITIAL_STATE: first,
            K.LAST_ACTION: last_action,
            K.ENV_STEP: k,
        }
    )


def collect_counter(
    agent: Agent,
    n: int = 4,
    n_steps: int = 6,
    n_segments: int = 1,
    agent_info: DictTensor | None = None,
    last_lengths: torch.Tensor | None = None,
    device: DeviceLike = "cpu",
) -> list[Trajectories]:
    """Runs ``agent`` on :func:`counter_observation` and records consecutive segments.

    Each segment is Trajectories with ``info`` = ``agent_info/*`` (if any), ``agent_state/*``
    (the state before its first step, if the agent has one) and ``env_id``, and steps
    ``observation/*`` and ``action/*`` ``(n, n_steps, ...)`` recorded under ``torch.no_grad``.
    Every segment is full except the last, whose lengths are ``last_lengths`` when given; its
    padding steps are then overwritten with garbage (``frame = 10**6``) after acquisition.
    """
    agent_info = agent_info if agent_info is not None else DictTensor(batch_size=n)
    state = agent.initial_state(agent_info.to(device), n)
    segments, step, last_action = [], 0, None
    for i in range(n_segments):
        info = agent_info.to(device).prepend_key(K.AGENT_INFO)
        info = info + state.detach().prepend_key(K.AGENT_STATE)
        info = info + DictTensor({K.ENV_ID: torch.arange(n, device=device)})
        observations, actions = [], []
        for _ in range(n_steps):
            obs = counter_observation(step, n, last_action, device)
            with torch.no_grad():
                action, state = agent(state, obs, agent_info)
            last_action = action["action"]
            observations.append(obs)
            actions.append(action)
            step += 1
        steps = DictTensor.stack(observations, 1).prepend_key(K.OBSERVATION) + DictTensor.stack(
            actions, 1
        ).prepend_key(K.ACTION)
        lengths = None
        if i == n_segments - 1 and last_lengths is not None:
            lengths = last_lengths.to(device)
            pad = torch.arange(n_steps, device=device)[None] >= lengths[:, None]
            steps[K.OBSERVATION + K.FRAME][pad] = 10**6
        segments.append(Trajectories(info, TemporalDictTensor(steps, lengths)))
    return segments
