"""Picklable factories for batcher tests (sent by value to spawned workers).

``counter_env(n_envs, seed, ...)`` builds counter envs whose observed ``env_id`` is the GLOBAL env
index the batcher gave them (recovered from the seed: a run seed ``s`` gives global env ``g`` the
seed ``s * 2**20 + g``), so every row of a batch says which env, episode and step it holds.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlstruct.agent import Agent
from rlstruct.batchers.seeding import SEED_BLOCK
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.debug import make_counter_env
from rlstruct.envs.gym import GymEnv, GymEnvInf


def counter_env(n_envs: int, seed: int, **kwargs: Any) -> GymEnv | GymEnvInf:
    """Counter envs with ``env_id`` = global env index (run seeds < 2**10 assumed)."""
    return make_counter_env(n_envs, seed, env_id_offset=seed % SEED_BLOCK, **kwargs)


class InfoAgent(Agent):
    """Memoryless agent whose action is the row's ``agent_info["a"]`` (0 when absent).

    Extra outputs: ``threads`` (the torch intra-op thread count of the process that ran it) and
    ``seen`` (the observed frame sum), so tests can see what ran where.
    """

    def __call__(
        self,
        state: DictTensor,
        observation: DictTensor,
        agent_info: DictTensor,
    ) -> tuple[DictTensor, DictTensor]:
        frame = observation["frame"]
        n = frame.shape[0]
        a = agent_info["a"].long() if "a" in agent_info else torch.zeros(n, dtype=torch.long)
        out = {
            "action": a.to(frame.device),
            "threads": torch.full((n,), torch.get_num_threads(), dtype=torch.long),
            "seen": frame.reshape(n, -1).sum(-1),
        }
        return DictTensor(out), state


class GreedyMLPAgent(Agent):
    """A linear policy over the counter frame; greedy (argmax) actions, so weights decide all."""

    def __init__(self, n_actions: int = 3) -> None:
        self.model = nn.Linear(3, n_actions)

    def __call__(
        self,
        state: DictTensor,
        observation: DictTensor,
        agent_info: DictTensor,
    ) -> tuple[DictTensor, DictTensor]:
        logits = self.model(observation["frame"].float())
        return DictTensor({"action": logits.argmax(-1), "logits": logits}), state


def cartpole_env(n_envs: int, seed: int, auto_reset: bool = True) -> GymEnv | GymEnvInf:
    """``n_envs`` CartPole-v1 envs."""
    return (GymEnvInf if auto_reset else GymEnv)("CartPole-v1", n_envs=n_envs, seed=seed)


class DriftingAgent(Agent):
    """Misbehaves from its ``at``-th call on: ``how="dtype"`` returns its ``extra`` output as
    float64 instead of float32, ``"key"`` adds a key, ``"rows"`` returns one row too many (tests
    that the batcher never casts or guesses)."""

    def __init__(self, at: int = 2, how: str = "dtype") -> None:
        self.at, self.how, self.calls = at, how, 0

    def __call__(
        self,
        state: DictTensor,
        observation: DictTensor,
        agent_info: DictTensor,
    ) -> tuple[DictTensor, DictTensor]:
        n = observation["frame"].shape[0]
        action = {"action": torch.zeros(n, dtype=torch.long), "extra": torch.zeros(n)}
        if self.calls >= self.at:
            if self.how == "dtype":
                action["extra"] = action["extra"].double()
            elif self.how == "key":
                action["more"] = torch.zeros(n)
            else:
                action = {k: torch.cat([v, v[:1]]) for k, v in action.items()}
        self.calls += 1
        return DictTensor(action), state


class MetaActionAgent(Agent):
    """Returns its action on the ``meta`` device: a planted device-contract breach."""

    def __init__(self, n_actions: int = 2) -> None:
        self.n_actions = n_actions

    def __call__(
        self,
        state: DictTensor,
        observation: DictTensor,
        agent_info: DictTensor,
    ) -> tuple[DictTensor, DictTensor]:
        n = observation["frame"].shape[0]
        return DictTensor({"action": torch.zeros(n, dtype=torch.long, device="meta")}), state


class SleepyAgent(Agent):
    """Sleeps ``seconds`` in its ``at``-th call (a hung agent)."""

    def __init__(self, at: int = 1, seconds: float = 3600.0) -> None:
        self.at, self.seconds, self.calls = at, seconds, 0

    def __call__(
        self,
        state: DictTensor,
        observation: DictTensor,
        agent_info: DictTensor,
    ) -> tuple[DictTensor, DictTensor]:
        import time

        if self.calls == self.at:
            time.sleep(self.seconds)
        self.calls += 1
        n = observation["frame"].shape[0]
        return DictTensor({"action": torch.zeros(n, dtype=torch.long)}), state
