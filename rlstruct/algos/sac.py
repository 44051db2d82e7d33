"""SAC (Haarnoja et al., 2018, "Soft Actor-Critic Algorithms and Applications") on Box actions.

Each iteration stores a segment of ``B x T`` steps in a ``ReplayBuffer``, takes ``utd``
gradient steps per collected frame on uniform buffer samples, then publishes the weights, which
act from the next segment on (``--pipeline 2``: the one after, a worker collecting meanwhile). With
``u ~ N(mu(s), sigma(s))``, ``a = tanh(u)`` in (-1, 1) (rescaled to the Box for the env) and
``log pi(a|s) = log N(u) - sum log(1 - tanh(u)^2)``:

    y        = r + gamma (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s')),  a' ~ pi(s')
    L_Q      = 1/2 sum_i mean (Q_i(s, a) - y)^2                (twin critics, targets Q'_i)
    L_pi     = mean (alpha log pi(a~|s) - min_i Q_i(s, a~)),  a~ ~ pi(s)  (reparameterised)
    L_alpha  = -mean log(alpha) (log pi(a~|s) + H_target),   H_target = -dim(A)
    Q'_i    <- tau Q_i + (1 - tau) Q'_i                        (Polyak, after every step)

Speed: ONE fused Adam step; twin critics batched; no graph at s'; ``--concurrent-losses``: L_Q
and L_pi + L_alpha back-propagated at once on 2 threads. Truncated steps bootstrap from the TRUE
final observation. Dict obs: multi-input encoders.
``--n-learners N``: ``k`` samples and noise per batch, 1/N of the rows per rank (``-h``).
"""

from __future__ import annotations

import copy
import math
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, Any, ClassVar

import torch
import tyro
from torch import Tensor, nn

from rlstruct import Agent, DictTensor
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.algos.presets import SAC_PRESETS
from rlstruct.blocks.distributions import make_head, space_from_spec, space_spec
from rlstruct.blocks.nets import TwinQ
from rlstruct.blocks.obs_input import expand_inputs, model_input
from rlstruct.blocks.optim import adam, concurrent_step, gradient_step, polyak
from rlstruct.blocks.replay_buffer import ReplayBuffer, ReplayCheckpoint, replay_memory_problems
from rlstruct.blocks.sampling import HeadSampler, greedy_info
from rlstruct.envs import GymEnvInf
from rlstruct.runs.groups import local_learner
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import Resolved, run_cli
from rlstruct.runs.run import Run, RunConfig

SQUASHED = "squashed"  # the agent's tanh(u): the critics read actions in (-1, 1)
STORED_SQUASHED = K.ACTION + SQUASHED
STORED_KEYS = (K.OBS_FRAME, STORED_SQUASHED, K.NEXT_FRAME, K.NEXT_REWARD, K.NEXT_TERMINATED,
               K.NEXT_TRUNCATED)


@dataclass
class Config(RunConfig, ReplayCheckpoint):
    """SAC with twin critics, Polyak targets and automatic temperature (rlstruct train sac); the
    defaults solve Pendulum-v1 in 6-7k frames, a step per frame, 4 envs in this process."""
    presets = SAC_PRESETS  # --preset NAME: rlstruct/algos/presets.py
    action_spaces: ClassVar[tuple[str, ...]] = ("Box",)
    splits_rows: ClassVar[bool] = False  # the ranks split the samples' rows
    learner_ranks: ClassVar[bool] = True  # --n-learners: Run.learner_group
    resumable: ClassVar[tuple[str, ...]] = ("concurrent_losses",)  # speed, not what is learned
    env_id: str = "Pendulum-v1"
    target_return: float | None = -200.0
    n_timesteps: int = 8
    hidden: int = 64
    lr: float = 3e-3
    max_grad_norm: float = 0.0
    eval_every: int = 100
    buffer_size: int = 300_000
    """replay buffer capacity (transitions)"""
    batch_size: int = 128
    """transitions per gradient step"""
    learning_starts: int = 500
    """frames collected before the first gradient step"""
    utd: float = 1.0
    """update-to-data ratio: gradient steps per collected frame (fractions carry over)"""
    tau: float = 0.01
    """Polyak rate of the target critics"""
    init_alpha: float = 1.0
    """initial entropy temperature (then tuned towards the target entropy)"""
    target_entropy: float | None = None
    """entropy target of the temperature loss (None: -dim(A))"""
    concurrent_losses: bool = False
    """L_Q and L_pi + L_alpha back-propagated at once, on 2 threads (a CPU learner, n_threads>1)"""
    layout: Annotated[LayoutConfig, tyro.conf.OmitArgPrefixes] = field(
        default_factory=lambda: LayoutConfig(n_processes=1, n_envs=4))
    """where each part runs (default: the 4 envs in this process)"""

    def world_problems(self, obs_shape: tuple[int, ...], action_space: Any) -> list[str]:
        return replay_memory_problems(self.buffer_size, obs_shape, 4, math.prod(action_space.shape))

    def problems(self) -> list[str]:
        problems = super().problems() + [f"{k} must be > 0, got {getattr(self, k)}" for k in
                    ("buffer_size", "batch_size", "utd", "init_alpha") if getattr(self, k) <= 0]
        problems += [] if 0 < self.tau <= 1 else [f"tau must be in (0, 1], got {self.tau}"]
        return problems + ([f"batch_size ({self.batch_size}) must be a multiple of n_learners "
                            f"({self.layout.n_learners}): each rank learns on 1/N of the rows"]
                           if self.batch_size % self.layout.n_learners else [])


class Actor(nn.Module):
    """``s -> params``: a two-layer ReLU body and the library's tanh-squashed Gaussian head."""

    def __init__(self, obs_dim: int, action_space: dict, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(),
                                  nn.Linear(hidden, hidden), nn.ReLU())
        self.head = make_head(space_from_spec(action_space), hidden, squash=True)

    def forward(self, frame: Tensor) -> Tensor:
        return self.head(self.body(frame.flatten(1).float()))


def sac_nets(make_actor: Any, make_critic: Any, init_alpha: float,
             actor: nn.Module | None = None) -> nn.ModuleDict:
    """All SAC learns, one module (a learner rank's replica): actor, critic, target, temperature."""
    actor, critic = actor or make_actor(), make_critic()  # Run.factory's: picklable for ranks
    return nn.ModuleDict({"actor": actor, "critic": critic,
                          "target": copy.deepcopy(critic).requires_grad_(False),
                          "temperature": nn.ParameterDict({"log_alpha": torch.tensor(
                              math.log(init_alpha))})})


class SACAgent(Agent):
    """Samples ``u ~ N(mu(s), sigma(s))`` with a seeded ``HeadSampler`` (``u = mu`` where
    ``agent_info["greedy"]``); returns the env's ``action`` and ``squashed = tanh(u)``."""

    def __init__(self, model: Actor) -> None:
        self.model, self.sample = model, HeadSampler()

    def seed(self, seed: int) -> None:
        self.sample.seed(seed)

    def __call__(self, state: DictTensor, observation: DictTensor,
                 agent_info: DictTensor) -> tuple[DictTensor, DictTensor]:
        u, action = self.sample(self.model.head, self.model(model_input(observation)), agent_info)
        return DictTensor({K.ACTION_KEY: action, SQUASHED: self.model.head.squash(u)}), state


def soft_target(reward: Tensor, terminated: Tensor, truncated: Tensor, next_q: Tensor,
                next_logp: Tensor, alpha: Tensor | float, gamma: float) -> Tensor:
    """``y = r + gamma (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s'))``, ``(N,)``:
    ``reward``, ``terminated``, ``truncated``, ``next_logp`` are ``(N,)``; ``next_q`` ``(2, N)``
    holds the target critics at ``(s', a')``, ``a' ~ pi(s')``."""
    next_value = next_q.min(0).values - alpha * next_logp
    return F.td_targets(reward[:, None], next_value[:, None], terminated[:, None],
                        truncated[:, None], gamma).squeeze(1)


def critic_loss(q: Tensor, target: Tensor) -> Tensor:
    """``L_Q`` from ``q`` ``(2, N)``, the critics at the stored ``(s, a)``, and targets ``(N,)``."""
    return 0.5 * (q - target).pow(2).mean(1).sum()


def policy_losses(q_pi: Tensor, logp: Tensor, log_alpha: Tensor,
                  target_entropy: float) -> tuple[Tensor, dict[str, Tensor]]:
    """``(L_pi + L_alpha, stats)`` (module docstring; stats: 0-d tensors, no host sync) from
    ``q_pi`` ``(2, N)``, the critics through detached weights at ``(s, a~)``; ``logp`` ``(N,)``,
    ``log pi(a~|s)`` (reparameterised); ``log_alpha`` 0-d."""
    alpha = log_alpha.exp().detach()
    actor = (alpha * logp - q_pi.min(0).values).mean()
    temperature = -(log_alpha * (logp.detach() + target_entropy)).mean()
    return actor + temperature, {"actor_loss": actor.detach(), "alpha": alpha,
                                 "entropy": -logp.detach().mean()}


def _rsample(actor: nn.Module, frame: Any, noise: Tensor) -> tuple[Tensor, Tensor]:
    mean, log_std = actor.head.split(params := actor(frame))  # the whole actor: Dict obs too
    u = mean + log_std.exp() * noise  # (log pi(a|s), a = tanh(u)): (N,) and (N, D)
    return actor.head.log_prob(params, u), actor.head.squash(u)


def learn(nets: nn.ModuleDict, optimizer: torch.optim.Optimizer, sample: DictTensor, cfg: Config,
          step: Any = gradient_step, pool: Executor | None = None) -> dict[str, Tensor]:
    """One gradient step on a buffer sample (all three losses), then the Polyak update; noise:
    torch's global RNG, or the sample's ``noise`` (ranks). ``pool``: L_Q and L_pi + L_alpha at
    once (:func:`~rlstruct.blocks.optim.concurrent_step`: the same gradients)."""
    actor, critic, log_alpha = nets.actor, nets.critic, nets.temperature["log_alpha"]
    frame, next_frame = model_input(sample, K.OBSERVATION), model_input(sample, K.NEXT_OBSERVATION)
    n, d = sample.n_elems(), actor.head.n_dims  # noise (2n, D): s, then s'
    noise = (sample["noise"].transpose(0, 1).flatten(0, 1) if "noise" in sample
             else torch.randn(2 * n, d, device=log_alpha.device))

    def critic_part() -> tuple[Tensor, dict[str, Tensor]]:  # no graph at s': backward over s
        with torch.no_grad():
            next_logp, next_squashed = _rsample(actor, next_frame, noise[n:])
            y = soft_target(sample[K.NEXT_REWARD], sample[K.NEXT_TERMINATED],
                            sample[K.NEXT_TRUNCATED], nets.target(next_frame, next_squashed),
                            next_logp, log_alpha.exp(), cfg.gamma)
        loss = critic_loss(q := critic(frame, sample[STORED_SQUASHED]), y)
        return loss, {"critic_loss": loss.detach(), "q": q.detach().mean()}

    def policy_part() -> tuple[Tensor, dict[str, Tensor]]:  # the critics' weights detached
        logp, squashed = _rsample(actor, frame, noise[:n])
        return policy_losses(critic(frame, squashed, frozen=True), logp, log_alpha,
                             -d if cfg.target_entropy is None else cfg.target_entropy)
    if pool is None:  # one backward through the sum (ranks: ``step`` all-reduces its gradients)
        (loss_q, stats_q), (loss_pi, stats_pi) = critic_part(), policy_part()
        step(optimizer, loss_q + loss_pi, cfg.max_grad_norm)
    else:
        stats_q, stats_pi = concurrent_step(optimizer, [critic_part, policy_part], pool,
                                            cfg.max_grad_norm)
    polyak(list(nets.target.parameters()), list(critic.parameters()), cfg.tau)
    return {**stats_q, **stats_pi}


# --------------------------------------------------------------------------------------- main
def main(cfg: Config | Resolved[Config]) -> dict[str, Any]:
    """Trains until the target return, ``max_frames`` or ``time_budget``; returns the summary."""
    with Run("sac", cfg) as run:
        cfg = run.cfg  # resolved: the layout file applied, --resume auto picked
        make_actor = run.factory(Actor, run.obs_dim, space_spec(run.action_space), cfg.hidden)
        actor = run.model(make_actor)  # on the CPU: the batchers copy it
        batcher = run.training_batcher(SACAgent, {"model": actor}, GymEnvInf, cfg.n_timesteps)
        run.evaluator(SACAgent, {"model": actor}, agent_info=greedy_info())
        make_nets = partial(sac_nets, make_actor, run.factory(
            TwinQ, run.obs_dim, actor.head.n_dims, cfg.hidden), cfg.init_alpha)
        nets = make_nets(actor=actor)  # critics, targets, temperature too
        buffer = ReplayBuffer(cfg.buffer_size, run.device, expand_inputs(STORED_KEYS, run.obs_spec))
        run.resume_state(**{"buffer": buffer} if cfg.checkpoint_buffer else {})  # --resume
        pool = (run.enter(ThreadPoolExecutor(1, "sac-policy-loss")) if cfg.concurrent_losses and
                cfg.n_threads > 1 and run.device.type == "cpu" and local_learner(run) else None)
        torch.set_num_threads(cfg.n_threads // 2 if pool else cfg.n_threads)
        group = run.learner_group(make_nets, nets, partial(adam, lr=cfg.lr),  # --n-learners N
                                  partial(learn, pool=pool), stacked=True, policy="actor.")
        weights, n_updates, owed, stats, n = partial(group.state_dict, "actor."), 0, 0.0, {}, 0
        # 1. Store each segment (--pipeline 2: the worker is collecting the next one meanwhile).
        for traj in run.segments(batcher):
            buffer.add(traj)
            # 2. utd gradient steps per new frame on uniform buffer samples (ranks: n per batch).
            owed += cfg.utd * int(traj.lengths.sum()) if len(buffer) >= cfg.learning_starts else 0
            n = n or int(owed)  # samples per learner batch, fixed by the first
            while n and owed >= n:  # n samples and their noise (rows, n, 2, D): each rank's rows
                batch = DictTensor.stack([buffer.sample(cfg.batch_size) for _ in range(n)], dim=1)
                batch.set("noise", torch.randn(cfg.batch_size, n, 2, actor.head.n_dims,
                                               device=batch.device()))
                stats = group.learn(batch)
                n_updates, owed = n_updates + n, owed - n
            # 3. Publish: the next segment acts with them (--pipeline 2: the one after it).
            run.publish(batcher, weights())
            run.end_iteration(weights, updates=n_updates,
                              **{k: float(v) for k, v in stats.items()})
    return run.summary


if __name__ == "__main__":
    run_cli(main, Config, prog="python -m rlstruct.algos.sac")
