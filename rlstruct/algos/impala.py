"""IMPALA: an actor-critic learning in a thread while the workers keep collecting, with V-trace.

Three things run at once:

1. **Collect** (worker processes): a pipelined batcher (``--pipeline 2``, the default) streams
   segments of ``T`` steps from ``B`` auto-reset envs; the agent stores the sampled ``action``
   and its behaviour log-probability ``logp`` (the policy that acted, possibly a few updates
   old: ``info["policy_version"]`` says which).
2. **Learn** (a :class:`~rlstruct.learners.thread.LearnerThread` on the learner device): per
segment,
   one gradient step on ``-log pi(a) A_vtrace + vf_coef (V - v_s)^2 - ent_coef H``. The policy
   lag is corrected with V-trace (``F.vtrace``): ``log_rho = log pi(a) - logp`` with truncated
   importance weights; terminated steps do not bootstrap, truncated steps and segment cuts
   bootstrap from ``V`` of the TRUE next observation. After each step the learner publishes a
   copy of its weights.
3. **Drive** (the main thread): takes each finished segment (``get``), records episodes, hands
   it to the learner (``put`` blocks when the learner is ``--queue`` batches behind: memory stays
   bounded), and passes the newest published weights to the batcher and the evaluator.

``--model`` is any model of the zoo (rlstruct/blocks/zoo.py). A recurrent one acts through a
``RecurrentAgent``; the learner replays each segment step by step from the state stored at its
start (rlstruct/blocks/vtrace_replay.py), so its logits are the behaviour policy's while the
weights have not moved (rho = 1), and ``V'`` comes from ``bootstrap_values``.

The learner runs beside the collection, so which weights collect which segment depends on
timing: runs are not bitwise reproducible (the synchronous algorithms are).

Run: ``python -m rlstruct.algos.impala --help``; ``python -m rlstruct.algos.impala --seed 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, Any, ClassVar, Literal

import torch
import tyro
from torch import Tensor, nn

from rlstruct import Agent, LearnerThread, Trajectories
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.algos.presets import IMPALA_PRESETS
from rlstruct.blocks import zoo
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.optim import Optimizer, adam, gradient_step, rmsprop_tf
from rlstruct.blocks.sampling import greedy_info
from rlstruct.blocks.vtrace_replay import behaviour_agent, replay_segment
from rlstruct.envs import GymEnvInf
from rlstruct.learners.base import LearnerGroupBase
from rlstruct.learners.thread import LatestWeights
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import Resolved, run_cli
from rlstruct.runs.run import Run, RunConfig


@dataclass
class Config(RunConfig):
    """IMPALA with V-trace on a pipelined batcher; tuned for CartPole-v1 (rlstruct train impala)."""
    presets = IMPALA_PRESETS  # --preset NAME: rlstruct/algos/presets.py
    action_spaces: ClassVar[tuple[str, ...]] = ("Discrete",)
    learner_ranks: ClassVar[bool] = True  # --n-learners: Run.learner_group
    model: Literal["mlp", "cnn", "mlp-lstm", "mlp-gru", "cnn-lstm", "cnn-gru"] = "mlp"
    """the zoo's actor-critic (rlstruct/blocks/zoo.py): mlp, the Nature CNN on stacked frames
    (--env-backend atari), or a recurrent one (LSTM/GRU cell), replayed at the learner from the
    state stored at each segment's start"""
    optimizer: Literal["adam", "rmsprop", "rmsprop-tf"] = "adam"
    """adam (eps 1e-5), torch's RMSprop with MonoBeast's alpha 0.99 and eps 0.01, or RMSprop as
    TensorFlow has it, the optimizer of the IMPALA paper's code (the same alpha and eps, here
    inside the square root, and the square average starting at ones)"""
    reduction: Literal["mean", "sum"] = "mean"
    """the losses averaged over the segment's valid steps, or summed (TorchBeast's)"""
    anneal_lr: bool = False
    """decay the learning rate linearly from lr to 0 over max_frames (frames learned)"""
    clip_reward: bool = False
    """clamp the rewards to [-1, 1] in the loss (Atari)"""
    vf_coef: float = 0.5
    """weight of the value loss"""
    ent_coef: float = 0.0
    """weight of the entropy bonus"""
    rho_bar: float = 1.0
    """V-trace: truncation of the importance weights in the targets and advantages"""
    c_bar: float = 0.95
    """V-trace: truncation of the trace coefficients (below 1 it also cuts traces on-policy,
    like GAE's lambda: 1.0 diverged with lr 4e-3 on CartPole, 0.95 solves with 2e-3)"""
    normalize_advantages: bool = True
    """normalise the V-trace advantages over the batch's valid steps"""
    queue: int = 1
    """segments the learner may fall behind before collection waits for it"""
    # RunConfig's fields whose defaults IMPALA changes
    lr: float = 2e-3
    eval_every: int = 50
    checkpoint_every: int = 200
    layout: Annotated[LayoutConfig, tyro.conf.OmitArgPrefixes] = field(
        default_factory=lambda: LayoutConfig(pipeline=2)
    )
    """where each part runs (IMPALA pipelines by default)"""

    def problems(self) -> list[str]:  # listed with the shared fields' problems, all at once
        bad = self.layout.pipeline < 2 or self.queue < 1
        return super().problems() + zoo.model_problems(self.model, None, self.env_id) + ([
            f"IMPALA learns while the workers collect: need --pipeline >= 2 and --queue >= 1,"
            f" got {self.layout.pipeline} and {self.queue}"] if bad else [])

    def world_problems(self, obs_shape: tuple[int, ...], action_space: Any) -> list[str]:
        """``--model cnn*`` on observations that are not image frames."""
        return zoo.model_problems(self.model, obs_shape, self.env_id)


# --------------------------------------------------------------------------------------- model
def model_factory(run: Run, cfg: Config) -> partial[nn.Module]:
    """The zoo's actor-critic ``--model`` names, from plain values (checkpoints record it)."""
    return run.factory(zoo.actor_critic, cfg.model, tuple(run.obs_shape),
                       space_spec(run.action_space), cfg.hidden)


def make_optimizer(cfg: Config) -> partial[Optimizer]:
    """Adam (eps 1e-5), or ``torch.optim.RMSprop`` with IMPALA's settings (alpha 0.99, eps
    0.01, no momentum). TensorFlow's RMSprop, the paper's, adds eps inside the square root and
    starts its mean square at 1; torch's adds it outside and starts at 0: early steps are
    larger."""
    if cfg.optimizer == "rmsprop":
        return partial(torch_rmsprop, lr=cfg.lr, alpha=0.99, eps=0.01)
    if cfg.optimizer == "rmsprop-tf":
        return partial(rmsprop_tf, lr=cfg.lr, alpha=0.99, eps=0.01)
    return partial(adam, lr=cfg.lr, eps=1e-5)


def torch_rmsprop(params: Any, device: Any, lr: float, alpha: float, eps: float) -> Optimizer:
    """``torch.optim.RMSprop`` in the optimizer factory's signature ``(params, device)``."""
    return torch.optim.RMSprop(list(params), lr=lr, alpha=alpha, eps=eps)


# --------------------------------------------------------------------------------------- agent
def BehaviourAgent(model: nn.Module) -> Agent:  # noqa: N802 - a create_agent factory
    """Samples ``a ~ softmax(logits)`` (the argmax on rows with ``agent_info["greedy"]``) and
    stores ``action`` and its log-probability ``logp`` under the acting policy (and, for a
    recurrent model, its state ``h``). Replayed on the learner (through ``CheckDevice`` with
    ``--check-devices``), it returns the differentiable ``logits`` and ``value`` of the stored
    observations (rlstruct/blocks/vtrace_replay.py)."""
    return behaviour_agent(model, replay_next_value=True)


# --------------------------------------------------------------------------------------- loss
def vtrace_loss(agent: Agent, traj: Trajectories, cfg: Config) -> tuple[Tensor, dict[str, Tensor]]:
    """The IMPALA loss of one segment ``(B, T)`` on the agent's device; returns ``(loss,
    detached stats)``. The agent (a ``BehaviourAgent``) is replayed in one batched call, or
    step by step from the stored state for a recurrent model (``replay_segment``)."""
    steps = traj.trajectories
    logits, value, next_value = replay_segment(agent, traj)
    logp = F.categorical_log_prob(logits, steps[K.STORED_ACTION])
    log_rho = logp.detach() - steps[K.STORED_LOGP]
    reward = steps[K.NEXT_REWARD].clamp(-1, 1) if cfg.clip_reward else steps[K.NEXT_REWARD]
    targets, advantages = F.vtrace(
        reward, value.detach(), next_value, steps[K.NEXT_TERMINATED],
        steps[K.NEXT_TRUNCATED], steps.lengths, log_rho, cfg.gamma, cfg.rho_bar, cfg.c_bar,
    )
    mask = steps.mask()
    if cfg.normalize_advantages:
        advantages = F.normalize_advantages(advantages, mask)
    reduce = F.masked_mean if cfg.reduction == "mean" else _masked_sum
    policy = reduce(-logp * advantages, mask)
    values = reduce(0.5 * (value - targets).square(), mask)
    entropy = reduce(F.categorical_entropy(logits), mask)
    loss = policy + cfg.vf_coef * values - cfg.ent_coef * entropy
    rho = log_rho.exp()[mask]
    stats = {"policy_loss": policy.detach(), "value_loss": values.detach(),
             "entropy": entropy.detach(), "rho_mean": rho.mean(),
             "rho_clipped": (rho > cfg.rho_bar * (1 + 1e-4)).float().mean()}
    return loss, stats


def _masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    return x[mask].sum()


def learn(agent: Agent, optimizer: Optimizer, traj: Trajectories, cfg: Config,
          step: Any = gradient_step) -> dict[str, float]:
    """One gradient step on a segment (``step`` averages it over --n-learners ranks)."""
    loss, stats = vtrace_loss(agent, traj, cfg)
    step(optimizer, loss, cfg.max_grad_norm)
    return {k: float(v) for k, v in stats.items()}


class Learner:
    """What the learner thread runs: the learner group's gradient step per segment (with
    ``--n-learners N`` each rank on 1/N of the rows, gradients averaged), then its weights in
    ``weights`` (a :class:`~rlstruct.learners.thread.LatestWeights`) that the main thread
    takes. With ``cfg.anneal_lr`` the learning rate decays over the frames learned."""

    def __init__(self, group: LearnerGroupBase, cfg: Config | None = None) -> None:
        self.group, self.cfg, self.frames = group, cfg, 0
        self.weights = LatestWeights()
        self.thread: LearnerThread | None = None

    def __call__(self, traj: Trajectories) -> dict[str, float]:
        cfg, lr = self.cfg, None
        self.frames += int(traj.lengths.sum())
        if cfg is not None and cfg.anneal_lr:
            lr = cfg.lr * max(0.0, 1 - self.frames / cfg.max_frames)
        stats = {**self.group.learn(traj, lr=lr), **({} if lr is None else {"lr": lr})}
        self.weights.put(self.group.state_dict())
        if self.thread is not None:
            self.thread.count_publication()
        return stats


# --------------------------------------------------------------------------------------- main
def main(cfg: Config | Resolved[Config]) -> dict[str, Any]:
    """Trains until the target return, ``max_frames`` or ``time_budget``; returns the summary."""
    with Run("impala", cfg) as run:
        cfg = run.cfg  # resolved: the layout file applied, --resume auto picked
        make_model = model_factory(run, cfg)  # picklable: the learner ranks build theirs
        model = run.model(make_model)  # on the CPU: the batchers copy it
        batcher = run.training_batcher(BehaviourAgent, {"model": model}, GymEnvInf,
                                       cfg.n_timesteps)
        run.evaluator(BehaviourAgent, {"model": model}, agent_info=greedy_info())
        latest = {k: v.clone() for k, v in model.state_dict().items()}
        learner = Learner(run.learner_group(make_model, model,  # --n-learners N
                                            make_optimizer(cfg), learn, BehaviourAgent), cfg)
        learner.frames = run.frames  # a resume anneals on from where it stopped
        with LearnerThread(learner, max_queue=cfg.queue, name="impala-learner") as thread:
            learner.thread = thread
            # 1. The workers stream segments; the loop ends when the stop test fires.
            for traj in run.segments(batcher):
                # 2. The learner takes the segment (this waits while it is cfg.queue behind).
                thread.put(traj, size=int(traj.lengths.sum()))
                # 3. The newest weights collect the next segments and run the evaluation.
                weights = learner.weights.take()
                if weights is not None:
                    latest = weights
                    run.publish(batcher, weights)  # pipelined: an update, no execute
                m = thread.metrics()
                stats = {"lr": cfg.lr, **{k[6:]: v for k, v in m.items() if k.startswith("learn/")}}
                run.end_iteration(latest, learned=m["batches_learned"], queue=m["queue_size_mean"],
                                  learn_ms=m["learn_ms_mean"], **stats)
    return run.summary


if __name__ == "__main__":
    run_cli(main, Config, prog="python -m rlstruct.algos.impala")
