"""A2C with GAE(lambda) on auto-reset segments; ``--recurrent`` gives the policy a GRU memory.

One iteration:

1. **Collect**: the training batcher steps ``B = n_processes * n_envs`` auto-reset envs
   (``GymEnvInf``) for ``T`` steps. The agent stores ``action``, ``logits`` and ``value``; a
   recurrent agent carries ``h`` in its state, resets it where ``observation["initial_state"]``
   is true, and the batcher records the state at the segment start in ``info["agent_state/h"]``.
2. **Replay** the agent on the learner device, with gradients: ``replay_agent`` for the GRU
   policy, from the stored ``agent_state/h`` (the memory of an episode begun in an earlier
   segment is restored exactly); ``replay_agent_stateless`` (one batched call) otherwise.
3. **One gradient step** on ``-logp(a) A + vf_coef (V - R)^2 - ent_coef H`` with GAE(lambda)
   advantages ``A`` and returns ``R``. ``V'`` of the TRUE next observations
   (``_observation/frame``) comes from one batched, gradient-free call (for the GRU policy from
   the state after each step): terminated steps do not bootstrap, truncated steps and segment
   cuts bootstrap from ``V'``.
4. **Publish**: ``run.publish`` (``batcher.update(state_dict)``, then ``execute()``). With
   ``--pipeline 2`` the workers already collect the next segment while the learner learns on
   this one (one update of policy lag).

Run: ``python -m algos.a2c --help``; ``python -m algos.a2c --recurrent``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import tyro
from torch import Tensor, nn

from rlstruct import Agent, DictTensor, TemporalDictTensor, Trajectories, masked_dicttensor
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.envs import GymEnvInf
from rlstruct.nets import linear, mlp
from rlstruct.optim import adam, gradient_step
from rlstruct.replay import replay_agent, replay_agent_stateless
from rlstruct.run import Run, RunConfig
from rlstruct.sampling import (
    CategoricalSampler,
    categorical_entropy,
    categorical_log_prob,
    greedy_info,
)


@dataclass
class Config(RunConfig):
    """A2C with GAE on auto-reset segments (see algos/a2c.py); defaults tuned for CartPole-v1."""

    eval_every: int = 50
    checkpoint_every: int = 200
    lr: float = 4e-3
    recurrent: bool = False
    """GRU policy: memory in the agent state, replayed from info["agent_state/h"]"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    vf_coef: float = 0.5
    """weight of the value loss"""
    ent_coef: float = 0.0
    """weight of the entropy bonus"""
    normalize_advantages: bool = True
    """normalise advantages over the batch's valid steps (mean 0, std 1)"""


# --------------------------------------------------------------------------------------- model
class MLPActorCritic(nn.Module):
    """Memoryless, separate actor and critic: ``forward(frame, None) -> (logits, value, None)``."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.actor = mlp(obs_dim, hidden, n_actions, out_gain=0.01)
        self.critic = mlp(obs_dim, hidden, 1, out_gain=1.0)

    def forward(self, frame: Tensor, h: Tensor | None) -> tuple[Tensor, Tensor, None]:
        x = frame.flatten(1).float()
        return self.actor(x), self.critic(x).squeeze(-1), None


class GRUNet(nn.Module):
    """tanh encoder ``x`` -> GRU cell ``h'`` -> linear head over ``[x, h']`` (the skip gives the
    head the current observation directly; the memory adds what the past tells)."""

    def __init__(self, obs_dim: int, hidden: int, n_out: int, out_gain: float) -> None:
        super().__init__()
        self.encoder = nn.Sequential(linear(obs_dim, hidden, math.sqrt(2)), nn.Tanh())
        self.gru = nn.GRUCell(hidden, hidden)
        self.head = linear(2 * hidden, n_out, out_gain)

    def forward(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        x = self.encoder(x)
        h = self.gru(x, h)
        return self.head(torch.cat([x, h], -1)), h


class GRUActorCritic(nn.Module):
    """Recurrent: a GRU actor and a GRU critic; the state ``h`` holds both memories side by side
    (a shared torso would let the value loss's gradients drown the policy's).
    ``forward(frame, h (n, 2 hidden)) -> (logits (n, A), value (n,), h' (n, 2 hidden))``."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.state_size = 2 * hidden
        self.actor = GRUNet(obs_dim, hidden, n_actions, out_gain=0.01)
        self.critic = GRUNet(obs_dim, hidden, 1, out_gain=1.0)

    def forward(self, frame: Tensor, h: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        x = frame.flatten(1).float()
        h_actor, h_critic = h.chunk(2, -1)
        logits, h_actor = self.actor(x, h_actor)
        value, h_critic = self.critic(x, h_critic)
        return logits, value.squeeze(-1), torch.cat([h_actor, h_critic], -1)


# --------------------------------------------------------------------------------------- agent
class A2CAgent(Agent):
    """Samples ``a ~ softmax(logits)`` (the argmax on rows with ``agent_info["greedy"]``) and
    returns ``action``, ``logits`` and ``value``.

    With a ``GRUActorCritic`` the state is ``{"h": (n, 2 hidden)}``, zeros at an episode start.
    ``call_replay`` (used by ``replay_agent`` / ``replay_agent_stateless`` on the learner)
    samples nothing: it returns the differentiable ``logits`` and ``value`` of the stored
    observations, plus ``h``, the state after the step (to value the next observation).
    """

    def __init__(self, model: MLPActorCritic | GRUActorCritic) -> None:
        self.model = model
        self.recurrent = isinstance(model, GRUActorCritic)
        self.sample = CategoricalSampler()

    def seed(self, seed: int) -> None:
        self.sample.seed(seed)

    def initial_state(self, agent_info: DictTensor, n: int) -> DictTensor:
        if not self.recurrent:
            return DictTensor(batch_size=n)
        weight = next(self.model.parameters())
        return DictTensor({"h": weight.new_zeros(n, self.model.state_size)})

    def _step(
        self, state: DictTensor, observation: DictTensor
    ) -> tuple[Tensor, Tensor, DictTensor]:
        """``(logits, value, new_state)``; a recurrent state restarts at episode starts."""
        if not self.recurrent:
            logits, value, _ = self.model(observation[K.FRAME], None)
            return logits, value, state
        fresh = self.initial_state(DictTensor(), observation.n_elems())
        state = masked_dicttensor(state, fresh, observation[K.INITIAL_STATE])
        logits, value, h = self.model(observation[K.FRAME], state["h"])
        return logits, value, DictTensor({"h": h})

    def __call__(
        self, state: DictTensor, observation: DictTensor, agent_info: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        logits, value, new_state = self._step(state, observation)
        action = self.sample(logits, agent_info)
        return DictTensor({K.ACTION_KEY: action, "logits": logits, "value": value}), new_state

    def call_replay(
        self, trajectories: Trajectories, t: int, state: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        observation = trajectories.trajectories.get([K.OBS_FRAME, K.OBS_INITIAL_STATE])
        observation = observation.temporal_index(t).truncate_key(K.OBSERVATION)
        logits, value, new_state = self._step(state, observation)
        out = DictTensor({"logits": logits, "value": value})
        return (out + new_state if self.recurrent else out), new_state


# --------------------------------------------------------------------------------------- loss
def replay(agent: Agent, traj: Trajectories) -> TemporalDictTensor:
    """The agent's outputs ``(B, T, ...)`` over a segment, with gradients: step by step from
    the stored ``agent_state`` for a recurrent agent, in one batched call otherwise."""
    return (replay_agent if agent.recurrent else replay_agent_stateless)(agent, traj)


def next_values(model: nn.Module, traj: Trajectories, out: TemporalDictTensor) -> Tensor:
    """``V'`` ``(B, T)`` of the TRUE next observations, in one gradient-free batched call; a
    recurrent model reads them from the state after each step (``out["h"]``)."""
    next_frame = traj.trajectories[K.NEXT_FRAME]
    with torch.no_grad():
        h = out["h"].flatten(0, 1) if "h" in out else None
        _, value, _ = model(next_frame.flatten(0, 1), h)
    return value.view(next_frame.shape[:2])


def a2c_loss(
    logits: Tensor, value: Tensor, next_value: Tensor, traj: Trajectories, cfg: Config
) -> tuple[Tensor, dict[str, float]]:
    """The A2C loss over ``(B, T)`` steps (padding ignored) from ``logits (B, T, A)`` and
    ``value (B, T)`` of the stored observations (with gradients) and ``next_value (B, T)`` of the
    true next ones (none); ``(loss, stats)``: ``loss``, ``policy_loss``, ``value_loss``,
    ``entropy``."""
    steps, mask = traj.trajectories, traj.trajectories.mask()
    advantage, returns = F.gae(
        steps[K.NEXT_REWARD], value.detach(), next_value, steps[K.NEXT_TERMINATED],
        steps[K.NEXT_TRUNCATED], steps.lengths, cfg.gamma, cfg.gae_lambda,
    )
    if cfg.normalize_advantages:  # over the valid steps: the step size ignores the reward scale
        advantage = F.normalize_advantages(advantage, mask)
    logp = categorical_log_prob(logits, steps[K.STORED_ACTION])
    policy_loss = -F.masked_mean(logp * advantage, mask)
    value_loss = F.masked_mean((value - returns) ** 2, mask)
    entropy = F.masked_mean(categorical_entropy(logits), mask)
    loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
    stats = {"loss": loss, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy}
    return loss, {k: float(v.detach()) for k, v in stats.items()}


def learn(agent: A2CAgent, optimizer: torch.optim.Optimizer, traj: Trajectories, cfg: Config,
          step: Any = gradient_step) -> dict[str, float]:
    """Replay, the loss, one gradient step (``step`` averages it over --n-learners ranks)."""
    out = replay(agent, traj)
    loss, stats = a2c_loss(out["logits"], out["value"], next_values(agent.model, traj, out),
                           traj, cfg)
    step(optimizer, loss, cfg.max_grad_norm)
    return stats


# --------------------------------------------------------------------------------------- main
def main(cfg: Config) -> dict[str, Any]:
    """Trains until the target return, ``max_frames`` or ``time_budget``; returns the summary."""
    with Run("a2c", cfg) as run:
        net = GRUActorCritic if cfg.recurrent else MLPActorCritic
        make_model = partial(net, run.obs_dim, run.n_actions, cfg.hidden)
        model = make_model()  # on the CPU: the batchers copy it
        batcher = run.training_batcher(A2CAgent, {"model": model}, GymEnvInf, cfg.n_timesteps)
        run.evaluator(A2CAgent, {"model": model}, agent_info=greedy_info())
        agent = run.learner(A2CAgent(model))
        optimizer = adam(model.parameters(), cfg.lr, run.device)
        run.checkpoint_state(model=model, optimizer=optimizer)
        group = run.learner_group(make_model, model, partial(adam, lr=cfg.lr), learn, A2CAgent)
        # 1. Each segment the workers collected with the current policy, until the stop test.
        for traj in run.segments(batcher):
            # 2-3. Replay on the learner device, one gradient step (--n-learners: on N ranks).
            stats = (learn(agent, optimizer, traj.to(run.device), cfg) if group is None
                     else group.learn(traj))
            weights = model.state_dict() if group is None else group.state_dict()
            # 4. Publish the weights; the workers collect the next segment meanwhile.
            run.publish(batcher, weights)
            run.end_iteration(weights, lr=cfg.lr, **stats)
    return run.summary


if __name__ == "__main__":
    main(tyro.cli(Config))
