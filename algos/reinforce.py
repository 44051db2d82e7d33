"""REINFORCE with a learned baseline and an entropy bonus, on full episodes.

Each iteration plays ``B = n_processes * n_envs`` whole episodes with the current stochastic policy
(episodic ``GymEnv``: a row leaves the batch when its episode ends), then takes ONE gradient step:

    G_t  = discounted return of the episode from t (F.discounted_returns)
    A_t  = G_t - V(s_t), normalised over the batch (mean 0, std 1)
    loss = -mean(log pi(a_t|s_t) A_t) + vf_coef mean((V(s_t) - G_t)^2) - ent_coef mean(H(pi(.|s_t)))

``T`` (the segment length) defaults to the env's ``max_episode_steps`` (500 for CartPole-v1), so
one ``execute`` covers every episode. With a smaller ``T`` the loop runs ``execute``/``get`` until
no env runs and each segment cut bootstraps from the critic, like a truncated episode, whose
return bootstraps from ``V`` of its TRUE final observation (``_observation/frame``).

Run: ``python -m algos.reinforce --help``; ``python -m algos.reinforce --seed 1``.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor, nn

import rlstruct.envs  # noqa: F401 (registers the debug envs, e.g. rlstruct/Repeat-v0)
from rlstruct import Agent, CheckDevice, DictTensor, Trajectories, replay_agent_stateless
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.cli import arg, config_to_dict, parse_config
from rlstruct.devices import resolve_device
from rlstruct.envs import GymEnv
from rlstruct.experiment import LayoutConfig, make_batcher
from rlstruct.logger import RunLogger

FRAME, NEXT_FRAME = K.OBSERVATION + K.FRAME, K.NEXT_OBSERVATION + K.FRAME
ACTION = K.ACTION + K.ACTION_KEY


@dataclass
class Config(LayoutConfig):
    """REINFORCE with a learned baseline on full episodes (see algos/reinforce.py).

    The defaults solve CartPole-v1 in 50-80 iterations of 16 episodes (2 workers x 8 envs): one
    large Adam step per batch (normalised advantages keep its size stable), and a small entropy
    bonus that slows the collapse of the policy's randomness without blocking the 475 target.
    """

    env_id: str = arg("CartPole-v1", "gymnasium id of the environment (discrete actions)")
    n_timesteps: int = arg(0, "T: steps per segment (0: the env's max_episode_steps, else 1000)")
    gamma: float = arg(0.99, "discount factor")
    lr: float = arg(3e-3, "Adam learning rate (actor and critic)")
    hidden: int = arg(64, "width of the two hidden layers of the actor and of the critic")
    vf_coef: float = arg(0.5, "weight of the baseline's MSE loss")
    ent_coef: float = arg(0.01, "weight of the entropy bonus")
    normalize_advantages: bool = arg(True, "normalise advantages over the batch (mean 0, std 1)")
    max_grad_norm: float = arg(1.0, "gradient clipping norm (0: no clipping)")
    max_frames: int = arg(2_000_000, "stop after this many environment frames")
    time_budget: float = arg(600.0, "stop after this many seconds")
    target_return: float | None = arg(475.0, "stop once the last 20 training episodes average this")
    eval_every: int = arg(10, "evaluate the greedy policy every this many iterations (0: never)")
    eval_envs: int = arg(4, "episodes per evaluation")
    n_threads: int = arg(1, "torch threads of the learner (the cores are shared with the workers)")
    runs_dir: str = arg("runs", "folder of the run directories")


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
    """Separate actor (logits) and critic (the baseline V): the value loss's scale never
    disturbs the policy's features."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.actor = mlp(obs_dim, hidden, n_actions, out_gain=0.01)
        self.critic = mlp(obs_dim, hidden, 1, out_gain=1.0)

    def value(self, frame: Tensor) -> Tensor:
        return self.critic(frame.flatten(1).float()).squeeze(-1)

    def logits(self, frame: Tensor) -> Tensor:
        return self.actor(frame.flatten(1).float())


# --------------------------------------------------------------------------------------- agent
class PolicyAgent(Agent):
    """Samples ``a ~ softmax(actor(frame))``; rows with ``agent_info["greedy"]`` take the argmax.

    ``call_replay`` (used by ``replay_agent_stateless`` on the learner) evaluates the STORED
    actions instead: their log-probability, the policy's entropy, ``V(s)`` and ``V(s')``.
    """

    def __init__(self, model: ActorCritic) -> None:
        self.model = model
        self._seed = 0
        self.generator: torch.Generator | None = None

    def seed(self, seed: int) -> None:
        self._seed, self.generator = seed, None

    def __call__(
        self,
        state: DictTensor,
        observation: DictTensor,
        agent_info: DictTensor,
        history: Any = None,
    ) -> tuple[DictTensor, DictTensor]:
        logits = self.model.logits(observation[K.FRAME])
        if self.generator is None or self.generator.device != logits.device:
            self.generator = torch.Generator(logits.device).manual_seed(self._seed)
        action = torch.multinomial(logits.softmax(-1), 1, generator=self.generator).squeeze(1)
        if "greedy" in agent_info:
            greedy = agent_info["greedy"].to(logits.device)
            action = torch.where(greedy, logits.argmax(-1), action)
        return DictTensor({K.ACTION_KEY: action}), state

    def call_replay(
        self, trajectories: Trajectories, t: int, state: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        steps = trajectories.trajectories
        log_probs = self.model.logits(steps[FRAME][:, t]).log_softmax(-1)
        with torch.no_grad():  # V(s') is a target: no gradient flows into it
            next_value = self.model.value(steps[NEXT_FRAME][:, t])
        out = {
            "logp": log_probs.gather(-1, steps[ACTION][:, t, None]).squeeze(-1),
            "entropy": -(log_probs.exp() * log_probs).sum(-1),
            "value": self.model.value(steps[FRAME][:, t]),
            "next_value": next_value,
        }
        return DictTensor(out), state


# --------------------------------------------------------------------------------------- loss
def normalize(x: Tensor, mask: Tensor) -> Tensor:
    """``(x - mean) / (std + 1e-8)`` over the valid steps: the step size no longer depends on the
    scale of the returns, and subtracting the mean is a second, batch-level baseline."""
    mean = F.masked_mean(x, mask)
    std = F.masked_mean((x - mean) ** 2, mask).sqrt()
    return (x - mean) / (std + 1e-8)


def reinforce_loss(
    logp: Tensor,
    entropy: Tensor,
    value: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    vf_coef: float,
    ent_coef: float,
    normalize_advantages: bool = True,
) -> tuple[Tensor, dict[str, float]]:
    """The REINFORCE-with-baseline loss over ``(B, T)`` steps; padding (``~mask``) is ignored.

    Args:
        logp: log pi(a_t|s_t) of the taken actions (with gradients).
        entropy: H(pi(.|s_t)) (with gradients).
        value: V(s_t), the baseline (with gradients).
        returns: G_t, the discounted returns (no gradient).
        mask: bool, the valid steps.
        vf_coef: weight of the baseline's MSE.
        ent_coef: weight of the entropy bonus.
        normalize_advantages: normalise ``A = G - V`` over the valid steps.

    Returns:
        ``(loss, stats)``: stats holds the floats ``loss``, ``policy_loss``, ``value_loss``,
        ``entropy``.
    """
    advantages = (returns - value).detach()
    if normalize_advantages:
        advantages = normalize(advantages, mask)
    policy_loss = -F.masked_mean(logp * advantages, mask)
    value_loss = F.masked_mean((value - returns) ** 2, mask)
    mean_entropy = F.masked_mean(entropy, mask)
    loss = policy_loss + vf_coef * value_loss - ent_coef * mean_entropy
    stats = {
        "loss": loss, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": mean_entropy
    }
    return loss, {k: float(v.detach()) for k, v in stats.items()}


def episode_returns(traj: Trajectories, next_value: Tensor, gamma: float) -> Tensor:
    """Discounted returns ``(B, T)``: terminated steps stop the sum; truncated steps and segment
    cuts bootstrap from ``next_value``, V of the TRUE next observation."""
    steps = traj.trajectories
    return F.discounted_returns(
        steps[K.NEXT_OBSERVATION + K.REWARD],
        steps[K.NEXT_OBSERVATION + K.TERMINATED],
        steps[K.NEXT_OBSERVATION + K.TRUNCATED],
        traj.lengths,
        gamma,
        next_value=next_value,
    )


def row_sums(segments: list[Trajectories], n_rows: int) -> tuple[Tensor, Tensor]:
    """Reward sum and step count of each env (indexed by ``env_id``) over segments, on the CPU."""
    returns, lengths = torch.zeros(n_rows), torch.zeros(n_rows, dtype=torch.long)
    for traj in segments:
        steps, env_id = traj.trajectories, traj.info[K.ENV_ID].cpu()
        reward = torch.where(steps.mask(), steps[K.NEXT_OBSERVATION + K.REWARD], 0.0)
        returns.index_add_(0, env_id, reward.sum(1).cpu())
        lengths.index_add_(0, env_id, traj.lengths.cpu())
    return returns, lengths


# --------------------------------------------------------------------------------------- main
class Evaluator:
    """Greedy episodes on a batcher of their own (``--eval-device``), rlstructures-style:
    :meth:`start` sends the latest weights and launches ``eval_envs`` full episodes, :meth:`poll`
    collects them with ``get(blocking=False)``. ``make_batcher(n_processes=1)`` gives a
    SerialBatcher, which plays the episodes inside ``execute``: cheap when evaluations are rare."""

    def __init__(self, cfg: Config, create_agent: Any, agent_args: dict, agent_info: DictTensor):
        self.batcher = make_batcher(
            device=cfg.eval_device, n_processes=1,
            n_timesteps=gym.spec(cfg.env_id).max_episode_steps or 1000,
            create_agent=create_agent, agent_args=agent_args, create_env=GymEnv,
            env_args={"env": cfg.env_id, "n_envs": cfg.eval_envs}, seeds=cfg.seed + 1000,
            agent_info=agent_info, check_devices=cfg.check_devices,
        )
        self.returns = torch.zeros(cfg.eval_envs)
        self.busy = False

    def start(self, state_dict: dict[str, Tensor]) -> None:
        if not self.busy:  # else the previous evaluation is still playing: let it finish
            self.batcher.update(state_dict)
            self.batcher.reset()
            self.batcher.execute()
            self.returns.zero_()
            self.busy = True

    def poll(self, last: float) -> float:
        """The mean return of the evaluation that has just finished, else ``last``."""
        if not self.busy:
            return last
        traj, n_running = self.batcher.get(blocking=False)
        if traj is None:
            return last
        self.returns += row_sums([traj], len(self.returns))[0]
        if n_running:  # episodes longer than T: play on
            self.batcher.execute()
            return last
        self.busy = False
        return float(self.returns.mean())

    def close(self) -> None:
        self.batcher.close()


def solved(log: RunLogger, target: float | None) -> bool:
    """The stop criterion: the last 20 training episodes average ``target`` or more."""
    return target is not None and log.episodes >= 20 and log.train_return(last=20) >= target


def play_episodes(batcher: Any) -> list[Trajectories]:
    """Plays one episode per env: the segments of ``reset`` -> (``execute`` -> ``get``)* until
    no env runs (one segment when ``T`` covers whole episodes)."""
    batcher.reset()
    segments, n_running = [], batcher.n_elems()
    while n_running:
        batcher.execute()
        traj, n_running = batcher.get()
        segments.append(traj)
    return segments


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
    batcher = make_batcher(
        device=cfg.batcher_device, n_processes=cfg.n_processes,
        n_timesteps=cfg.n_timesteps or gym.spec(cfg.env_id).max_episode_steps or 1000,
        create_agent=PolicyAgent, agent_args={"model": model}, create_env=GymEnv,
        env_args={"env": cfg.env_id, "n_envs": cfg.n_envs}, seeds=cfg.seed,
        check_devices=cfg.check_devices,
    )
    evaluator = None
    if cfg.eval_every > 0:
        eval_info = DictTensor({"greedy": torch.ones(1, dtype=torch.bool)})
        evaluator = Evaluator(cfg, PolicyAgent, {"model": model}, eval_info)
    model.to(device)
    agent = CheckDevice(PolicyAgent(model), device) if cfg.check_devices else PolicyAgent(model)
    # One fused kernel for all of Adam's per-parameter updates: cheaper for a small net.
    fused = device.type in ("cpu", "cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, fused=fused)

    frames, iteration, eval_return, solved_at = 0, 0, math.nan, None
    with contextlib.ExitStack() as stack:
        stack.enter_context(batcher)
        if evaluator is not None:
            stack.callback(evaluator.close)
        log = stack.enter_context(
            RunLogger("reinforce", cfg.env_id, cfg, cfg.runs_dir, total_frames=cfg.max_frames)
        )
        while frames < cfg.max_frames and time.monotonic() - start < cfg.time_budget:
            # 1. Collect B full episodes with the current policy.
            segments = play_episodes(batcher)
            returns, lengths = row_sums(segments, batcher.n_elems())
            frames += int(lengths.sum())
            log.record_episodes(returns, lengths, frames=frames)

            # 2. One gradient step: replay the agent on the learner device, then the loss.
            traj = Trajectories.cat(segments).to(device)
            out = replay_agent_stateless(agent, traj)
            loss, stats = reinforce_loss(
                out["logp"], out["entropy"], out["value"],
                episode_returns(traj, out["next_value"], cfg.gamma), traj.trajectories.mask(),
                vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef,
                normalize_advantages=cfg.normalize_advantages,
            )
            optimizer.zero_grad()
            loss.backward()
            if cfg.max_grad_norm > 0:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            batcher.update(model.state_dict())
            iteration += 1

            # 3. Evaluation: poll without blocking; restart every eval_every iterations.
            if evaluator is not None:
                eval_return = evaluator.poll(eval_return)
                if iteration % cfg.eval_every == 0:
                    evaluator.start(model.state_dict())

            log.log(frames, eval_return=eval_return, lr=cfg.lr, **stats)
            if solved(log, cfg.target_return):
                solved_at = (frames, time.monotonic() - start)
                break
        log.checkpoint(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "config": config_to_dict(cfg), "frames": frames},
            score=log.train_return(last=20),
        )
    summary = {
        "run_dir": str(log.dir),
        "frames": frames,
        "iterations": iteration,
        "solved": solved_at is not None,
        "train_return": log.train_return(last=20),
        "eval_return": eval_return,
        "wall_time": time.monotonic() - start,
        "frames_to_solve": None if solved_at is None else solved_at[0],
        "time_to_solve": None if solved_at is None else solved_at[1],
    }
    print(f"reinforce: {summary}\noutputs in {log.dir}")
    return summary


if __name__ == "__main__":
    main(parse_config(Config, sys.argv[1:]))
