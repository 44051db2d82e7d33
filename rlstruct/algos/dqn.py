"""DQN (Mnih et al., 2015) with the double (van Hasselt et al., 2016) and dueling (Wang et
al., 2016) variants, on auto-reset ``GymEnvInf`` segments.

Each iteration takes a segment of ``B x T`` steps from the batcher (epsilon-greedy, epsilon passed
PER ROW in ``agent_info``), stores its valid steps in a ``ReplayBuffer`` on the learner device,
starts the next segment with ``run.publish`` (the new weights and epsilon; worker processes,
if any, collect it while we learn), then takes ``updates_per_batch`` gradient steps on uniform
samples of the buffer:

    y    = r + gamma (1 - terminated) Q_target(s', a*)      (F.td_targets)
    a*   = argmax_a Q(s', a) with --double, argmax_a Q_target(s', a) without
    loss = Huber(Q(s, a) - y)

A truncated step bootstraps from the TRUE final observation. Every ``target_update_every``
steps ``target <- tau online + (1 - tau) target`` (1: hard copies; 0.005, every 1: Polyak).
Run: ``rlstruct train dqn --help``; Atari (the CNN, a FrameReplayBuffer): ``--preset atari``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from rlstruct import Agent, DictTensor, Trajectories, replay_agent_stateless
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.algos.presets import DQN_PRESETS
from rlstruct.blocks import masks
from rlstruct.blocks.frame_buffer import FrameReplayBuffer
from rlstruct.blocks.nets import QNetwork  # where checkpoints of earlier versions name it
from rlstruct.blocks.obs_input import cat_inputs, expand_inputs, model_input
from rlstruct.blocks.optim import Optimizer, adam, gradient_step
from rlstruct.blocks.replay_buffer import ReplayBuffer, ReplayCheckpoint, replay_memory_problems
from rlstruct.devices import learner_autocast
from rlstruct.envs import GymEnvInf
from rlstruct.envs.registry import ATARI_BACKENDS
from rlstruct.runs.presets import Preset
from rlstruct.runs.resolve import Resolved, run_cli
from rlstruct.runs.run import Run, RunConfig

STORED_KEYS = (K.OBS_FRAME, K.STORED_ACTION, K.NEXT_FRAME, K.NEXT_REWARD, K.NEXT_TERMINATED,
               K.NEXT_TRUNCATED)


@dataclass
class Config(RunConfig, ReplayCheckpoint):
    """DQN with double/dueling options, hard or soft target updates (rlstruct train dqn).

    The defaults solve CartPole-v1 in about 30k gradient steps, what costs time on a CPU: a
    small net, 1 step per 4 frames, a buffer that keeps the rare failures of good policies (the
    whole run fits in it), hard target copies every 256 steps (more often diverged)."""
    action_spaces: ClassVar[tuple[str, ...]] = ("Discrete",)
    presets: ClassVar[dict[str, Preset]] = DQN_PRESETS

    n_timesteps: int = 16
    max_grad_norm: float = 10.0
    double: bool = True
    """double DQN: the online network picks a*, the target network evaluates it"""
    dueling: bool = False
    """dueling head: Q = V + A - mean(A)"""
    model: Literal["mlp", "cnn"] = "mlp"
    """mlp on flattened observations, or the Nature CNN on stacked uint8 frames (--env-backend
    atari), whose replay buffer stores each frame once (FrameReplayBuffer)"""
    buffer_size: int = 200_000
    """replay buffer capacity (transitions)"""
    batch_size: int = 128
    """transitions per gradient step"""
    learning_starts: int = 1_000
    """frames collected before the first gradient step"""
    updates_per_batch: int = 64
    """gradient steps per collected segment"""
    target_update_every: int = 256
    """gradient steps between target updates"""
    tau: float = 1.0
    """target update rate (1: hard copy; 0.005 with target_update_every 1: Polyak)"""
    eps_start: float = 1.0
    """epsilon at the start of the linear schedule"""
    eps_end: float = 0.05
    """epsilon at the end of the schedule"""
    eps_frames: int = 10_000
    """frames over which epsilon decays linearly"""
    eps_spread: float = 0.0
    """per-row spread: row i uses eps^(1 + spread i / (B - 1))"""

    def world_problems(self, obs_shape: tuple[int, ...], action_space: Any) -> list[str]:
        # uint8 frames, float observations
        itemsize = 1 if self.env_backend in ATARI_BACKENDS else 4
        if self.model == "cnn" and len(obs_shape) != 3:
            return [f"--model cnn takes stacked frames (C, H, W), but {self.env_id}'s are "
                    f"{tuple(obs_shape)}: use --model mlp, or an env with --env-backend atari"]
        return replay_memory_problems(self.buffer_size, obs_shape, itemsize, 1,
                                      stacked=self.model == "cnn")


# --------------------------------------------------------------------------------------- agent
class QAgent(Agent):
    """Epsilon-greedy on ``Q(s, .)``, epsilon read per row from ``agent_info["epsilon"]``
    (absent: greedy), among the legal actions of the observation's ``action_mask`` if any.
    ``call_replay`` returns ``Q(s, .)``, and ``Q(s', .)`` for double DQN's choice of a*
    (``double``; without it the online net never sees s')."""

    def __init__(self, model: QNetwork, double: bool = True) -> None:
        self.model, self.double = model, double
        self._seed = 0
        self.generator: torch.Generator | None = None  # created on the device of the first call

    def seed(self, seed: int) -> None:
        self._seed, self.generator = seed, None

    def __call__(
        self, state: DictTensor, observation: DictTensor, agent_info: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        q = self.model(model_input(observation))
        if self.generator is None or self.generator.device != q.device:
            self.generator = torch.Generator(q.device).manual_seed(self._seed)
        epsilon = agent_info["epsilon"] if "epsilon" in agent_info else None  # noqa: SIM401
        mask = masks.observation_mask(observation)
        action = masks.epsilon_greedy(q, mask, epsilon, self.generator)
        return DictTensor({K.ACTION_KEY: action}), state

    def call_replay(
        self, trajectories: Trajectories, t: int, state: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        steps = trajectories.trajectories
        obs = model_input(steps, K.OBSERVATION)[:, t]
        if not self.double:
            return DictTensor({"q": self.model(obs)}), state
        n = steps.n_elems()
        q = self.model(cat_inputs([obs, model_input(steps, K.NEXT_OBSERVATION)[:, t]]))
        return DictTensor({"q": q[:n], "next_q": q[n:]}), state


# --------------------------------------------------------------------------------------- loss
def dqn_loss(
    q: Tensor, action: Tensor, reward: Tensor, terminated: Tensor, truncated: Tensor,
    next_q_online: Tensor, next_q_target: Tensor, *, gamma: float, double: bool,
    next_mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The Huber TD loss over ``N`` transitions (a buffer sample).

    Args:
        q: ``(N, A)`` Q(s, .) of the online network (with gradients).
        action: ``(N,)`` int64, the taken actions.
        reward, terminated, truncated: ``(N,)``, the env's answer to each action.
        next_q_online: ``(N, A)`` Q(s', .) of the online network (picks a* with ``double``).
        next_q_target: ``(N, A)`` Q(s', .) of the target network.
        gamma: discount.
        double: double DQN's a* (else the target network's own argmax).
        next_mask: ``(N, A)`` the legal actions of s' (a* is one of them), or None: all.

    Returns:
        ``(loss, stats)``: stats holds the floats ``loss``, ``q`` (mean Q(s, a)) and
        ``td_error`` (mean |y - Q(s, a)|).
    """
    q_taken = q.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        chooser = next_q_online if double else next_q_target
        best = masks.mask_logits(chooser, next_mask).argmax(-1, keepdim=True)
        next_value = next_q_target.gather(-1, best)  # (N, 1): td_targets reads (B, T) steps
        target = F.td_targets(reward[:, None], next_value, terminated[:, None], truncated[:, None],
                              gamma).squeeze(1)
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


def learn(
    agent: Agent, target: nn.Module, optimizer: Optimizer, sample: DictTensor,
    cfg: Config,
) -> dict[str, float]:
    """One gradient step on a buffer sample. Q(s, .) and Q(s', .) come from replaying the agent
    on the transitions; the target network only evaluates s': it is called directly."""
    with learner_autocast(sample.device(), cfg.precision):  # --precision bf16: the CNN trunk
        out = replay_agent_stateless(agent, sample)
        with torch.no_grad():
            next_q_target = target(model_input(sample, K.NEXT_OBSERVATION))
    next_q_online = out["next_q"].detach() if cfg.double else next_q_target
    loss, stats = dqn_loss(
        out["q"], sample[K.STORED_ACTION], sample[K.NEXT_REWARD], sample[K.NEXT_TERMINATED],
        sample[K.NEXT_TRUNCATED], next_q_online, next_q_target, gamma=cfg.gamma,
        double=cfg.double, next_mask=masks.next_mask(sample),
    )
    gradient_step(optimizer, loss, cfg.max_grad_norm)
    return stats


# --------------------------------------------------------------------------------------- main
def main(cfg: Config | Resolved[Config]) -> dict[str, Any]:
    """Trains until the target return, ``max_frames`` or ``time_budget``; returns the summary."""
    with Run("dqn", cfg) as run:
        cfg = run.cfg  # resolved: the layout file applied, --resume auto picked
        model = run.model(run.factory(QNetwork, run.obs_dim, run.n_actions, cfg.hidden,
                                      cfg.dueling, cfg.model, run.obs_shape[0]))
        explore = DictTensor({"epsilon": torch.ones(1)})  # the schedule sets it per row
        batcher = run.training_batcher(QAgent, {"model": model}, GymEnvInf, cfg.n_timesteps,
                                       agent_info=explore, pipelined=False)
        run.evaluator(QAgent, {"model": model}, agent_info=DictTensor({"epsilon": torch.zeros(1)}))
        agent = run.learner(QAgent(model, cfg.double))
        target = copy.deepcopy(model).requires_grad_(False)
        optimizer = adam(model.parameters(), cfg.lr, run.device)
        buffer = (FrameReplayBuffer if cfg.model == "cnn" else ReplayBuffer)(
            cfg.buffer_size, device=run.device,
            keys=(*expand_inputs(STORED_KEYS, run.obs_spec), K.NEXT_ACTION_MASK))
        run.checkpoint_state(model=model, target=target, optimizer=optimizer)
        run.resume_state(**{"buffer": buffer} if cfg.checkpoint_buffer else {})  # --resume
        n_rows, n_updates, stats = batcher.n_elems(), 0, {}
        # 1. Store each segment and start the next one (the workers collect it meanwhile).
        for traj in run.segments(batcher, agent_info=epsilon(0, n_rows, cfg)):
            buffer.add(masks.with_next_mask(traj, run.n_actions))
            run.publish(batcher, model.state_dict(), agent_info=epsilon(run.frames, n_rows, cfg))
            # 2. Gradient steps on uniform samples of the buffer, on the learner device.
            for _ in range(cfg.updates_per_batch if len(buffer) >= cfg.learning_starts else 0):
                if run.out_of_time():  # the time budget holds within long learn phases too
                    break
                stats = learn(agent, target, optimizer, buffer.sample(cfg.batch_size), cfg)
                n_updates += 1
                if n_updates % cfg.target_update_every == 0:
                    update_target(target, model, cfg.tau)
            eps = epsilon(run.frames, n_rows, cfg)["epsilon"].mean()  # the mean over the rows
            run.end_iteration(model.state_dict(), lr=cfg.lr, updates=n_updates, epsilon=eps,
                              **stats)
    return run.summary


if __name__ == "__main__":
    run_cli(main, Config, prog="python -m rlstruct.algos.dqn")
