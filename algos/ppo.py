"""PPO with the clipped surrogate objective, on auto-reset segments.

One iteration:

1. **Collect**: the training batcher steps ``B = n_processes * n_envs`` auto-reset envs
   (``GymEnvInf``) for ``T`` steps; the agent stores the sampled ``action``, its log-probability
   ``logp`` and the critic's ``value`` at every step.
2. **Advantages**, once per batch: the critic values the TRUE next observations
   (``_observation/frame``, the final observation at an episode end, never the reset one) in one
   batched call, and ``F.gae`` gives GAE(lambda): terminated steps do not bootstrap; truncated
   steps and segment cuts bootstrap from that next value.
3. **Learn**: ``n_epochs`` passes over the batch in shuffled minibatches of transitions. The
   batch is flattened once into ``N`` one-step segments (the valid steps only: the layout
   ``replay_agent_stateless`` uses itself), so a minibatch is a row index of it. Each minibatch
   replays the agent on the learner device (one batched call) for new logits and values, and
   minimises ``-min(r A, clip(r, 1-eps, 1+eps) A) + vf_coef L_V - ent_coef H``,
   ``r = exp(logp_new - logp_old)``, with the gradient norm clipped. Advantages are normalised
   per minibatch (``--adv-norm batch``: once over the batch; ``off``: never).
4. **Publish**: ``batcher.update(state_dict)``; the workers collect the next segment while the
   learner logs and evaluates.

Run: ``python -m algos.ppo --help``; ``python -m algos.ppo --seed 1``.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import torch
from torch import Tensor, nn

from rlstruct import (
    Agent,
    CheckDevice,
    DictTensor,
    TemporalDictTensor,
    Trajectories,
    replay_agent_stateless,
)
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.cli import arg, config_to_dict, parse_config
from rlstruct.devices import resolve_device
from rlstruct.envs import GymEnv, GymEnvInf  # (also registers rlstruct/Repeat-v0)
from rlstruct.episodes import EpisodeReturns
from rlstruct.errors import ConfigError
from rlstruct.experiment import LayoutConfig, make_batcher
from rlstruct.logger import RunLogger

FRAME, NEXT_FRAME = K.OBSERVATION + K.FRAME, K.NEXT_OBSERVATION + K.FRAME
ACTION, LOGP, VALUE = K.ACTION + K.ACTION_KEY, K.ACTION + "logp", K.ACTION + "value"
REWARD, DONE = K.NEXT_OBSERVATION + K.REWARD, K.NEXT_OBSERVATION + K.DONE


@dataclass
class Config(LayoutConfig):
    """Clipped PPO on auto-reset segments (see algos/ppo.py); defaults tuned for CartPole-v1."""

    env_id: str = arg("CartPole-v1", "gymnasium id of the environment (discrete actions)")
    n_timesteps: int = arg(32, "T: steps per env and segment")
    hidden: int = arg(64, "width of the two hidden layers of the actor and of the critic")
    lr: float = arg(1e-3, "Adam learning rate")
    anneal_lr: bool = arg(True, "decay the learning rate linearly to 0 over max_frames")
    gamma: float = arg(0.98, "discount factor")
    gae_lambda: float = arg(0.8, "GAE lambda")
    n_epochs: int = arg(20, "passes over each batch")
    minibatch_size: int = arg(256, "transitions per gradient step")
    clip_coef: float = arg(0.2, "eps: the probability ratio is clipped to [1 - eps, 1 + eps]")
    value_clip: float | None = arg(None, "clip the value change to +-this (none: no clipping)")
    vf_coef: float = arg(0.5, "weight of the value loss")
    ent_coef: float = arg(0.0, "weight of the entropy bonus")
    max_grad_norm: float = arg(0.5, "clip the global gradient norm to this")
    adv_norm: Literal["minibatch", "batch", "off"] = arg(
        "minibatch", "normalise advantages per minibatch, once per batch, or not at all"
    )
    max_frames: int = arg(300_000, "stop after this many environment frames")
    time_budget: float = arg(600.0, "stop after this many seconds")
    target_return: float | None = arg(475.0, "stop once target_window episodes average this")
    target_window: int = arg(20, "training episodes averaged for target_return")
    eval_every: int = arg(20, "evaluate the greedy policy every this many iterations (0: never)")
    eval_envs: int = arg(4, "episodes per evaluation")
    checkpoint_every: int = arg(50, "save checkpoints/latest.pt every this many iterations")
    n_threads: int = arg(1, "torch threads of the learner (the cores are shared with the workers)")
    runs_dir: str = arg("runs", "folder of the run directories")

    def __post_init__(self) -> None:
        if self.n_epochs < 1 or self.minibatch_size < 1 or not 0 < self.clip_coef < 1:
            raise ConfigError(
                f"need n_epochs >= 1, minibatch_size >= 1 and 0 < clip_coef < 1; got "
                f"{self.n_epochs}, {self.minibatch_size} and {self.clip_coef}"
            )


# --------------------------------------------------------------------------------------- model
def mlp(n_in: int, hidden: int, n_out: int, out_gain: float) -> nn.Sequential:
    """Two tanh hidden layers, orthogonal init; a small ``out_gain`` starts the policy uniform."""
    layers = [nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh()]
    layers.append(nn.Linear(hidden, n_out))
    for layer, gain in zip(layers[::2], (math.sqrt(2), math.sqrt(2), out_gain)):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate actor and critic: ``forward(frame) -> (logits (n, A), value (n,))``."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.actor = mlp(obs_dim, hidden, n_actions, out_gain=0.01)
        self.critic = mlp(obs_dim, hidden, 1, out_gain=1.0)

    def value(self, frame: Tensor) -> Tensor:
        return self.critic(frame.flatten(1).float()).squeeze(-1)

    def forward(self, frame: Tensor) -> tuple[Tensor, Tensor]:
        x = frame.flatten(1).float()
        return self.actor(x), self.critic(x).squeeze(-1)


# --------------------------------------------------------------------------------------- agent
class PPOAgent(Agent):
    """Memoryless: samples ``a ~ softmax(logits)`` (the argmax on rows with
    ``agent_info["greedy"]``) and returns ``action``, its ``logp`` and ``value``.

    ``call_replay`` (used by ``replay_agent_stateless`` on the learner) samples nothing: it
    returns the differentiable ``logits`` and ``value`` of the stored observations.
    """

    def __init__(self, model: ActorCritic) -> None:
        self.model = model
        self._seed = 0
        self.generator: torch.Generator | None = None

    def seed(self, seed: int) -> None:
        self._seed, self.generator = seed, None

    def __call__(
        self, state: DictTensor, observation: DictTensor, agent_info: DictTensor, history=None
    ) -> tuple[DictTensor, DictTensor]:
        logits, value = self.model(observation[K.FRAME])
        if self.generator is None or self.generator.device != logits.device:
            self.generator = torch.Generator(logits.device).manual_seed(self._seed)
        action = torch.multinomial(logits.softmax(-1), 1, generator=self.generator).squeeze(1)
        if "greedy" in agent_info:
            action = torch.where(agent_info["greedy"].to(logits.device), logits.argmax(-1), action)
        logp = logits.log_softmax(-1).gather(1, action.unsqueeze(1)).squeeze(1)
        return DictTensor({K.ACTION_KEY: action, "logp": logp, "value": value}), state

    def call_replay(
        self, trajectories: Trajectories, t: int, state: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        logits, value = self.model(trajectories.trajectories[FRAME][:, t])
        return DictTensor({"logits": logits, "value": value}), state


# --------------------------------------------------------------------------------------- loss
def clipped_policy_loss(logp: Tensor, logp_old: Tensor, advantage: Tensor, clip: float) -> Tensor:
    """Per sample ``-min(r A, clip(r, 1 - clip, 1 + clip) A)``, ``r = exp(logp - logp_old)``."""
    ratio = (logp - logp_old).exp()
    return -torch.min(ratio * advantage, ratio.clamp(1.0 - clip, 1.0 + clip) * advantage)


def value_loss(value: Tensor, value_old: Tensor, returns: Tensor, clip: float | None) -> Tensor:
    """Per sample ``0.5 (V - R)^2``; with ``clip``, the max of that and the same loss for
    ``V_old + clamp(V - V_old, -clip, clip)`` (PPO2's value clipping)."""
    loss = (value - returns).square()
    if clip is not None:
        clipped = value_old + (value - value_old).clamp(-clip, clip)
        loss = torch.max(loss, (clipped - returns).square())
    return 0.5 * loss


def normalize(x: Tensor) -> Tensor:
    """``(x - mean) / (std + 1e-8)``: the step size no longer depends on the reward scale."""
    return (x - x.mean()) / (x.std(correction=0) + 1e-8)


def gae_advantages(
    model: ActorCritic, traj: Trajectories, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """GAE ``(advantages, returns)``, each ``(B, T)``, from the values stored at collection and
    the critic's values of the true next observations (one batched call, no gradient)."""
    steps = traj.trajectories
    with torch.no_grad():
        next_value = model.value(steps[NEXT_FRAME].flatten(0, 1)).view(steps[REWARD].shape)
    return F.gae(
        steps[REWARD], steps[VALUE], next_value,
        steps[K.NEXT_OBSERVATION + K.TERMINATED], steps[K.NEXT_OBSERVATION + K.TRUNCATED],
        steps.lengths, gamma, lam,
    )


def one_step_segments(traj: Trajectories, advantage: Tensor, returns: Tensor) -> Trajectories:
    """The valid steps of ``traj`` as ``N`` one-step segments holding what the loss reads:
    the observation, the stored action, logp and value, and the advantage and return."""
    steps = traj.trajectories.get([FRAME, ACTION, LOGP, VALUE])
    steps.set("advantage", advantage)
    steps.set("return", returns)
    flat = steps.to_transitions().apply(lambda x: x.unsqueeze(1))  # (N, 1, ...)
    return Trajectories(DictTensor(), TemporalDictTensor(flat))


def ppo_loss(
    agent: Agent, minibatch: Trajectories, cfg: Config
) -> tuple[Tensor, dict[str, Tensor]]:
    """The PPO loss of a minibatch of one-step segments; returns ``(loss, detached stats)``."""
    new = replay_agent_stateless(agent, minibatch).temporal_index(0)
    old = minibatch.trajectories.temporal_index(0)
    log_probs = new["logits"].log_softmax(-1)
    logp = log_probs.gather(1, old[ACTION].unsqueeze(1)).squeeze(1)
    advantage = normalize(old["advantage"]) if cfg.adv_norm == "minibatch" else old["advantage"]
    policy = clipped_policy_loss(logp, old[LOGP], advantage, cfg.clip_coef)
    values = value_loss(new["value"], old[VALUE], old["return"], cfg.value_clip)
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    loss = policy.mean() + cfg.vf_coef * values.mean() - cfg.ent_coef * entropy
    with torch.no_grad():
        log_ratio = logp - old[LOGP]
        ratio = log_ratio.exp()
        stats = {
            "policy_loss": policy.mean(), "value_loss": values.mean(), "entropy": entropy.detach(),
            "approx_kl": (ratio - 1 - log_ratio).mean(),  # Schulman's unbiased estimator
            "clip_fraction": ((ratio - 1).abs() > cfg.clip_coef).float().mean(),
        }
    return loss, stats


def learn(
    agent: Agent, optimizer: torch.optim.Optimizer, traj: Trajectories, cfg: Config
) -> dict[str, float]:
    """``n_epochs`` of minibatch steps over one batch; returns the last epoch's mean stats."""
    model = agent.model
    advantage, returns = gae_advantages(model, traj, cfg.gamma, cfg.gae_lambda)
    segments = one_step_segments(traj, advantage, returns)
    if cfg.adv_norm == "batch":
        segments.trajectories["advantage"] = normalize(segments.trajectories["advantage"])
    for _ in range(cfg.n_epochs):
        minibatches = torch.randperm(segments.n_elems(), device=segments.device())
        totals: dict[str, Tensor] = {}
        for rows in minibatches.split(cfg.minibatch_size):
            loss, stats = ppo_loss(agent, segments.index(rows), cfg)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            totals = {k: totals.get(k, 0.0) + v for k, v in stats.items()}
    n = math.ceil(segments.n_elems() / cfg.minibatch_size)
    return {k: float(v) / n for k, v in totals.items()}


# --------------------------------------------------------------------------------------- main
def evaluation_return(traj: Trajectories) -> float:
    """Mean return of the full greedy episodes of an evaluation batch (``GymEnv``)."""
    steps = traj.trajectories
    return float(torch.where(steps.mask(), steps[REWARD], 0.0).sum(1).mean())


def main(cfg: Config) -> dict[str, Any]:
    """Trains until ``target_return``, ``max_frames`` or ``time_budget``; returns a summary."""
    start = time.monotonic()  # wall_time and time_to_solve include the workers' start-up
    torch.set_num_threads(cfg.n_threads)
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.learner_device)
    probe = gym.make(cfg.env_id)
    obs_dim, n_actions = math.prod(probe.observation_space.shape), int(probe.action_space.n)
    probe.close()
    model = ActorCritic(obs_dim, n_actions, cfg.hidden)  # on the CPU: the batchers copy it
    frames, iteration, eval_return, evaluating, solved_at = 0, 0, math.nan, False, None
    episodes = EpisodeReturns()
    with contextlib.ExitStack() as stack:  # closes batchers and logger, on Ctrl-C too
        batcher = stack.enter_context(make_batcher(
            device=cfg.batcher_device, n_processes=cfg.n_processes, n_timesteps=cfg.n_timesteps,
            create_agent=PPOAgent, agent_args={"model": model}, create_env=GymEnvInf,
            env_args={"env": cfg.env_id, "n_envs": cfg.n_envs}, seeds=cfg.seed,
            check_devices=cfg.check_devices,
        ))
        evaluator = None
        if cfg.eval_every > 0:  # greedy, full episodes; one process (synchronous on the CPU)
            evaluator = stack.enter_context(make_batcher(
                device=cfg.eval_device, n_processes=1,
                n_timesteps=gym.spec(cfg.env_id).max_episode_steps or 1000,
                create_agent=PPOAgent, agent_args={"model": model}, create_env=GymEnv,
                env_args={"env": cfg.env_id, "n_envs": cfg.eval_envs}, seeds=cfg.seed + 1000,
                agent_info=DictTensor({"greedy": torch.ones(1, dtype=torch.bool)}),
                check_devices=cfg.check_devices,
            ))
        log = stack.enter_context(
            RunLogger("ppo", cfg.env_id, cfg, cfg.runs_dir, total_frames=cfg.max_frames)
        )

        model.to(device)
        agent = CheckDevice(PPOAgent(model), device) if cfg.check_devices else PPOAgent(model)
        # One fused kernel for all of Adam's per-parameter updates: cheaper for a small net.
        optimizer = torch.optim.Adam(
            model.parameters(), lr=cfg.lr, eps=1e-5, fused=device.type in ("cpu", "cuda")
        )

        def checkpoint() -> None:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "config": config_to_dict(cfg), "frames": frames}
            log.checkpoint(state, score=log.train_return(last=cfg.target_window))

        batcher.reset()
        batcher.execute()
        while True:
            # 1. The segment the workers collected with the current policy.
            traj, _ = batcher.get()
            frames += int(traj.lengths.sum())
            returns, lengths = episodes(traj.trajectories)
            log.record_episodes(returns, lengths, frames=frames)
            if (
                cfg.target_return is not None
                and log.episodes >= cfg.target_window
                and log.train_return(last=cfg.target_window) >= cfg.target_return
            ):
                solved_at = (frames, time.monotonic() - start)
                break
            if frames >= cfg.max_frames or time.monotonic() - start >= cfg.time_budget:
                break

            # 2-3. Advantages and n_epochs of minibatch steps, replaying on the learner device.
            if cfg.anneal_lr:
                optimizer.param_groups[0]["lr"] = cfg.lr * max(0.0, 1 - frames / cfg.max_frames)
            stats = learn(agent, optimizer, traj.to(device), cfg)

            # 4. Publish the weights; the workers collect the next segment meanwhile.
            batcher.update(model.state_dict())
            batcher.execute()
            iteration += 1
            if evaluator is not None:
                if evaluating:
                    done, _ = evaluator.get(blocking=False)
                    if done is not None:
                        eval_return, evaluating = evaluation_return(done), False
                if not evaluating and iteration % cfg.eval_every == 0:
                    evaluator.update(model.state_dict())
                    evaluator.reset()
                    evaluator.execute()
                    evaluating = True
            log.log(frames, eval_return=eval_return, lr=optimizer.param_groups[0]["lr"], **stats)
            if iteration % cfg.checkpoint_every == 0:
                checkpoint()
        log.log(frames, eval_return=eval_return)  # the row of the last batch, where it stopped
        checkpoint()
    summary = {
        "run_dir": str(log.dir),
        "frames": frames,
        "iterations": iteration,
        "solved": solved_at is not None,
        "train_return": log.train_return(last=cfg.target_window),
        "eval_return": eval_return,
        "wall_time": time.monotonic() - start,
        "frames_to_solve": None if solved_at is None else solved_at[0],
        "time_to_solve": None if solved_at is None else solved_at[1],
    }
    print(f"ppo: {summary}\noutputs in {log.dir}")
    return summary


if __name__ == "__main__":
    main(parse_config(Config, sys.argv[1:]))
