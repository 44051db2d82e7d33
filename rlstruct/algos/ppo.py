"""PPO with the clipped surrogate objective, on auto-reset segments.

One iteration:

1. **Collect**: the training batcher steps ``B = n_processes * n_envs`` auto-reset envs
   (``GymEnvInf``) for ``T`` steps with a model of the zoo (``--model``,
   :mod:`rlstruct.blocks.zoo`; the policy head fits the action space); the agent stores the
   env's ``action``, the head's unclipped ``sample``, its ``logp`` and the critic's ``value``
   (a recurrent model also its state after each step, ``action/h``, and the batcher the state
   at the segment's start, ``agent_state/h``).
2. **Advantages**, once per batch: GAE(lambda) (``F.gae``) from the stored values and the
   critic's values of the TRUE next observations (``_observation/frame``, never the reset
   one): terminated steps do not bootstrap; truncated steps and segment cuts do (on scaled
   rewards with ``--normalize-reward``). A recurrent model values them under ``action/h``.
3. **Learn**: ``n_epochs`` passes over the batch in shuffled minibatches: of ``minibatch_size``
   valid transitions replayed in one batched call (``replay_agent_stateless``), or, for a
   recurrent model, of whole env rows replayed from ``agent_state/h``
   (:mod:`rlstruct.blocks.segment_minibatches`, ``--n-minibatches``). Each minimises
   ``-min(r A, clip(r, 1-eps, 1+eps) A) + vf_coef L_V - ent_coef H`` over its valid steps,
   ``r = exp(logp_new - logp_old)``, advantages normalised per minibatch (``--adv-norm``);
   then the ``--normalize-obs`` statistics take in the batch.
4. **Publish**: ``run.publish``; with ``--pipeline 2`` the workers collect the next segment
   meanwhile (one update of lag: the batch is relabelled first). ``rlstruct train ppo --help``.
"""

from __future__ import annotations

import os
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
from rlstruct.blocks import segment_minibatches as seg  # the batch's advantages, minibatches
from rlstruct.blocks import zoo
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.masks import mask_keys
from rlstruct.blocks.obs_input import input_keys
from rlstruct.blocks.optim import Optimizer, adam, gradient_step
from rlstruct.blocks.recurrent import RecurrentAgent
from rlstruct.blocks.sampling import PolicyAgent, greedy_info
from rlstruct.blocks.segment_minibatches import gae_advantages, relabel
from rlstruct.blocks.zoo import MODELS, RECURRENT_MODELS, actor_critic, model_problems
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
    model: Literal[MODELS] = "mlp"  # type: ignore[valid-type]
    """the zoo's actor-critic (rlstruct/blocks/zoo.py): mlp; cnn (Nature CNN, --env-backend
    atari); mlp-lstm, mlp-gru, cnn-lstm, cnn-gru (recurrent: minibatches of whole env rows)"""
    n_minibatches: int | None = None
    """recurrent models: minibatches of rows/n_minibatches whole rows (None: B*T/minibatch_size)"""
    normalize_obs: bool = False
    """mlp and mlp-*: normalise observations with running statistics (sent with the weights)"""
    log_std_init: float = 0.0
    """Box actions: initial log-std of the Gaussian policy (in the normalised space [-1, 1])"""
    activation: Literal["tanh", "relu"] = "tanh"
    """mlp: the hidden layers' activation"""
    normalize_reward: bool = False
    """mlp and mlp-*: divide rewards by the returns' running std (clipped to +-10)"""
    init: Literal["orthogonal", "torch"] = "orthogonal"
    """mlp: orthogonal weights, or torch's nn.Linear defaults (rl-zoo's MuJoCo PPO)"""
    presets = PPO_PRESETS  # --preset NAME: rlstruct/algos/presets.py

    def problems(self) -> list[str]:  # listed with the shared fields' problems, all at once
        bad = self.n_epochs < 1 or self.minibatch_size < 1 or not 0 < self.clip_coef < 1
        problems = super().problems() + model_problems(self.model, None, self.env_id) + ([
            f"need n_epochs >= 1, minibatch_size >= 1 and 0 < clip_coef < 1; got "
            f"{self.n_epochs}, {self.minibatch_size} and {self.clip_coef}"] if bad else [])
        mlp_only = [f"--{k.replace('_', '-')} {getattr(self, k)}" for k in zoo.MLP_OPTIONS
                    if k not in self.mlp_options() and getattr(self, k) != getattr(Config, k)]
        if mlp_only:
            problems.append(f"{', '.join(mlp_only)} apply to --model mlp only (the normalisations"
                            f" to mlp-lstm and mlp-gru too), not {self.model}")
        if self.model in RECURRENT_MODELS:
            problems += self.row_problems()
        return problems

    def world_problems(self, obs_shape: tuple[int, ...], action_space: Any) -> list[str]:
        box = self.model.startswith("cnn") and type(action_space).__name__ != "Discrete"
        return model_problems(self.model, obs_shape, self.env_id) + ([  # a CNN: images, Discrete
            f"ppo needs Discrete actions; {self.env_id} has {action_space} (--model "
            f"{self.model}; --model mlp and the mlp-* models take Box actions)"] if box else [])

    def mlp_options(self) -> dict[str, Any]:
        """The options of ``--model mlp`` that ``--model`` takes
        (:func:`~rlstruct.blocks.zoo.model_options`: ``mlp-*`` the normalisations)."""
        return {k: getattr(self, k) for k in zoo.model_options(self.model)}

    def row_problems(self) -> list[str]:
        """A recurrent model learns on whole rows, on one learner (ranks: not split yet)."""
        rows = (self.layout.n_processes or os.cpu_count() or 1) * self.layout.n_envs
        problem = seg.row_split(rows, self.n_timesteps, self.minibatch_size, self.n_minibatches)[1]
        ranks = self.layout.n_learners > 1 or self.layout.learner_backend == "ray"
        return [p for p in (problem, f"--model {self.model}: recurrent PPO learns in one process"
                            "; --n-learners and --learner-backend ray take feed-forward models"
                            if ranks else None) if p]


# --------------------------------------------------------------------------------------- model
def model_factory(run: Run, cfg: Config) -> partial[torch.nn.Module]:
    """The zoo's ``--model`` (:func:`~rlstruct.blocks.zoo.actor_critic`), from plain values."""
    return run.factory(actor_critic, cfg.model, tuple(run.obs_shape),
                       space_spec(run.action_space), cfg.hidden, **cfg.mlp_options())


# --------------------------------------------------------------------------------------- agent
# PolicyAgent (blocks/sampling.py; masks: blocks/masks.py); RecurrentAgent keeps its state too.
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


def ppo_loss(agent: Agent, minibatch: DictTensor | Trajectories,
             cfg: Config) -> tuple[Tensor, dict[str, Tensor]]:
    """The PPO loss of a minibatch of transitions, or of whole rows (Trajectories) replayed
    from their stored start state, over their valid steps; returns ``(loss, detached stats)``."""
    recurrent, head = isinstance(minibatch, Trajectories), agent.model.head
    new, minibatch = (seg.replay_valid_steps(agent, minibatch) if recurrent else  # type: ignore
                      (replay_agent_stateless(agent, minibatch), minibatch))
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
        ratio = (log_ratio := logp - minibatch[K.STORED_LOGP]).exp()
        stats = {
            "policy_loss": policy.mean(), "value_loss": values.mean(), "entropy": entropy.detach(),
            "approx_kl": (ratio - 1 - log_ratio).mean(),  # Schulman's unbiased estimator
            "clip_fraction": ((ratio - 1).abs() > cfg.clip_coef).float().mean()}
    return loss, stats


def learn(
    agent: Agent, optimizer: Optimizer, traj: Trajectories, cfg: Config,
    step: Any = gradient_step, out_of_time: Callable[[], bool] = lambda: False,
) -> dict[str, float]:
    """``n_epochs`` of minibatch steps over one batch (a recurrent model's: whole rows,
    ``row_split``), stopping early once ``out_of_time()``; returns the last epoch's mean stats.
    With ``--n-learners N`` each rank runs it on B/N rows, minibatches of minibatch_size/N, and
    ``step`` averages the gradients over the ranks."""
    recurrent = cfg.model in RECURRENT_MODELS
    if cfg.layout.pipeline > 1:  # collected one update ago: clip around the current policy
        traj = (seg.relabel_recurrent if recurrent else relabel)(agent, traj)
    gae = seg.recurrent_gae if recurrent else partial(gae_advantages, current=True)
    advantage, returns = gae(agent.model, traj, cfg.gamma, cfg.gae_lambda)
    keys = [*input_keys(traj.trajectories), K.STORED_SAMPLE, K.STORED_LOGP, K.STORED_VALUE]
    steps = traj.trajectories.get(keys + mask_keys(traj) + [K.OBS_INITIAL_STATE] * recurrent)
    if cfg.adv_norm == "batch":  # over the valid steps
        advantage = F.normalize_advantages(advantage, steps.mask())
    steps.set("advantage", advantage)
    steps.set("return", returns)
    batch = Trajectories(traj.info, steps) if recurrent else steps.to_transitions()
    for _ in range(cfg.n_epochs):
        totals: dict[str, Tensor] = {}
        if recurrent:  # whole rows, replayed from their start state
            minibatches = seg.row_minibatches(batch, seg.row_split(
                batch.n_elems(), cfg.n_timesteps, cfg.minibatch_size, cfg.n_minibatches)[0])
        else:  # the N valid steps, row by row: a minibatch is a row index
            order = torch.randperm(batch.n_elems(), device=batch.device())
            minibatches = [batch.index(rows) for rows in order.split(cfg.minibatch_size)]
        for n, minibatch in enumerate(minibatches, 1):
            loss, stats = ppo_loss(agent, minibatch, cfg)
            step(optimizer, loss, cfg.max_grad_norm)
            totals = {k: totals.get(k, 0.0) + v for k, v in stats.items()}
            if out_of_time():  # the time budget holds within a long learn phase too
                return {k: float(v) / n for k, v in totals.items()}
    if getattr(agent.model, "obs_norm", None) is not None:  # the next batch's statistics
        agent.model.observe(steps.to_transitions()[K.OBS_FRAME])
    return {k: float(v) / n for k, v in totals.items()}


# --------------------------------------------------------------------------------------- main
def main(cfg: Config | Resolved[Config]) -> dict[str, Any]:
    """Trains until the target return, ``max_frames`` or ``time_budget``; returns the summary."""
    with Run("ppo", cfg) as run:
        cfg = run.cfg  # resolved: the layout file applied, --resume auto picked
        make_model = model_factory(run, cfg)  # picklable: the learner ranks build theirs
        model = run.model(make_model)  # on the CPU: the batchers copy it
        make_agent = RecurrentAgent if cfg.model in RECURRENT_MODELS else PPOAgent
        batcher = run.training_batcher(make_agent, {"model": model}, GymEnvInf, cfg.n_timesteps)
        run.evaluator(make_agent, {"model": model}, agent_info=greedy_info())
        group = run.learner_group(make_model, model, partial(adam, lr=cfg.lr, eps=1e-5), learn,
                                  make_agent, per_rank=("minibatch_size",))  # --n-learners N
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
