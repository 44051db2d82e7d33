"""A2C with GAE(lambda) on auto-reset segments; ``--recurrent`` gives the policy a GRU memory.

One iteration:

1. **Collect**: the training batcher steps ``B = n_processes * n_envs`` auto-reset envs
   (``GymEnvInf``) for ``T`` steps. The agent stores ``action``, ``logits`` and ``value``; a
   recurrent agent carries ``h`` in its state, resets it where ``observation["initial_state"]``
   is true, and the batcher records the state at the segment start in ``info["agent_state/h"]``.
2. **Replay** the agent on the learner device, with gradients: ``replay_agent`` for the GRU
   policy, starting from the stored ``agent_state/h``, so the memory of an episode that began
   in an earlier segment is restored exactly; ``replay_agent_stateless`` (one batched call) for
   the memoryless policy.
3. **One gradient step** on ``-logp(a) A + vf_coef (V - R)^2 - ent_coef H`` with GAE(lambda)
   advantages ``A`` and returns ``R``. ``V'`` of the TRUE next observations
   (``_observation/frame``) comes from one batched, gradient-free call (for the GRU policy from
   the state after each step): terminated steps do not bootstrap, truncated steps and segment
   cuts bootstrap from ``V'``.
4. **Publish**: ``batcher.update(state_dict)``; the workers collect the next segment while the
   learner logs and evaluates.

Run: ``python -m algos.a2c --help``; ``python -m algos.a2c --recurrent``.
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

from rlstruct import (
    Agent,
    CheckDevice,
    DictTensor,
    TemporalDictTensor,
    Trajectories,
    masked_dicttensor,
    replay_agent,
    replay_agent_stateless,
)
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.cli import arg, config_to_dict, parse_config
from rlstruct.devices import resolve_device
from rlstruct.envs import GymEnv, GymEnvInf  # (also registers rlstruct/Repeat-v0)
from rlstruct.episodes import EpisodeReturns
from rlstruct.experiment import LayoutConfig, make_batcher
from rlstruct.logger import RunLogger

FRAME, NEXT_FRAME = K.OBSERVATION + K.FRAME, K.NEXT_OBSERVATION + K.FRAME
ACTION = K.ACTION + K.ACTION_KEY
REWARD, DONE = K.NEXT_OBSERVATION + K.REWARD, K.NEXT_OBSERVATION + K.DONE


@dataclass
class Config(LayoutConfig):
    """A2C with GAE on auto-reset segments (see algos/a2c.py); defaults tuned for CartPole-v1."""

    env_id: str = arg("CartPole-v1", "gymnasium id of the environment (discrete actions)")
    recurrent: bool = arg(False, "GRU policy: memory in the agent state, replayed from agent_state")
    n_timesteps: int = arg(32, "T: steps per env and segment (one gradient step per segment)")
    hidden: int = arg(64, "width of the hidden layers (and of the GRU state)")
    lr: float = arg(4e-3, "Adam learning rate")
    gamma: float = arg(0.99, "discount factor")
    gae_lambda: float = arg(0.95, "GAE lambda")
    vf_coef: float = arg(0.5, "weight of the value loss")
    ent_coef: float = arg(0.0, "weight of the entropy bonus")
    normalize_advantages: bool = arg(True, "normalise advantages over the batch (mean 0, std 1)")
    max_grad_norm: float = arg(0.5, "clip the global gradient norm to this")
    max_frames: int = arg(1_000_000, "stop after this many environment frames")
    time_budget: float = arg(600.0, "stop after this many seconds")
    target_return: float | None = arg(475.0, "stop once target_window episodes average this")
    target_window: int = arg(20, "training episodes averaged for target_return")
    eval_every: int = arg(50, "evaluate the greedy policy every this many iterations (0: never)")
    eval_envs: int = arg(4, "episodes per evaluation")
    checkpoint_every: int = arg(200, "save checkpoints/latest.pt every this many iterations")
    n_threads: int = arg(1, "torch threads of the learner (the cores are shared with the workers)")
    runs_dir: str = arg("runs", "folder of the run directories")


# --------------------------------------------------------------------------------------- model
def linear(n_in: int, n_out: int, gain: float) -> nn.Linear:
    """A linear layer with orthogonal weights; a small gain starts the policy uniform."""
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def mlp(n_in: int, hidden: int, n_out: int, out_gain: float) -> nn.Sequential:
    """Two tanh hidden layers (gain sqrt 2), then a linear output layer with ``out_gain``."""
    g = math.sqrt(2)
    return nn.Sequential(linear(n_in, hidden, g), nn.Tanh(), linear(hidden, hidden, g), nn.Tanh(),
                         linear(hidden, n_out, out_gain))


class MLPActorCritic(nn.Module):
    """Memoryless: separate actor and critic MLPs.
    ``forward(frame, None) -> (logits (n, A), value (n,), None)``."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.actor = mlp(obs_dim, hidden, n_actions, out_gain=0.01)
        self.critic = mlp(obs_dim, hidden, 1, out_gain=1.0)

    def forward(self, frame: Tensor, h: Tensor | None) -> tuple[Tensor, Tensor, None]:
        x = frame.flatten(1).float()
        return self.actor(x), self.critic(x).squeeze(-1), None


class GRUNet(nn.Module):
    """tanh encoder ``x`` -> GRU cell ``h'`` -> linear head over ``[x, h']`` (the skip gives the
    head the current observation directly; the memory adds what the past tells)."""

    def __init__(self, obs_dim: int, hidden: int, n_out: int, out_gain: float) -> None:
        super().__init__()
        self.encoder = nn.Sequential(linear(obs_dim, hidden, math.sqrt(2)), nn.Tanh())
        self.gru = nn.GRUCell(hidden, hidden)
        self.head = linear(2 * hidden, n_out, out_gain)

    def forward(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        x = self.encoder(x)
        h = self.gru(x, h)
        return self.head(torch.cat([x, h], -1)), h


class GRUActorCritic(nn.Module):
    """Recurrent: a GRU actor and a GRU critic; the state ``h`` holds both memories side by side
    (a shared torso would let the value loss's gradients drown the policy's).
    ``forward(frame, h (n, 2 hidden)) -> (logits (n, A), value (n,), h' (n, 2 hidden))``."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.state_size = 2 * hidden
        self.actor = GRUNet(obs_dim, hidden, n_actions, out_gain=0.01)
        self.critic = GRUNet(obs_dim, hidden, 1, out_gain=1.0)

    def forward(self, frame: Tensor, h: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        x = frame.flatten(1).float()
        h_actor, h_critic = h.chunk(2, -1)
        logits, h_actor = self.actor(x, h_actor)
        value, h_critic = self.critic(x, h_critic)
        return logits, value.squeeze(-1), torch.cat([h_actor, h_critic], -1)


# --------------------------------------------------------------------------------------- agent
class A2CAgent(Agent):
    """Samples ``a ~ softmax(logits)`` (the argmax on rows with ``agent_info["greedy"]``) and
    returns ``action``, ``logits`` and ``value``.

    With a ``GRUActorCritic`` the state is ``{"h": (n, 2 hidden)}``, zeros at an episode start.
    ``call_replay`` (used by ``replay_agent`` / ``replay_agent_stateless`` on the learner)
    samples nothing: it returns the differentiable ``logits`` and ``value`` of the stored
    observations, plus ``h``, the state after the step (to value the next observation).
    """

    def __init__(self, model: MLPActorCritic | GRUActorCritic) -> None:
        self.model = model
        self.recurrent = isinstance(model, GRUActorCritic)
        self._seed = 0
        self.generator: torch.Generator | None = None

    def seed(self, seed: int) -> None:
        self._seed, self.generator = seed, None

    def initial_state(self, agent_info: DictTensor, n: int) -> DictTensor:
        if not self.recurrent:
            return DictTensor(batch_size=n)
        weight = next(self.model.parameters())
        return DictTensor({"h": weight.new_zeros(n, self.model.state_size)})

    def _step(
        self, state: DictTensor, observation: DictTensor
    ) -> tuple[Tensor, Tensor, DictTensor]:
        """``(logits, value, new_state)``; a recurrent state restarts at episode starts."""
        if not self.recurrent:
            logits, value, _ = self.model(observation[K.FRAME], None)
            return logits, value, state
        fresh = self.initial_state(DictTensor(), observation.n_elems())
        state = masked_dicttensor(state, fresh, observation[K.INITIAL_STATE])
        logits, value, h = self.model(observation[K.FRAME], state["h"])
        return logits, value, DictTensor({"h": h})

    def __call__(
        self, state: DictTensor, observation: DictTensor, agent_info: DictTensor, history=None
    ) -> tuple[DictTensor, DictTensor]:
        logits, value, new_state = self._step(state, observation)
        if self.generator is None or self.generator.device != logits.device:
            self.generator = torch.Generator(logits.device).manual_seed(self._seed)
        action = torch.multinomial(logits.softmax(-1), 1, generator=self.generator).squeeze(1)
        if "greedy" in agent_info:
            action = torch.where(agent_info["greedy"].to(logits.device), logits.argmax(-1), action)
        return DictTensor({K.ACTION_KEY: action, "logits": logits, "value": value}), new_state

    def call_replay(
        self, trajectories: Trajectories, t: int, state: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        observation = trajectories.trajectories.get([FRAME, K.OBSERVATION + K.INITIAL_STATE])
        observation = observation.temporal_index(t).truncate_key(K.OBSERVATION)
        logits, value, new_state = self._step(state, observation)
        out = DictTensor({"logits": logits, "value": value})
        return (out + new_state if self.recurrent else out), new_state


# --------------------------------------------------------------------------------------- loss
def replay(agent: Agent, traj: Trajectories) -> TemporalDictTensor:
    """The agent's outputs ``(B, T, ...)`` over a segment, with gradients: step by step from
    the stored ``agent_state`` for a recurrent agent, in one batched call otherwise."""
    return (replay_agent if agent.recurrent else replay_agent_stateless)(agent, traj)


def next_values(model: nn.Module, traj: Trajectories, out: TemporalDictTensor) -> Tensor:
    """``V'`` ``(B, T)`` of the TRUE next observations, in one gradient-free batched call; a
    recurrent model reads them from the state after each step (``out["h"]``)."""
    next_frame = traj.trajectories[NEXT_FRAME]
    with torch.no_grad():
        h = out["h"].flatten(0, 1) if "h" in out else None
        _, value, _ = model(next_frame.flatten(0, 1), h)
    return value.view(next_frame.shape[:2])


def a2c_loss(
    logits: Tensor,
    value: Tensor,
    next_value: Tensor,
    traj: Trajectories,
    cfg: Config,
) -> tuple[Tensor, dict[str, float]]:
    """The A2C loss over ``(B, T)`` steps; padding is ignored.

    Args:
        logits: ``(B, T, A)`` policy logits of the stored observations (with gradients).
        value: ``(B, T)`` V(s_t) (with gradients).
        next_value: ``(B, T)`` V of the true next observations (no gradient).
        traj: the segment (actions, rewards, terminated/truncated flags, lengths).
        cfg: gamma, gae_lambda, normalize_advantages, vf_coef, ent_coef.

    Returns:
        ``(loss, stats)`` with stats ``loss``, ``policy_loss``, ``value_loss``, ``entropy``.
    """
    steps, mask = traj.trajectories, traj.trajectories.mask()
    advantage, returns = F.gae(
        steps[REWARD], value.detach(), next_value,
        steps[K.NEXT_OBSERVATION + K.TERMINATED], steps[K.NEXT_OBSERVATION + K.TRUNCATED],
        steps.lengths, cfg.gamma, cfg.gae_lambda,
    )
    if cfg.normalize_advantages:  # over the valid steps: the step size ignores the reward scale
        mean = F.masked_mean(advantage, mask)
        std = F.masked_mean((advantage - mean) ** 2, mask).sqrt()
        advantage = (advantage - mean) / (std + 1e-8)
    log_probs = logits.log_softmax(-1)
    logp = log_probs.gather(-1, steps[ACTION].unsqueeze(-1)).squeeze(-1)
    policy_loss = -F.masked_mean(logp * advantage, mask)
    value_loss = F.masked_mean((value - returns) ** 2, mask)
    entropy = F.masked_mean(-(log_probs.exp() * log_probs).sum(-1), mask)
    loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
    stats = {"loss": loss, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy}
    return loss, {k: float(v.detach()) for k, v in stats.items()}


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
    model_cls = GRUActorCritic if cfg.recurrent else MLPActorCritic
    model = model_cls(obs_dim, n_actions, cfg.hidden)  # on the CPU: the batchers copy it
    frames, iteration, eval_return, evaluating, solved_at = 0, 0, math.nan, False, None
    episodes = EpisodeReturns()
    with contextlib.ExitStack() as stack:  # closes batchers and logger, on Ctrl-C too
        batcher = stack.enter_context(make_batcher(
            device=cfg.batcher_device, n_processes=cfg.n_processes, n_timesteps=cfg.n_timesteps,
            create_agent=A2CAgent, agent_args={"model": model}, create_env=GymEnvInf,
            env_args={"env": cfg.env_id, "n_envs": cfg.n_envs}, seeds=cfg.seed,
            check_devices=cfg.check_devices,
        ))
        evaluator = None
        if cfg.eval_every > 0:  # greedy, full episodes; one process (synchronous on the CPU)
            evaluator = stack.enter_context(make_batcher(
                device=cfg.eval_device, n_processes=1,
                n_timesteps=gym.spec(cfg.env_id).max_episode_steps or 1000,
                create_agent=A2CAgent, agent_args={"model": model}, create_env=GymEnv,
                env_args={"env": cfg.env_id, "n_envs": cfg.eval_envs}, seeds=cfg.seed + 1000,
                agent_info=DictTensor({"greedy": torch.ones(1, dtype=torch.bool)}),
                check_devices=cfg.check_devices,
            ))
        log = stack.enter_context(
            RunLogger("a2c", cfg.env_id, cfg, cfg.runs_dir, total_frames=cfg.max_frames)
        )

        model.to(device)
        agent = CheckDevice(A2CAgent(model), device) if cfg.check_devices else A2CAgent(model)
        # One fused kernel for all of Adam's per-parameter updates: cheaper for a small net.
        fused = device.type in ("cpu", "cuda")
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, fused=fused)

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

            # 2-3. Replay on the learner device, one gradient step.
            traj = traj.to(device)
            out = replay(agent, traj)
            loss, stats = a2c_loss(out["logits"], out["value"], next_values(model, traj, out),
                                   traj, cfg)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()

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
            log.log(frames, eval_return=eval_return, lr=cfg.lr, **stats)
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
    print(f"a2c: {summary}\noutputs in {log.dir}")
    return summary


if __name__ == "__main__":
    main(parse_config(Config, sys.argv[1:]))
