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

The model is the zoo's (``--model mlp``, separate actor and critic MLPs, or ``cnn``, the Nature
CNN on stacked Atari frames; rlstruct/blocks/zoo.py): ``forward(frame) -> (logits, V)``.

Run: ``python -m rlstruct.algos.reinforce --help``; ``python -m rlstruct.algos.reinforce --seed 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import gymnasium as gym
import torch
from torch import Tensor, nn

from rlstruct import Agent, DictTensor, Trajectories, replay_agent_stateless
from rlstruct import functional as F
from rlstruct import keys as K
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.blocks.distributions import space_spec
from rlstruct.blocks.masks import mask_logits, observation_mask, stored_mask
from rlstruct.blocks.obs_input import model_input
from rlstruct.blocks.optim import adam, gradient_step
from rlstruct.blocks.sampling import CategoricalSampler, greedy_info
from rlstruct.blocks.zoo import actor_critic, model_problems
from rlstruct.envs import GymEnv
from rlstruct.runs.resolve import Resolved, run_cli
from rlstruct.runs.run import Run, RunConfig


@dataclass
class Config(RunConfig):
    """REINFORCE with a learned baseline on full episodes (rlstruct train reinforce).

    The defaults solve CartPole-v1 in 50-80 iterations of 16 episodes (2 workers x 8 envs): one
    large Adam step per batch (normalised advantages keep its size stable), and a small entropy
    bonus that slows the collapse of the policy's randomness without blocking the 475 target.
    """
    action_spaces: ClassVar[tuple[str, ...]] = ("Discrete",)

    max_frames: int = 2_000_000
    eval_every: int = 10
    lr: float = 3e-3
    max_grad_norm: float = 1.0
    n_timesteps: int = 0
    """T: steps per segment (0: the env's max_episode_steps, else 1000)"""
    min_timesteps: ClassVar[int] = 0
    vf_coef: float = 0.5
    """weight of the baseline's squared error"""
    ent_coef: float = 0.01
    """weight of the entropy bonus"""
    normalize_advantages: bool = True
    """normalise advantages over the batch's valid steps (mean 0, std 1)"""
    model: Literal["mlp", "cnn"] = "mlp"
    """the zoo's actor-critic: separate actor (logits) and critic (the baseline V) MLPs, or the
    Nature CNN on stacked uint8 frames (--env-backend atari)"""

    def world_problems(self, obs_shape: tuple[int, ...], action_space: Any) -> list[str]:
        return super().world_problems(obs_shape, action_space) + model_problems(
            self.model, obs_shape, self.env_id, allowed=("mlp", "cnn"))


# --------------------------------------------------------------------------------------- agent
class PolicyAgent(Agent):
    """Samples ``a ~ softmax(logits)`` of a zoo model ``model(frame) -> (logits (n, A), V
    (n,))``; rows with ``agent_info["greedy"]`` take the argmax. The logits are masked by the
    observation's ``action_mask`` (replayed: the stored one), if any (blocks/masks.py).

    ``call_replay`` (used by ``replay_agent_stateless`` on the learner) evaluates the STORED
    actions instead: their log-probability, the policy's entropy, ``V(s)`` and ``V(s')``.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.sample = CategoricalSampler()

    def seed(self, seed: int) -> None:
        self.sample.seed(seed)

    def logits(self, frame: Tensor) -> Tensor:
        """The policy's logits ``(n, A)`` of frames ``(n, *obs)``."""
        return self.model(frame)[0]

    def value(self, frame: Tensor) -> Tensor:
        """The baseline ``V`` ``(n,)`` of frames ``(n, *obs)``."""
        return self.model.value(frame)

    def __call__(
        self, state: DictTensor, observation: DictTensor, agent_info: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        logits = mask_logits(self.logits(model_input(observation)), observation_mask(observation))
        action = self.sample(logits, agent_info)
        return DictTensor({K.ACTION_KEY: action}), state

    def call_replay(
        self, trajectories: Trajectories, t: int, state: DictTensor
    ) -> tuple[DictTensor, DictTensor]:
        steps = trajectories.trajectories
        logits, value = self.model(model_input(steps, K.OBSERVATION)[:, t])
        logits = mask_logits(logits, stored_mask(steps, t))
        with torch.no_grad():  # V(s') is a target: no gradient flows into it
            next_value = self.value(model_input(steps, K.NEXT_OBSERVATION)[:, t])
        out = {
            "logp": F.categorical_log_prob(logits, steps[K.STORED_ACTION][:, t]),
            "entropy": F.categorical_entropy(logits),
            "value": value,
            "next_value": next_value,
        }
        return DictTensor(out), state


# --------------------------------------------------------------------------------------- loss
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
        normalize_advantages: normalise ``A = G - V`` over the valid steps (the step size no
            longer depends on the scale of the returns; the mean is a batch-level baseline).

    Returns:
        ``(loss, stats)``: stats holds the floats ``loss``, ``policy_loss``, ``value_loss``,
        ``entropy``.
    """
    advantages = (returns - value).detach()
    if normalize_advantages:
        advantages = F.normalize_advantages(advantages, mask)
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
    return F.discounted_returns(steps[K.NEXT_REWARD], steps[K.NEXT_TERMINATED],
                                steps[K.NEXT_TRUNCATED], traj.lengths, gamma, next_value=next_value)


# --------------------------------------------------------------------------------------- main
def play_episodes(batcher: Batcher | SerialBatcher, run: Run) -> Trajectories:
    """One episode per env, from the first segment that ``run.publish`` started: ``get``, then
    ``execute``/``get`` until no env runs (one segment when ``T`` covers whole episodes); every
    segment is recorded. Returns them concatenated."""
    segments = []
    while True:
        traj, n_running = batcher.get()
        run.record(traj)
        segments.append(traj)
        if not n_running:
            return Trajectories.cat(segments)
        batcher.execute()


def main(cfg: Config | Resolved[Config]) -> dict[str, Any]:
    """Trains until the target return, ``max_frames`` or ``time_budget``; returns the summary."""
    with Run("reinforce", cfg) as run:
        cfg = run.cfg  # resolved: the layout file applied, --resume auto picked
        model = run.model(run.factory(actor_critic, cfg.model, tuple(run.obs_shape),
                                      space_spec(run.action_space), cfg.hidden))  # on the CPU
        n_timesteps = cfg.n_timesteps or gym.spec(cfg.env_id).max_episode_steps or 1000
        batcher = run.training_batcher(PolicyAgent, {"model": model}, GymEnv, n_timesteps,
                                       pipelined=False)
        run.evaluator(PolicyAgent, {"model": model}, agent_info=greedy_info())
        agent = run.learner(PolicyAgent(model))
        optimizer = adam(model.parameters(), cfg.lr, run.device)
        run.checkpoint_state(model=model, optimizer=optimizer)
        while not run.done:
            # 1. Publish the current weights and collect B new episodes with them.
            batcher.reset()
            run.publish(batcher, model.state_dict())
            with run.monitor.phase("collect"):
                traj = play_episodes(batcher, run).to(run.device)
            # 2. One gradient step: replay the agent on the learner device, then the loss.
            out = replay_agent_stateless(agent, traj)
            loss, stats = reinforce_loss(
                out["logp"], out["entropy"], out["value"],
                episode_returns(traj, out["next_value"], cfg.gamma), traj.trajectories.mask(),
                vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef,
                normalize_advantages=cfg.normalize_advantages,
            )
            gradient_step(optimizer, loss, cfg.max_grad_norm)
            run.end_iteration(model.state_dict(), lr=cfg.lr, **stats)
    return run.summary


if __name__ == "__main__":
    run_cli(main, Config, prog="python -m rlstruct.algos.reinforce")
