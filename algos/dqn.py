"""DQN (Mnih et al., 2015) with the double (van Hasselt et al., 2016) and dueling (Wang et
al., 2016) variants, on auto-reset ``GymEnvInf`` segments.

Each iteration takes a segment of ``B x T`` steps from the batcher (epsilon-greedy, epsilon passed
PER ROW in ``agent_info``), stores its valid steps in a ``ReplayBuffer`` on the learner device,
starts the next segment (worker processes, if any, collect it while we learn), then takes
``updates_per_batch`` gradient steps on uniform samples of the buffer:

    y    = r + gamma (1 - terminated) Q_target(s', a*)      (F.td_targets)
    a*   = argmax_a Q(s', a) with --double, argmax_a Q_target(s', a) without
    loss = Huber(Q(s, a) - y)

A truncated step bootstraps like any other, from the TRUE final observation
(``_observation/frame``); only termination removes the bootstrap. Every ``target_update_every``
gradient steps the target network moves towards the online one: ``target <- tau online +
(1 - tau) target`` (``tau=1``: hard copies; ``--tau 0.005 --target-update-every 1``: Polyak).

Run: ``python -m algos.dqn --help``; ``python -m algos.dqn --seed 1 --dueling``.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor, nn

import rlstruct.envs  # noqa: F401 (registers the debug envs, e.g. rlstruct/Repeat-v0)
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
from rlstruct.envs import GymEnv, GymEnvInf
from rlstruct.experiment import LayoutConfig, make_batcher
from rlstruct.logger import RunLogger
from rlstruct.replay_buffer import ReplayBuffer

FRAME, NEXT_FRAME = K.OBSERVATION + K.FRAME, K.NEXT_OBSERVATION + K.FRAME
ACTION = K.ACTION + K.ACTION_KEY
REWARD, DONE = K.NEXT_OBSERVATION + K.REWARD, K.NEXT_OBSERVATION + K.DONE
ENV_STEP = K.NEXT_OBSERVATION + K.ENV_STEP
TERMINATED, TRUNCATED = K.NEXT_OBSERVATION + K.TERMINATED, K.NEXT_OBSERVATION + K.TRUNCATED
STORED_KEYS = (FRAME, ACTION, NEXT_FRAME, REWARD, TERMINATED, TRUNCATED)


@dataclass
class Config(LayoutConfig):
    """DQN with double/dueling options, hard or soft target updates (see algos/dqn.py).

    The defaults solve CartPole-v1 in about 30k gradient steps, and the gradient steps are
    what costs time on a CPU. Hence a small net, 1 step per 4 frames (frames are cheap: B=8 envs
    x T=32 steps cost a few ms), a buffer that keeps the rare failures of good policies (the
    whole run fits in it), and hard target copies every 256 steps (more often diverged).
    """

    # Collecting a segment costs a few ms, the gradient steps ~20x more: worker processes
    # would only compete with the learner for the cores, so one (serial) batcher by default.
    n_processes: int = arg(1, "training worker processes on the CPU (0: one per core)")
    env_id: str = arg("CartPole-v1", "gymnasium id of the environment (discrete actions)")
    n_timesteps: int = arg(32, "T: steps per segment (B x T frames per iteration)")
    gamma: float = arg(0.99, "discount factor")
    lr: float = arg(1e-3, "Adam learning rate")
    hidden: int = arg(64, "width of the two hidden layers")
    double: bool = arg(True, "double DQN: the online network picks a*, the target evaluates it")
    dueling: bool = arg(False, "dueling head: Q = V + A - mean(A)")
    buffer_size: int = arg(200_000, "replay buffer capacity (transitions)")
    batch_size: int = arg(128, "transitions per gradient step")
    learning_starts: int = arg(1_000, "frames collected before the first gradient step")
    updates_per_batch: int = arg(64, "gradient steps per collected segment")
    target_update_every: int = arg(256, "gradient steps between target updates")
    tau: float = arg(1.0, "target update rate (1: hard copy; 0.005 with every 1: Polyak)")
    eps_start: float = arg(1.0, "epsilon at the start of the linear schedule")
    eps_end: float = arg(0.05, "epsilon at the end of the schedule")
    eps_frames: int = arg(10_000, "frames over which epsilon decays linearly")
    eps_spread: float = arg(0.0, "per-row spread: row i uses eps^(1 + spread i / (B - 1))")
    max_grad_norm: float = arg(10.0, "gradient clipping norm (0: no clipping)")
    max_frames: int = arg(1_000_000, "stop after this many environment frames")
    time_budget: float = arg(600.0, "stop after this many seconds")
    target_return: float | None = arg(475.0, "stop once the last 20 training episodes average this")
    eval_every: int = arg(20, "evaluate the greedy policy every this many iterations (0: never)")
    eval_envs: int = arg(4, "episodes per evaluation")
    log_every: int = arg(4, "iterations between progress.csv rows")
    n_threads: int = arg(1, "torch threads of the learner (the cores are shared with the workers)")
    runs_dir: str = arg("runs", "folder of the run directories")


# --------------------------------------------------------------------------------------- model
class QNetwork(nn.Module):
    """``Q(s, .)``: a two-layer ReLU MLP, with a plain or a dueling head."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int, dueling: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.advantage = nn.Linear(hidden, n_actions)
        self.value = nn.Linear(hidden, 1) if dueling else None

    def forward(self, frame: Tensor) -> Tensor:
        x = self.body(frame.flatten(1).float())
        if self.value is None:
            return self.advantage(x)
        advantage = self.advantage(x)
        # Subtracting the mean makes V and A identifiable (Wang et al., eq. 9).
        return self.value(x) + advantage - advantage.mean(-1, keepdim=True)


# --------------------------------------------------------------------------------------- agent
class QAgent(Agent):
    """Epsilon-greedy on ``Q(s, .)``, epsilon read per row from ``agent_info["epsilon"]``
    (absent: greedy). ``call_replay`` returns ``Q(s, .)`` and ``Q(s', .)`` for the loss."""

    def __init__(self, model: QNetwork) -> None:
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
        q = self.model(observation[K.FRAME])
        n, n_actions = q.shape
        if self.generator is None or self.generator.device != q.device:
            self.generator = torch.Generator(q.device).manual_seed(self._seed)
        action = q.argmax(-1)
        if "epsilon" in agent_info:
            epsilon = agent_info["epsilon"].to(q.device)
            # One draw of each per row and step, explored or not: a stable random stream.
            explore = torch.rand(n, generator=self.generator, device=q.device) < epsilon
            random = torch.randint(n_actions, (n,), generator=self.generator, device=q.device)
            action = torch.where(explore, random, action)
        return DictTensor({K.ACTION_KEY: action}), state

    def call_replay(
        self, trajectories: Trajectories, t: int, state: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        steps = trajectories.trajectories
        n = steps.n_elems()
        q = self.model(torch.cat([steps[FRAME][:, t], steps[NEXT_FRAME][:, t]]))  # one pass
        return DictTensor({"q": q[:n], "next_q": q[n:]}), state


# --------------------------------------------------------------------------------------- loss
def as_trajectories(sample: DictTensor) -> Trajectories:
    """Buffer transitions ``(N, *feat)`` as ``N`` trajectories of one step, for replay; the
    replayed policy is greedy (epsilon 0)."""
    n = sample.n_elems()
    device = sample.device()
    ones = torch.ones(n, dtype=torch.long, device=device)
    steps = TemporalDictTensor({k: v.unsqueeze(1) for k, v in sample.items()}, ones)
    info = DictTensor({K.AGENT_INFO + "epsilon": torch.zeros(n, device=device)})
    return Trajectories(info, steps)


def dqn_loss(
    q: Tensor,
    action: Tensor,
    reward: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    next_q_online: Tensor,
    next_q_target: Tensor,
    *,
    gamma: float,
    double: bool,
) -> tuple[Tensor, dict[str, float]]:
    """The Huber TD loss over ``(B, T)`` transitions (``T = 1`` for buffer samples).

    Args:
        q: ``(B, T, A)`` Q(s, .) of the online network (with gradients).
        action: ``(B, T)`` int64, the taken actions.
        reward, terminated, truncated: ``(B, T)``, the env's answer to each action.
        next_q_online: ``(B, T, A)`` Q(s', .) of the online network (picks a* with ``double``).
        next_q_target: ``(B, T, A)`` Q(s', .) of the target network.
        gamma: discount.
        double: double DQN's a* (else the target network's own argmax).

    Returns:
        ``(loss, stats)``: stats holds the floats ``loss``, ``q`` (mean Q(s, a)) and
        ``td_error`` (mean |y - Q(s, a)|).
    """
    q_taken = q.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        chooser = next_q_online if double else next_q_target
        best = chooser.argmax(-1, keepdim=True)
        next_value = next_q_target.gather(-1, best).squeeze(-1)
        target = F.td_targets(reward, next_value, terminated, truncated, gamma)
    loss = nn.functional.smooth_l1_loss(q_taken, target)
    stats = {"loss": loss, "q": q_taken.mean(), "td_error": (target - q_taken).abs().mean()}
    return loss, {k: float(v.detach()) for k, v in stats.items()}


@torch.no_grad()
def update_target(target: nn.Module, online: nn.Module, tau: float) -> None:
    """``target <- tau online + (1 - tau) target``, parameter by parameter (tau=1: a copy)."""
    for t, o in zip(target.parameters(), online.parameters()):
        t.lerp_(o, tau)


def epsilon(frames: int, n_rows: int, cfg: Config) -> DictTensor:
    """Per-row epsilon: the linear schedule's value, spread over the rows (Ape-X style) when
    ``eps_spread > 0`` so that some rows explore more than others."""
    progress = min(1.0, frames / max(1, cfg.eps_frames))
    eps = cfg.eps_start + progress * (cfg.eps_end - cfg.eps_start)
    power = 1.0 + cfg.eps_spread * torch.arange(n_rows) / max(1, n_rows - 1)
    return DictTensor({"epsilon": eps**power})


def finished_episodes(traj: Trajectories, acc: Tensor) -> tuple[Tensor, Tensor]:
    """Returns and lengths of the episodes that ended in a segment of an auto-reset batcher.

    ``acc`` (float ``(n_envs,)``) carries each env's running return across segments; rows are
    matched to envs by ``info["env_id"]``. An episode's length is ``env_step`` of its final
    observation.
    """
    steps = traj.trajectories.get([REWARD, DONE, ENV_STEP]).to("cpu")
    env_id = traj.info[K.ENV_ID].cpu()
    reward = torch.where(steps.mask(), steps[REWARD], 0.0)
    done = steps[DONE] & steps.mask()
    running, returns, lengths = acc[env_id], [], []
    for t in range(steps.n_timesteps()):
        running = running + reward[:, t]
        returns.append(running[done[:, t]])
        lengths.append(steps[ENV_STEP][:, t][done[:, t]])
        running = torch.where(done[:, t], 0.0, running)
    acc[env_id] = running
    return torch.cat(returns), torch.cat(lengths)


# --------------------------------------------------------------------------------------- main
def solved(log: RunLogger, target: float | None) -> bool:
    """The stop criterion: the last 20 training episodes average ``target`` or more."""
    return target is not None and log.episodes >= 20 and log.train_return(last=20) >= target


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
        steps = traj.trajectories
        reward = torch.where(steps.mask(), steps[REWARD], 0.0).sum(1)
        self.returns.index_add_(0, traj.info[K.ENV_ID].cpu(), reward.cpu())
        if n_running:  # episodes longer than T: play on
            self.batcher.execute()
            return last
        self.busy = False
        return float(self.returns.mean())

    def close(self) -> None:
        self.batcher.close()


def main(cfg: Config) -> dict[str, Any]:
    """Trains until ``target_return``, ``max_frames`` or ``time_budget``; returns a summary."""
    start = time.monotonic()  # wall_time and time_to_solve include the workers' start-up
    torch.set_num_threads(cfg.n_threads)
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.learner_device)
    probe = gym.make(cfg.env_id)
    obs_dim, n_actions = math.prod(probe.observation_space.shape), int(probe.action_space.n)
    probe.close()
    model = QNetwork(obs_dim, n_actions, cfg.hidden, cfg.dueling)  # CPU: the batchers copy it
    batcher = make_batcher(
        device=cfg.batcher_device, n_processes=cfg.n_processes, n_timesteps=cfg.n_timesteps,
        create_agent=QAgent, agent_args={"model": model}, create_env=GymEnvInf,
        env_args={"env": cfg.env_id, "n_envs": cfg.n_envs}, seeds=cfg.seed,
        agent_info=DictTensor({"epsilon": torch.ones(1)}), check_devices=cfg.check_devices,
    )
    evaluator = None
    if cfg.eval_every > 0:  # greedy: epsilon 0
        eval_info = DictTensor({"epsilon": torch.zeros(1)})
        evaluator = Evaluator(cfg, QAgent, {"model": model}, eval_info)
    model.to(device)
    agent = CheckDevice(QAgent(model), device) if cfg.check_devices else QAgent(model)
    target = copy.deepcopy(model).requires_grad_(False)
    # One fused kernel for all of Adam's per-parameter updates: cheaper for a small net.
    fused = device.type in ("cpu", "cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, fused=fused)
    buffer = ReplayBuffer(cfg.buffer_size, device=device, keys=STORED_KEYS)
    n_rows = batcher.n_elems()
    running_returns = torch.zeros(n_rows)

    frames, iteration, n_updates, eval_return, solved_at = 0, 0, 0, math.nan, None
    stats: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(batcher)
        if evaluator is not None:
            stack.callback(evaluator.close)
        log = stack.enter_context(
            RunLogger("dqn", cfg.env_id, cfg, cfg.runs_dir, total_frames=cfg.max_frames)
        )
        batcher.reset(agent_info=epsilon(0, n_rows, cfg))
        batcher.execute()
        while True:
            # 1. Store the segment, start the next one (worker processes collect it meanwhile).
            traj, _ = batcher.get()
            frames += int(traj.lengths.sum())
            buffer.add(traj)
            returns, lengths = finished_episodes(traj, running_returns)
            log.record_episodes(returns, lengths, frames=frames)
            batcher.update(model.state_dict())
            batcher.execute(agent_info=epsilon(frames, n_rows, cfg))
            iteration += 1

            # 2. Gradient steps on uniform samples. Q(s, .) and Q(s', .) come from replaying the
            # agent on the learner device; the target network only evaluates s': called directly.
            for _ in range(cfg.updates_per_batch if len(buffer) >= cfg.learning_starts else 0):
                sample = as_trajectories(buffer.sample(cfg.batch_size))
                out = replay_agent_stateless(agent, sample)
                steps = sample.trajectories
                with torch.no_grad():
                    next_q_target = target(steps[NEXT_FRAME][:, 0]).unsqueeze(1)
                loss, stats = dqn_loss(
                    out["q"], steps[ACTION], steps[REWARD], steps[TERMINATED], steps[TRUNCATED],
                    out["next_q"].detach(), next_q_target, gamma=cfg.gamma, double=cfg.double,
                )
                optimizer.zero_grad()
                loss.backward()
                if cfg.max_grad_norm > 0:
                    nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                n_updates += 1
                if n_updates % cfg.target_update_every == 0:
                    update_target(target, model, cfg.tau)

            # 3. Evaluation: poll without blocking; restart every eval_every iterations.
            if evaluator is not None:
                eval_return = evaluator.poll(eval_return)
                if iteration % cfg.eval_every == 0:
                    evaluator.start(model.state_dict())

            if solved(log, cfg.target_return):
                solved_at = (frames, time.monotonic() - start)
            elapsed = time.monotonic() - start
            stop = solved_at is not None or frames >= cfg.max_frames or elapsed >= cfg.time_budget
            if iteration % cfg.log_every == 0 or stop:
                eps = float(epsilon(frames, n_rows, cfg)["epsilon"].mean())
                log.log(frames, eval_return=eval_return, updates=n_updates, epsilon=eps, **stats)
            if stop:
                break
        log.checkpoint(
            {"model": model.state_dict(), "target": target.state_dict(),
             "optimizer": optimizer.state_dict(), "config": config_to_dict(cfg),
             "frames": frames},
            score=log.train_return(last=20),
        )
    summary = {
        "run_dir": str(log.dir),
        "frames": frames,
        "updates": n_updates,
        "solved": solved_at is not None,
        "train_return": log.train_return(last=20),
        "eval_return": eval_return,
        "wall_time": time.monotonic() - start,
        "frames_to_solve": None if solved_at is None else solved_at[0],
        "time_to_solve": None if solved_at is None else solved_at[1],
    }
    print(f"dqn: {summary}\noutputs in {log.dir}")
    return summary


if __name__ == "__main__":
    main(parse_config(Config, sys.argv[1:]))
