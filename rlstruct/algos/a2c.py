"""A2C with GAE(lambda) on auto-reset segments; ``--recurrent`` gives the policy a GRU memory.

One iteration:

1. **Collect**: the training batcher steps ``B = n_processes * n_envs`` auto-reset envs
   (``GymEnvInf``) for ``T`` steps. The agent stores the env's ``action``, the policy head's
   unclipped ``sample`` (``rlstruct.blocks.distributions``: softmax for Discrete, a Gaussian
   rescaled and clipped into a Box), the head ``params`` and ``value``; a recurrent agent
   carries ``h`` in its state, resets it where ``observation["initial_state"]`` is true, and the
   batcher records the state at the segment start in ``info["agent_state/h"]``.
2. **Replay** the agent on the learner device, with gradients: ``replay_agent`` for the GRU
   policy, from the stored ``agent_state/h`` (the memory of an episode begun in an earlier
   segment is restored exactly); ``replay_agent_stateless`` (one batched call) otherwise.
3. **One gradient step** on ``-logp(a) A + vf_coef (V - R)^2 - ent_coef H`` with GAE(lambda)
   advantages ``A`` and returns ``R``. ``V'`` of the TRUE next observations
   (``_observation/frame``) comes from one gradient-free call (for the GRU from the state after
   each step): terminated steps do not bootstrap, truncated steps and segment cuts do.
4. **Publish**: ``run.publish``. With ``--pipeline 2`` the workers already collect the next
   segment while the learner learns on this one (one update of policy lag).

Run: ``python -m rlstruct.algos.a2c --help``; ``python -m rlstruct.algos.a2c --recurrent``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch
from gymnasium.spaces import Space
from torch import Tensor, nn

from rlstruct import Agent, DictTensor, TemporalDictTensor, Trajectories, masked_dicttensor
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.agent_replay import replay_agent, replay_agent_stateless
from rlstruct.blocks.distributions import ActionHead, make_head, space_from_spec, space_spec
from rlstruct.blocks.nets import HeadActorCritic, linear
from rlstruct.blocks.optim import Optimizer, adam, gradient_step
from rlstruct.blocks.sampling import HeadSampler, greedy_info
from rlstruct.envs import GymEnvInf
from rlstruct.runs.resolve import Resolved, run_cli
from rlstruct.runs.run import Run, RunConfig


@dataclass
class Config(RunConfig):
    """A2C with GAE on auto-reset segments; defaults tuned for CartPole-v1 (rlstruct train a2c)."""
    learner_ranks: ClassVar[bool] = True  # --n-learners: Run.learner_group
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
class MLPActorCritic(HeadActorCritic):
    """Memoryless, separate actor and critic, the actor ending in the action space's policy head
    (rlstruct/blocks/nets.py): ``forward(frame, None) -> (params, value, None)``."""

    def __init__(self, obs_dim: int, action_space: Space | dict, hidden: int) -> None:
        super().__init__(obs_dim, make_head(space_from_spec(action_space), hidden), hidden)

    def forward(self, frame: Tensor, h: Tensor | None) -> tuple[Tensor, Tensor, None]:
        return (*super().forward(frame), None)


class GRUNet(nn.Module):
    """tanh encoder ``x`` -> GRU cell ``h'`` -> ``out`` over ``[x, h']`` (the skip gives the
    output the current observation directly; the memory adds what the past tells)."""

    def __init__(self, obs_dim: int, hidden: int, out: nn.Module) -> None:
        super().__init__()
        self.encoder = nn.Sequential(linear(obs_dim, hidden, math.sqrt(2)), nn.Tanh())
        self.gru = nn.GRUCell(hidden, hidden)
        self.head = out

    def forward(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        x = self.encoder(x)
        h = self.gru(x, h)
        return self.head(torch.cat([x, h], -1)), h


class GRUActorCritic(nn.Module):
    """Recurrent: a GRU actor (ending in the policy head) and a GRU critic; the state ``h`` holds
    both memories side by side (a shared torso would let the value loss's gradients drown the
    policy's). ``forward(frame, h (n, 2 hidden)) -> (params (n, P), value (n,), h')``."""

    def __init__(self, obs_dim: int, action_space: Space | dict, hidden: int) -> None:
        super().__init__()
        self.state_size = 2 * hidden
        self.actor = GRUNet(obs_dim, hidden, make_head(space_from_spec(action_space), 2 * hidden))
        self.critic = GRUNet(obs_dim, hidden, linear(2 * hidden, 1, 1.0))

    @property
    def head(self) -> ActionHead:
        return self.actor.head

    def forward(self, frame: Tensor, h: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        x = frame.flatten(1).float()
        h_actor, h_critic = h.chunk(2, -1)
        params, h_actor = self.actor(x, h_actor)
        value, h_critic = self.critic(x, h_critic)
        return params, value.squeeze(-1), torch.cat([h_actor, h_critic], -1)


# --------------------------------------------------------------------------------------- agent
class A2CAgent(Agent):
    """Samples from the model's policy head (its greedy action on rows with
    ``agent_info["greedy"]``) and returns the env's ``action``, the head's unclipped ``sample``,
    the head ``params`` and ``value``.

    With a ``GRUActorCritic`` the state is ``{"h": (n, 2 hidden)}``, zeros at an episode start.
    ``call_replay`` (used by ``replay_agent`` / ``replay_agent_stateless`` on the learner)
    samples nothing: it returns the differentiable ``params`` and ``value`` of the stored
    observations, plus ``h``, the state after the step (to value the next observation).
    """

    def __init__(self, model: MLPActorCritic | GRUActorCritic) -> None:
        self.model = model
        self.recurrent = isinstance(model, GRUActorCritic)
        self.sample = HeadSampler()

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
        """``(params, value, new_state)``; a recurrent state restarts at episode starts."""
        if not self.recurrent:
            params, value, _ = self.model(observation[K.FRAME], None)
            return params, value, state
        fresh = self.initial_state(DictTensor(), observation.n_elems())
        state = masked_dicttensor(state, fresh, observation[K.INITIAL_STATE])
        params, value, h = self.model(observation[K.FRAME], state["h"])
        return params, value, DictTensor({"h": h})

    def __call__(
        self, state: DictTensor, observation: DictTensor, agent_info: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        params, value, new_state = self._step(state, observation)
        sample, action = self.sample(self.model.head, params, agent_info)
        out = {K.ACTION_KEY: action, K.SAMPLE: sample, "params": params, K.VALUE: value}
        return DictTensor(out), new_state

    def call_replay(
        self, trajectories: Trajectories, t: int, state: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        observation = trajectories.trajectories.get([K.OBS_FRAME, K.OBS_INITIAL_STATE])
        observation = observation.temporal_index(t).truncate_key(K.OBSERVATION)
        params, value, new_state = self._step(state, observation)
        out = DictTensor({"params": params, K.VALUE: value})
        return (out + new_state if self.recurrent else out), new_state


# --------------------------------------------------------------------------------------- loss
def replay(agent: Agent, traj: Trajectories) -> TemporalDictTensor:
    """The agent's outputs ``(B, T, ...)`` with gradients (a recurrent one from agent_state)."""
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
    head: ActionHead, params: Tensor, value: Tensor, next_value: Tensor, traj: Trajectories,
    cfg: Config,
) -> tuple[Tensor, dict[str, float]]:
    """The A2C loss over ``(B, T)`` steps (padding ignored) from the policy ``head``, its
    ``params (B, T, P)`` and ``value (B, T)`` of the stored observations (with gradients) and
    ``next_value (B, T)`` of the true next ones (none); ``(loss, stats)``: ``loss``,
    ``policy_loss``, ``value_loss``, ``entropy``."""
    steps, mask = traj.trajectories, traj.trajectories.mask()
    advantage, returns = F.gae(
        steps[K.NEXT_REWARD], value.detach(), next_value, steps[K.NEXT_TERMINATED],
        steps[K.NEXT_TRUNCATED], steps.lengths, cfg.gamma, cfg.gae_lambda,
    )
    if cfg.normalize_advantages:  # over the valid steps: the step size ignores the reward scale
        advantage = F.normalize_advantages(advantage, mask)
    logp = head.log_prob(params, steps[K.STORED_SAMPLE])
    policy_loss = -F.masked_mean(logp * advantage, mask)
    value_loss = F.masked_mean((value - returns) ** 2, mask)
    entropy = F.masked_mean(head.entropy(params), mask)
    loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
    stats = {"loss": loss, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy}
    return loss, {k: float(v.detach()) for k, v in stats.items()}


def learn(agent: A2CAgent, optimizer: Optimizer, traj: Trajectories, cfg: Config,
          step: Any = gradient_step) -> dict[str, float]:
    """Replay, the loss, one gradient step (``step`` averages it over --n-learners ranks)."""
    out = replay(agent, traj)
    loss, stats = a2c_loss(agent.model.head, out["params"], out[K.VALUE],
                           next_values(agent.model, traj, out), traj, cfg)
    step(optimizer, loss, cfg.max_grad_norm)
    return stats


# --------------------------------------------------------------------------------------- main
def main(cfg: Config | Resolved[Config]) -> dict[str, Any]:
    """Trains until the target return, ``max_frames`` or ``time_budget``; returns the summary."""
    with Run("a2c", cfg) as run:
        cfg = run.cfg  # resolved: the layout file applied, --resume auto picked
        net = GRUActorCritic if cfg.recurrent else MLPActorCritic
        make_model = partial(net, run.obs_dim, space_spec(run.action_space), cfg.hidden)
        model = run.model(make_model)  # on the CPU: the batchers copy it
        batcher = run.training_batcher(A2CAgent, {"model": model}, GymEnvInf, cfg.n_timesteps)
        run.evaluator(A2CAgent, {"model": model}, agent_info=greedy_info())
        group = run.learner_group(make_model, model, partial(adam, lr=cfg.lr), learn, A2CAgent)
        # 1. Each segment the workers collected with the current policy, until the stop test.
        for traj in run.segments(batcher):
            # 2-3. Replay on the learner device, one gradient step (--n-learners: on N ranks).
            stats = group.learn(traj)
            weights = group.state_dict()
            # 4. Publish the weights; the workers collect the next segment meanwhile.
            run.publish(batcher, weights)
            run.end_iteration(weights, lr=cfg.lr, **stats)
    return run.summary


if __name__ == "__main__":
    run_cli(main, Config, prog="python -m rlstruct.algos.a2c")
