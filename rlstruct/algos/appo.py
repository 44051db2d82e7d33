"""APPO: PPO's clipped objective with V-trace targets, learning while the workers collect.

Three things run at once, as in IMPALA (rlstruct/algos/impala.py) with ``--queue 1``; by default
(``--queue 0``) the main thread drives and learns, and the workers collect meanwhile:

1. **Collect** (worker processes): a pipelined batcher (``--pipeline 2``) streams segments of
   ``T`` steps from ``B`` auto-reset envs; the agent stores the sampled ``action`` and its
   behaviour log-probability ``logp`` under mu, the policy that acted (a few updates old).
2. **Learn** (the main thread, while the pipelined workers collect the next segment: one update
   of lag; ``--queue N``: a :class:`~rlstruct.learners.thread.LearnerThread` N segments behind at
   most,
   about N + 2 updates of lag), per segment:

   - the current policy pi_old and critic V value the segment once (no gradient); V-trace
     (``F.vtrace``) corrects for mu != pi_old with ``log_rho = log pi_old(a) - log mu(a)``,
     truncated at ``rho_bar`` / ``c_bar``, and gives the value targets ``v_t`` and the
     policy-gradient advantages ``A_t = rho_t (r_t + gamma v_{t+1} - V(x_t))``; terminated
     steps do not bootstrap, truncated steps and segment cuts bootstrap from V of the TRUE
     next observation;
   - ``n_epochs`` passes over the segment's valid steps in shuffled minibatches minimise
     ``-min(r A, clip(r, 1-eps, 1+eps) A) + vf_coef 0.5 (V - v)^2 - ent_coef H`` with
     ``r = pi(a) / mu(a)`` (``F.clipped_surrogate``; A normalised per minibatch): many steps
     per segment, as PPO takes, where IMPALA takes one. The trust region is centred on mu, the
     policy that collected the segment, not on pi_old: the updates made since mu acted count
     against the clip range, so a learner that is k updates ahead of its data cannot push the
     same way k more times (centred on pi_old, the entropy collapsed within 10 segments at a
     lag of 3 updates, see docs/algorithms.md);
   - the learner publishes a CPU copy of its weights (``LatestWeights``).
3. **Drive** (the main thread): takes each finished segment, records episodes, learns on it or
   hands it to the learner thread (``put`` waits while it is ``--queue`` segments behind) and
   passes the newest weights to the batcher and the evaluator.

Like IMPALA, runs are not bitwise reproducible: which weights collect which segment depends on
timing.

Run: ``python -m rlstruct.algos.appo --help``; ``python -m rlstruct.algos.appo --seed 1``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

import torch
import tyro
from torch import Tensor, nn

from rlstruct import Agent, DictTensor, LearnerThread, Trajectories
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.algos.presets import APPO_PRESETS
from rlstruct.blocks import masks, zoo
from rlstruct.blocks import vtrace_replay as vr
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.obs_input import input_keys
from rlstruct.blocks.optim import adam, gradient_step
from rlstruct.blocks.sampling import greedy_info
from rlstruct.envs import GymEnvInf
from rlstruct.learners.thread import LatestWeights
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.resolve import Resolved, run_cli
from rlstruct.runs.run import Run, RunConfig


@dataclass
class Config(RunConfig):
    """APPO: clipped PPO with V-trace targets on a pipelined batcher (rlstruct train appo)."""
    presets = APPO_PRESETS  # --preset NAME: rlstruct/algos/presets.py
    action_spaces: ClassVar[tuple[str, ...]] = ("Discrete",)

    max_frames: int = 150_000
    gamma: float = 0.98
    anneal_lr: bool = True
    """decay the learning rate linearly from lr to 0 over max_frames (frames learned)"""
    n_epochs: int = 10
    """passes over each segment (10 over 2 x 16 envs x 32 steps: half the gradient steps per
    frame of 20 over 2 x 8 envs, in about as many frames; docs/algorithms.md)"""
    minibatch_size: int = 256
    """transitions per gradient step (a recurrent model: whole segments, a multiple of T)"""
    clip_coef: float = 0.2
    """eps: the ratio pi / mu (mu: the policy that collected) is clipped to [1 - eps, 1 + eps]"""
    vf_coef: float = 0.5
    """weight of the value loss"""
    ent_coef: float = 0.0
    """weight of the entropy bonus"""
    rho_bar: float = 1.0
    """V-trace: truncation of the importance weights pi_old / mu in targets and advantages"""
    c_bar: float = 0.8
    """V-trace: truncation of the trace coefficients (below 1 it also shortens the traces
    on-policy, like GAE's lambda)"""
    model: Literal["mlp", "cnn", "mlp-lstm", "mlp-gru", "cnn-lstm", "cnn-gru"] = "mlp"
    """the zoo's actor-critic (rlstruct/blocks/zoo.py): mlp, the Nature CNN on stacked frames
    (--env-backend atari), or a recurrent one, replayed from each segment's stored state"""
    queue: int = 0
    """0: learn in the main thread while the pipelined workers collect the next segment (one
    update of lag); N: in a learner thread, which collection waits for when N segments behind"""
    layout: Annotated[LayoutConfig, tyro.conf.OmitArgPrefixes] = field(
        default_factory=lambda: LayoutConfig(pipeline=2, n_envs=16)
    )
    """where each part runs (APPO pipelines by default, 16 envs per worker: cheaper frames)"""

    def problems(self) -> list[str]:  # listed with the shared fields' problems, all at once
        problems = super().problems() + [f"{name} must be >= 1, got {getattr(self, name)}"
                    for name in ("n_epochs", "minibatch_size") if getattr(self, name) < 1]
        if self.queue < 0:
            problems.append(f"queue must be >= 0 (0: no learner thread), got {self.queue}")
        if not 0 < self.clip_coef < 1:
            problems.append(f"clip_coef must be in (0, 1), got {self.clip_coef}")
        if not (self.rho_bar > 0 and self.c_bar > 0):
            problems.append(f"rho_bar and c_bar must be > 0, got {self.rho_bar} and {self.c_bar}")
        if self.layout.pipeline < 2:
            problems.append(f"APPO learns while the workers collect: need --pipeline >= 2, got "
                            f"{self.layout.pipeline}")
        return problems + zoo.model_problems(self.model, None, self.env_id) + (
            vr.minibatch_problems(self.minibatch_size, self.n_timesteps, self.layout)
            if self.model in zoo.RECURRENT_MODELS else [])

    def world_problems(self, obs_shape: tuple[int, ...], action_space: Any) -> list[str]:
        """``--model cnn*`` on observations that are not image frames."""
        return zoo.model_problems(self.model, obs_shape, self.env_id)


# --------------------------------------------------------------------------------------- agent
def BehaviourAgent(model: nn.Module) -> Agent:  # noqa: N802 - a create_agent factory
    """Samples ``a ~ softmax(logits)`` (the argmax with ``agent_info["greedy"]``), stores
    ``action``, its behaviour ``logp`` (and a recurrent model's state ``h``); replayed on the
    learner it returns differentiable ``logits`` and ``value`` (blocks/vtrace_replay.py)."""
    return vr.behaviour_agent(model)


# --------------------------------------------------------------------------------------- loss
def vtrace_batch(agent: Agent, traj: Trajectories,
                 cfg: Config) -> tuple[DictTensor | Trajectories, Tensor]:
    """The segment's ``N`` valid steps as transitions with the behaviour ``logp`` (mu), the
    V-trace ``advantage`` and value ``target`` under the current policy pi_old; and the
    importance weights ``pi_old / mu`` of the valid steps, ``(N,)``. One batched forward pass,
    no gradient. A recurrent model's segment is replayed from its stored state and stays
    Trajectories (its rows, each with its state, are what its minibatches take)."""
    steps, recurrent = traj.trajectories, zoo.is_recurrent(agent.model)
    logits, value, next_value = vr.evaluate_segment(agent, traj)
    logp = F.categorical_log_prob(logits, steps[K.STORED_ACTION])
    log_rho = logp - steps[K.STORED_LOGP]
    targets, advantages = F.vtrace(
        steps[K.NEXT_REWARD], value, next_value, steps[K.NEXT_TERMINATED],
        steps[K.NEXT_TRUNCATED], steps.lengths, log_rho, cfg.gamma, cfg.rho_bar, cfg.c_bar,
    )
    batch = steps.get([*input_keys(steps), K.STORED_ACTION, K.STORED_LOGP] + masks.mask_keys(steps)
                      + ([K.OBS_INITIAL_STATE] if recurrent else []))
    batch.set("advantage", advantages)
    batch.set("target", targets)
    rho = log_rho.exp()[steps.mask()]
    return (Trajectories(traj.info, batch) if recurrent else batch.to_transitions()), rho


def appo_loss(agent: Agent, minibatch: DictTensor | Trajectories,
              cfg: Config) -> tuple[Tensor, dict[str, Tensor]]:
    """The APPO loss of a minibatch of transitions (or of whole rows, for a recurrent model);
    returns ``(loss, detached stats)``."""
    new, data = vr.replay_transitions(agent, minibatch, [K.STORED_ACTION, K.STORED_LOGP,
                                                      "advantage", "target"])
    logp = F.categorical_log_prob(new["logits"], data[K.STORED_ACTION])
    advantage = F.normalize_advantages(data["advantage"])
    policy = F.clipped_surrogate(logp, data[K.STORED_LOGP], advantage, cfg.clip_coef).mean()
    values = 0.5 * (new[K.VALUE] - data["target"]).square().mean()
    logits = new["logits"] if cfg.ent_coef else new["logits"].detach()  # no unused backward
    entropy = F.categorical_entropy(logits).mean()
    loss = policy + cfg.vf_coef * values - cfg.ent_coef * entropy
    with torch.no_grad():
        ratio = (logp - data[K.STORED_LOGP]).exp()
        clipped = ((ratio - 1).abs() > cfg.clip_coef).float().mean()
    stats = {"policy_loss": policy.detach(), "value_loss": values.detach(),
             "entropy": entropy.detach(), "clip_fraction": clipped}
    return loss, stats


class Learner:
    """What the learner thread runs on each segment: V-trace targets, ``n_epochs`` of
    minibatch steps, then a CPU copy of the weights in ``weights`` for the main thread. ``agent``
    is the learner's ``BehaviourAgent`` from ``run.learner``."""

    def __init__(self, agent: Agent, cfg: Config, device: torch.device) -> None:
        self.agent, self.model, self.cfg, self.device = agent, agent.model, cfg, device
        # one flat buffer for the weights: zero, clip and update are a few operations in all
        self.optimizer = adam(self.model.parameters(), cfg.lr, device, eps=1e-5)
        self.weights = LatestWeights()
        self.frames = 0  # learned so far: the learning rate anneals over them
        self.thread: LearnerThread | None = None

    def __call__(self, traj: Trajectories) -> dict[str, float]:
        cfg = self.cfg
        self.frames += int(traj.lengths.sum())
        lr = cfg.lr * max(0.0, 1 - self.frames / cfg.max_frames) if cfg.anneal_lr else cfg.lr
        self.optimizer.param_groups[0]["lr"] = lr
        batch, rho = vtrace_batch(self.agent, traj.to(self.device), cfg)
        totals: dict[str, Tensor] = {}
        n = 0  # minibatches per epoch
        for _ in range(cfg.n_epochs):
            totals, n = {}, 0
            for minibatch in vr.minibatches(batch, cfg.minibatch_size, cfg.n_timesteps):
                loss, stats = appo_loss(self.agent, minibatch, cfg)
                gradient_step(self.optimizer, loss, cfg.max_grad_norm)
                totals, n = {k: totals.get(k, 0.0) + v for k, v in stats.items()}, n + 1
        self.weights.put(self.model.state_dict())
        if self.thread is not None:
            self.thread.count_publication()
        clipped = float((rho > cfg.rho_bar * (1 + 1e-4)).float().mean())
        return {**{k: float(v) / max(n, 1) for k, v in totals.items()}, "lr": lr,
                "rho_mean": float(rho.mean()), "rho_clipped": clipped}


# --------------------------------------------------------------------------------------- main
def main(cfg: Config | Resolved[Config]) -> dict[str, Any]:
    """Trains until the target return, ``max_frames`` or ``time_budget``; returns the summary."""
    with Run("appo", cfg) as run:
        cfg = run.cfg  # resolved: the layout file applied, --resume auto picked
        model = run.model(run.factory(zoo.actor_critic, cfg.model, tuple(run.obs_shape),
                                      space_spec(run.action_space), cfg.hidden))  # on the CPU
        batcher = run.training_batcher(BehaviourAgent, {"model": model}, GymEnvInf,
                                       cfg.n_timesteps)
        run.evaluator(BehaviourAgent, {"model": model}, agent_info=greedy_info())
        latest = {k: v.clone() for k, v in model.state_dict().items()}
        learner = Learner(run.learner(BehaviourAgent(model)), cfg, run.device)
        run.checkpoint_state(model=model, optimizer=learner.optimizer)
        thread = LearnerThread(learner, cfg.queue, name="appo-learner") if cfg.queue else None
        with thread or contextlib.nullcontext():
            learner.thread = thread
            # 1. The workers stream segments; the loop ends when the stop test fires.
            for traj in run.segments(batcher):
                # 2. Learn: the thread takes the segment (waiting while cfg.queue are queued);
                #    or the main thread learns on it while the workers collect the next one.
                if thread is None:
                    stats = learner(traj)
                else:
                    thread.put(traj, size=int(traj.lengths.sum()))
                # 3. The newest weights collect the next segments and run the evaluation.
                weights = learner.weights.take()
                if weights is not None:
                    latest = weights
                    run.publish(batcher, weights)  # pipelined: an update, no execute
                if thread is not None:
                    m = thread.metrics()
                    stats = {"learned": m["batches_learned"], "queue": m["queue_size_mean"],
                             **{k[6:]: v for k, v in m.items() if k.startswith("learn/")}}
                run.end_iteration(latest, **stats)
    return run.summary


if __name__ == "__main__":
    run_cli(main, Config, prog="python -m rlstruct.algos.appo")
