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

The learner runs beside the collection, so which weights collect which segment depends on
timing: runs are not bitwise reproducible (the synchronous algorithms are).

Run: ``python -m rlstruct.algos.impala --help``; ``python -m rlstruct.algos.impala --seed 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, Any, ClassVar

import tyro
from torch import Tensor

from rlstruct import Agent, LearnerThread, Trajectories, replay_agent_stateless
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.blocks.nets import MLPActorCritic
from rlstruct.blocks.optim import Optimizer, adam, gradient_step
from rlstruct.blocks.sampling import ActorAgent, greedy_info
from rlstruct.envs import GymEnvInf
from rlstruct.learners.base import LearnerGroupBase
from rlstruct.learners.thread import LatestWeights
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import Resolved, run_cli
from rlstruct.runs.run import Run, RunConfig


@dataclass
class Config(RunConfig):
    """IMPALA with V-trace on a pipelined batcher; tuned for CartPole-v1 (rlstruct train impala)."""
    action_spaces: ClassVar[tuple[str, ...]] = ("Discrete",)
    learner_ranks: ClassVar[bool] = True  # --n-learners: Run.learner_group
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
        return super().problems() + ([
            f"IMPALA learns while the workers collect: need --pipeline >= 2 and --queue >= 1,"
            f" got {self.layout.pipeline} and {self.queue}"] if bad else [])


# --------------------------------------------------------------------------------------- model
ActorCritic = MLPActorCritic  # separate actor and critic MLPs (rlstruct/blocks/nets.py)


# --------------------------------------------------------------------------------------- agent
def BehaviourAgent(model: ActorCritic) -> ActorAgent:  # noqa: N802 - a create_agent factory
    """Samples ``a ~ softmax(logits)`` (the argmax on rows with ``agent_info["greedy"]``) and
    stores ``action`` and its log-probability ``logp`` under the acting policy. Replayed on the
    learner (through ``CheckDevice`` with ``--check-devices``), it returns the differentiable
    ``logits`` and ``value`` of the stored observations and ``next_value``, V(s') without
    gradient."""
    return ActorAgent(model, store_value=False, replay_next_value=True)


# --------------------------------------------------------------------------------------- loss
def vtrace_loss(agent: Agent, traj: Trajectories, cfg: Config) -> tuple[Tensor, dict[str, Tensor]]:
    """The IMPALA loss of one segment ``(B, T)`` on the agent's device; returns ``(loss,
    detached stats)``. The agent (a ``BehaviourAgent``) is replayed in one batched call."""
    steps, out = traj.trajectories, replay_agent_stateless(agent, traj)
    logits, value = out["logits"], out[K.VALUE]
    logp = F.categorical_log_prob(logits, steps[K.STORED_ACTION])
    log_rho = logp.detach() - steps[K.STORED_LOGP]
    targets, advantages = F.vtrace(
        steps[K.NEXT_REWARD], value.detach(), out["next_value"], steps[K.NEXT_TERMINATED],
        steps[K.NEXT_TRUNCATED], steps.lengths, log_rho, cfg.gamma, cfg.rho_bar, cfg.c_bar,
    )
    mask = steps.mask()
    if cfg.normalize_advantages:
        advantages = F.normalize_advantages(advantages, mask)
    policy = F.masked_mean(-logp * advantages, mask)
    values = F.masked_mean(0.5 * (value - targets).square(), mask)
    entropy = F.masked_mean(F.categorical_entropy(logits), mask)
    loss = policy + cfg.vf_coef * values - cfg.ent_coef * entropy
    rho = log_rho.exp()[mask]
    stats = {"policy_loss": policy.detach(), "value_loss": values.detach(),
             "entropy": entropy.detach(), "rho_mean": rho.mean(),
             "rho_clipped": (rho > cfg.rho_bar * (1 + 1e-4)).float().mean()}
    return loss, stats


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
    takes."""

    def __init__(self, group: LearnerGroupBase) -> None:
        self.group = group
        self.weights = LatestWeights()
        self.thread: LearnerThread | None = None

    def __call__(self, traj: Trajectories) -> dict[str, float]:
        stats = self.group.learn(traj)
        self.weights.put(self.group.state_dict())
        if self.thread is not None:
            self.thread.count_publication()
        return stats


# --------------------------------------------------------------------------------------- main
def main(cfg: Config | Resolved[Config]) -> dict[str, Any]:
    """Trains until the target return, ``max_frames`` or ``time_budget``; returns the summary."""
    with Run("impala", cfg) as run:
        cfg = run.cfg  # resolved: the layout file applied, --resume auto picked
        make_model = partial(ActorCritic, run.obs_dim, run.n_actions, cfg.hidden)
        model = run.model(make_model)  # on the CPU: the batchers copy it
        batcher = run.training_batcher(BehaviourAgent, {"model": model}, GymEnvInf,
                                       cfg.n_timesteps)
        run.evaluator(BehaviourAgent, {"model": model}, agent_info=greedy_info())
        latest = {k: v.clone() for k, v in model.state_dict().items()}
        learner = Learner(run.learner_group(make_model, model,  # --n-learners N
                                            partial(adam, lr=cfg.lr, eps=1e-5), learn,
                                            BehaviourAgent))
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
                run.end_iteration(latest, lr=cfg.lr, learned=m["batches_learned"],
                                  queue=m["queue_size_mean"], learn_ms=m["learn_ms_mean"],
                                  **{k[6:]: v for k, v in m.items() if k.startswith("learn/")})
    return run.summary


if __name__ == "__main__":
    run_cli(main, Config, prog="python -m rlstruct.algos.impala")
