"""PPO with the clipped surrogate objective, on auto-reset segments.

One iteration:

1. **Collect**: the training batcher steps ``B = n_processes * n_envs`` auto-reset envs
   (``GymEnvInf``) for ``T`` steps. The policy head is picked from the action space
   (``rlstruct.blocks.distributions``: softmax for Discrete; a diagonal Gaussian for Box, rescaled
   and clipped into the bounds); the agent stores the env's ``action``, the head's unclipped
   ``sample``, its log-probability ``logp`` and the critic's ``value`` at every step.
2. **Advantages**, once per batch: the critic values the TRUE next observations
   (``_observation/frame``, the final observation at an episode end, never the reset one) in one
   batched call, and ``F.gae`` gives GAE(lambda): terminated steps do not bootstrap; truncated
   steps and segment cuts bootstrap from that next value (on scaled rewards with
   ``--normalize-reward``).
3. **Learn**: ``n_epochs`` passes over the batch's ``N`` valid steps (``to_transitions()``) in
   shuffled minibatches. Each minibatch replays the agent on the learner device in one batched
   call (``replay_agent_stateless`` takes transitions directly) for new head params and
   values, and minimises ``-min(r A, clip(r, 1-eps, 1+eps) A) + vf_coef L_V - ent_coef H``,
   ``r = exp(logp_new - logp_old)``. Advantages are normalised per minibatch (``--adv-norm``).
   With ``--normalize-obs`` the running statistics (the model's buffers) then take in the batch.
4. **Publish**: ``run.publish``. With ``--pipeline 2`` the workers collect the next segment
   while the learner learns on this one (one update of policy lag; the clip tolerates it).
Run: ``rlstruct train ppo --help``; ``rlstruct train ppo --preset atari`` (Pong).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from rlstruct import Agent, DictTensor, Trajectories, replay_agent_stateless
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.algos.presets import PPO_PRESETS
from rlstruct.blocks import normalization
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.nets import CNNActorCritic, HeadActorCritic, head_actor_critic
from rlstruct.blocks.optim import Optimizer, adam, gradient_step
from rlstruct.blocks.sampling import PolicyAgent, greedy_info
from rlstruct.envs import GymEnvInf
from rlstruct.runs.resolve import Resolved, run_cli
from rlstruct.runs.run import Run, RunConfig


@dataclass
class Config(RunConfig):
    """Clipped PPO on auto-reset segments; defaults tuned for CartPole-v1 (rlstruct train ppo)."""
    learner_ranks: ClassVar[bool] = True  # --n-learners: Run.learner_group
    max_frames: int = 300_000
    gamma: float = 0.98
    anneal_lr: bool = True
    """decay the learning rate linearly from lr to 0 over max_frames"""
    gae_lambda: float = 0.8
    """GAE lambda"""
    n_epochs: int = 20
    """passes over each batch"""
    minibatch_size: int = 256
    """transitions per gradient step"""
    clip_coef: float = 0.2
    """eps: the probability ratio is clipped to [1 - eps, 1 + eps]"""
    value_clip: float | None = None
    """clip the value change to +-this (None: no clipping)"""
    vf_coef: float = 0.5
    """weight of the value loss"""
    ent_coef: float = 0.0
    """weight of the entropy bonus"""
    adv_norm: Literal["minibatch", "batch", "off"] = "minibatch"
    """normalise advantages per minibatch, once per batch, or not at all"""
    model: Literal["mlp", "cnn"] = "mlp"
    """mlp on flattened observations, or the Nature CNN on stacked frames (--env-backend atari)"""
    normalize_obs: bool = False
    """mlp: normalise observations with running statistics (sent with the weights)"""
    log_std_init: float = 0.0
    """Box actions: initial log-std of the Gaussian policy (in the normalised space [-1, 1])"""
    activation: Literal["tanh", "relu"] = "tanh"
    """mlp: the hidden layers' activation"""
    normalize_reward: bool = False
    """mlp: divide rewards by the running std of the discounted returns (clipped to +-10)"""
    init: Literal["orthogonal", "torch"] = "orthogonal"
    """mlp: orthogonal weights, or torch's nn.Linear defaults (rl-zoo's MuJoCo PPO)"""
    presets = PPO_PRESETS  # --preset NAME: rlstruct/algos/presets.py

    def problems(self) -> list[str]:  # listed with the shared fields' problems, all at once
        bad = self.n_epochs < 1 or self.minibatch_size < 1 or not 0 < self.clip_coef < 1
        return super().problems() + ([
            f"need n_epochs >= 1, minibatch_size >= 1 and 0 < clip_coef < 1; got "
            f"{self.n_epochs}, {self.minibatch_size} and {self.clip_coef}"] if bad else [])


# --------------------------------------------------------------------------------------- model
def model_factory(run: Run, cfg: Config) -> partial[HeadActorCritic | CNNActorCritic]:
    """Actor and critic MLPs (the actor ends in the action space's policy head), or the Nature
    CNN (Discrete actions); built from plain values, so checkpoints record it."""
    if cfg.model == "cnn":
        return partial(CNNActorCritic, run.n_actions, in_channels=run.obs_shape[0])
    return partial(head_actor_critic, run.obs_dim, space_spec(run.action_space), cfg.hidden,
                   cfg.log_std_init, cfg.normalize_obs, cfg.activation, cfg.normalize_reward,
                   cfg.init)


# --------------------------------------------------------------------------------------- agent
# Memoryless (rlstruct/blocks/sampling.py): stores the env's action, the head's unclipped sample,
# its logp and the value; replayed on the learner it returns the head's params and the value.
PPOAgent = PolicyAgent


# --------------------------------------------------------------------------------------- loss
def clipped_policy_loss(logp: Tensor, logp_old: Tensor, advantage: Tensor, clip: float) -> Tensor:
    """Per sample ``-min(r A, clip(r, 1 - clip, 1 + clip) A)``, ``r = exp(logp - logp_old)``."""
    ratio = (logp - logp_old).exp()
    return -torch.min(ratio * advantage, ratio.clamp(1.0 - clip, 1.0 + clip) * advantage)


def value_loss(value: Tensor, value_old: Tensor, returns: Tensor, clip: float | None) -> Tensor:
    """Per sample ``0.5 (V - R)^2``; with ``clip``, the max of that and the same loss for
    ``V_old + clamp(V - V_old, -clip, clip)``."""
    loss = (value - returns).square()
    if clip is not None:
        clipped = value_old + (value - value_old).clamp(-clip, clip)
        loss = torch.max(loss, (clipped - returns).square())
    return 0.5 * loss


def scaled_rewards(model: Any, traj: Trajectories, gamma: float) -> Tensor:
    """The rewards ``(B, T)``; with ``--normalize-reward`` scaled by the returns' running std
    (``normalization.scale_rewards``; ``model.discounted`` carries each row's return on)."""
    steps, norm = traj.trajectories, getattr(model, "reward_norm", None)
    if norm is None:
        return steps[K.NEXT_REWARD]
    done = steps[K.NEXT_TERMINATED] | steps[K.NEXT_TRUNCATED]
    scaled, model.discounted = normalization.scale_rewards(
        norm, getattr(model, "discounted", None), steps[K.NEXT_REWARD], done, steps.lengths, gamma)
    return scaled


def gae_advantages(
    model: HeadActorCritic, traj: Trajectories, gamma: float, lam: float, current: bool = False
) -> tuple[Tensor, Tensor]:
    """GAE ``(advantages, returns)``, each ``(B, T)``, from the stored values and the critic's
    values of the true next observations (no gradient), on :func:`scaled_rewards`. With
    ``current`` (the stored values are this model's) step ``t``'s next value is step ``t+1``'s
    stored one, and the critic runs only where the next observation is not in the batch: an
    episode's end and a row's last step (a forward pass over the batch saved)."""
    steps = traj.trajectories
    value, done = steps[K.STORED_VALUE], steps[K.NEXT_TERMINATED] | steps[K.NEXT_TRUNCATED]
    t = torch.arange(value.shape[1], device=value.device)
    need = (done | (t >= steps.lengths.unsqueeze(1) - 1)) if current else torch.ones_like(done)
    next_value = torch.cat([value[:, 1:], value[:, -1:]], 1).clone()
    with torch.no_grad():
        next_value[need] = model.value(steps[K.NEXT_FRAME][need]).to(value.dtype)
    return F.gae(scaled_rewards(model, traj, gamma), value, next_value, steps[K.NEXT_TERMINATED],
                 steps[K.NEXT_TRUNCATED], steps.lengths, gamma, lam)


def ppo_loss(agent: Agent, minibatch: DictTensor, cfg: Config) -> tuple[Tensor, dict[str, Tensor]]:
    """The PPO loss of a minibatch of transitions; returns ``(loss, detached stats)``."""
    new, head = replay_agent_stateless(agent, minibatch), agent.model.head
    logp = head.log_prob(new["params"], minibatch[K.STORED_SAMPLE])
    advantage = minibatch["advantage"]
    if cfg.adv_norm == "minibatch":
        advantage = F.normalize_advantages(advantage)
    policy = clipped_policy_loss(logp, minibatch[K.STORED_LOGP], advantage, cfg.clip_coef)
    values = value_loss(new["value"], minibatch[K.STORED_VALUE], minibatch["return"],
                        cfg.value_clip)
    entropy = head.entropy(new["params"]).mean()
    loss = policy.mean() + cfg.vf_coef * values.mean() - cfg.ent_coef * entropy
    with torch.no_grad():
        log_ratio = logp - minibatch[K.STORED_LOGP]
        ratio = log_ratio.exp()
        stats = {
            "policy_loss": policy.mean(), "value_loss": values.mean(), "entropy": entropy.detach(),
            "approx_kl": (ratio - 1 - log_ratio).mean(),  # Schulman's unbiased estimator
            "clip_fraction": ((ratio - 1).abs() > cfg.clip_coef).float().mean(),
        }
    return loss, stats


def relabel(agent: Agent, traj: Trajectories) -> Trajectories:
    """``logp`` and ``value`` of the stored actions recomputed by the current model: with
    ``--pipeline 2`` the batch was collected one update ago, and the clip range must be measured
    from the policy being improved (or the first epoch starts outside it)."""
    steps, shape = traj.trajectories, traj.trajectories[K.STORED_VALUE].shape
    with torch.no_grad():
        params, value = agent.model(steps[K.OBS_FRAME].flatten(0, 1))
        logp = agent.model.head.log_prob(params, steps[K.STORED_SAMPLE].flatten(0, 1))
    steps.set(K.STORED_LOGP, logp.view(shape))
    steps.set(K.STORED_VALUE, value.view(shape))
    return traj


def learn(
    agent: Agent, optimizer: Optimizer, traj: Trajectories, cfg: Config,
    step: Any = gradient_step, out_of_time: Callable[[], bool] = lambda: False,
) -> dict[str, float]:
    """``n_epochs`` of minibatch steps over one batch, stopping early once ``out_of_time()``;
    returns the last epoch's mean stats. With ``--n-learners N`` each rank runs it on B/N rows,
    minibatches of minibatch_size/N, and ``step`` averages the gradients over the ranks."""
    if cfg.layout.pipeline > 1:  # collected one update ago: clip around the current policy
        traj = relabel(agent, traj)  # (otherwise the stored values are this model's already)
    advantage, returns = gae_advantages(agent.model, traj, cfg.gamma, cfg.gae_lambda, current=True)
    steps = traj.trajectories.get([K.OBS_FRAME, K.STORED_SAMPLE, K.STORED_LOGP, K.STORED_VALUE])
    steps.set("advantage", advantage)
    steps.set("return", returns)
    batch = steps.to_transitions()  # the N valid steps, row by row: a minibatch is a row index
    if cfg.adv_norm == "batch":
        batch["advantage"] = F.normalize_advantages(batch["advantage"])
    for _ in range(cfg.n_epochs):
        totals: dict[str, Tensor] = {}
        order = torch.randperm(batch.n_elems(), device=batch.device())
        for n, rows in enumerate(order.split(cfg.minibatch_size), 1):
            loss, stats = ppo_loss(agent, batch.index(rows), cfg)
            step(optimizer, loss, cfg.max_grad_norm)
            totals = {k: totals.get(k, 0.0) + v for k, v in stats.items()}
            if out_of_time():  # the time budget holds within a long learn phase too
                return {k: float(v) / n for k, v in totals.items()}
    if isinstance(agent.model, HeadActorCritic):  # the statistics the next batch is taken with
        agent.model.observe(batch[K.OBS_FRAME])
    return {k: float(v) / n for k, v in totals.items()}


# --------------------------------------------------------------------------------------- main
def main(cfg: Config | Resolved[Config]) -> dict[str, Any]:
    """Trains until the target return, ``max_frames`` or ``time_budget``; returns the summary."""
    with Run("ppo", cfg) as run:
        cfg = run.cfg  # resolved: the layout file applied, --resume auto picked
        make_model = model_factory(run, cfg)  # picklable: the learner ranks build theirs
        model = run.model(make_model)  # on the CPU: the batchers copy it
        batcher = run.training_batcher(PPOAgent, {"model": model}, GymEnvInf, cfg.n_timesteps)
        run.evaluator(PPOAgent, {"model": model}, agent_info=greedy_info())
        group = run.learner_group(make_model, model, partial(adam, lr=cfg.lr, eps=1e-5), learn,
                                  PPOAgent, per_rank=("minibatch_size",))  # --n-learners N
        # 1. Each segment the workers collected with the current policy, until the stop test.
        for traj in run.segments(batcher):
            # 2-3. Advantages and n_epochs of minibatch steps, replaying on the learner device
            # (--n-learners N: each rank on 1/N of the rows, gradients averaged).
            lr = cfg.lr * max(0.0, 1 - run.frames / cfg.max_frames) if cfg.anneal_lr else cfg.lr
            stats = group.learn(traj, lr=lr)
            weights = group.state_dict()  # 4. published; the workers collect the next segment
            run.publish(batcher, weights)
            run.end_iteration(weights, lr=lr, **stats)
    return run.summary


if __name__ == "__main__":
    run_cli(main, Config, prog="python -m rlstruct.algos.ppo")
