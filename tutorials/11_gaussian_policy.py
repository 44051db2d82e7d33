"""Tutorial 11 — A Gaussian policy from scratch, on Pendulum (continuous actions).

Pendulum's action is a torque in [-2, 2]: a Box, not a choice among n. The policy is a
diagonal Gaussian: a network gives the mean, a free parameter the log-std, and the agent samples
``sample = mean + std * noise``. Three details matter, and the tutorial writes each one out:

1. The Gaussian lives in a NORMALISED space ([-1, 1] is the Box); the env gets ``2 * sample``,
   CLIPPED to the bounds (an env refuses an out-of-range torque with ``ActionError``).
2. The agent stores the UNCLIPPED ``sample`` next to the action: the log-probability of the
   clipped action would be the wrong one (every clipped torque piles up on the bound) and would
   bias the policy gradient.
3. The agent outputs plain tensors (``mean``, ``log_std``, ``value``); the learner replays the
   agent over the stored steps WITH gradients and rebuilds the Gaussian there
   (``replay_agent_stateless``: one batched call, as the policy has no memory; ``replay_agent``
   steps through time for a recurrent one and returns the same outputs).

The learning rule is PPO's clipped surrogate on GAE advantages, a few epochs per batch. Then the
same policy is built from the library's pieces (``rlstruct.blocks.distributions.make_head``,
``rlstruct.blocks.nets.HeadActorCritic``, ``rlstruct.blocks.sampling.PolicyAgent``): what
``rlstruct/algos/ppo.py``,
``rlstruct/algos/a2c.py`` and ``rlstruct/algos/trpo.py`` use for any action space.

The runnable companion of one page, which explains it and links here:
[Algorithms: continuous actions](../docs/algorithms.md#continuous-actions).

Run: python tutorials/11_gaussian_policy.py   (about 15 seconds on a CPU)
"""

import math
import time

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from rlstruct import Agent, DictTensor, SerialBatcher, replay_agent, replay_agent_stateless
from rlstruct import functional as F
from rlstruct.blocks.distributions import make_head
from rlstruct.blocks.nets import HeadActorCritic
from rlstruct.blocks.sampling import PolicyAgent
from rlstruct.envs import GymEnvInf
from rlstruct.runs.episodes import EpisodeTracker

N_ENVS, T, ITERATIONS = 16, 64, 40  # 16 x 64 = 1024 steps per batch; 41k steps in all
GAMMA, LAMBDA, CLIP, EPOCHS, MINIBATCH, LR = 0.9, 0.95, 0.2, 10, 256, 1e-3
MAX_TORQUE = 2.0
SEED = 0


class GaussianActorCritic(nn.Module):
    """``frame (n, 3) -> (mean (n, 1), log_std (n, 1), value (n,))``."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                   nn.Tanh(), nn.Linear(hidden, 1))
        self.log_std = nn.Parameter(torch.zeros(1))  # the same for every state
        self.critic = nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                    nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, frame):
        mean = self.actor(frame)
        return mean, self.log_std.expand_as(mean), self.critic(frame).squeeze(-1)


class GaussianPolicy(Agent):
    """Samples a torque; returns the clipped ``action`` for the env, the unclipped ``sample``
    for the log-prob, and the network's plain outputs for the learner's replay."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.generator = torch.Generator()

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def __call__(self, state, observation, agent_info):
        mean, log_std, value = self.model(observation["frame"])
        noise = torch.randn(mean.shape, generator=self.generator)
        sample = (mean + log_std.exp() * noise).detach()  # during replay: the stored one instead
        action = (MAX_TORQUE * sample).clamp(-MAX_TORQUE, MAX_TORQUE)  # rescale, then clip
        out = {"action": action, "sample": sample, "mean": mean, "log_std": log_std,
               "value": value}
        return DictTensor(out), state


def gaussian_log_prob(mean, log_std, x):
    """``log N(x; mean, exp(log_std)^2)`` summed over the action dimensions."""
    z = (x - mean) * torch.exp(-log_std)
    return (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def learn(learner: GaussianPolicy, optimizer, traj) -> float:
    steps = traj.trajectories
    with torch.no_grad():  # V of the TRUE next observations: truncated episodes bootstrap
        next_value = learner.model(steps["_observation/frame"])[2]
    advantage, returns = F.gae(
        steps["_observation/reward"], steps["action/value"], next_value,
        steps["_observation/terminated"], steps["_observation/truncated"], steps.lengths,
        GAMMA, LAMBDA,
    )
    batch = steps.get(["observation/frame", "action/sample", "action/mean", "action/log_std"])
    batch.set("advantage", advantage)
    batch.set("return", returns)
    batch = batch.to_transitions()  # the valid steps, one per row
    # The acting policy's log-prob of each stored sample, rebuilt from its stored outputs.
    batch["logp_old"] = gaussian_log_prob(batch["action/mean"], batch["action/log_std"],
                                          batch["action/sample"])
    for _ in range(EPOCHS):
        for rows in torch.randperm(batch.n_elems()).split(MINIBATCH):
            mb = batch.index(rows)
            new = replay_agent_stateless(learner, mb)  # the same agent, with gradients
            logp = gaussian_log_prob(new["mean"], new["log_std"], mb["action/sample"])
            ratio = torch.exp(logp - mb["logp_old"])
            adv = (mb["advantage"] - mb["advantage"].mean()) / (mb["advantage"].std() + 1e-8)
            surrogate = torch.min(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv)
            loss = -surrogate.mean() + 0.5 * ((new["value"] - mb["return"]) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return float(loss.detach())


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    model = GaussianActorCritic()
    learner = GaussianPolicy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    env_args = {"env": "Pendulum-v1", "n_envs": N_ENVS}
    started, returns, tracker = time.perf_counter(), [], EpisodeTracker()
    with SerialBatcher(T, GaussianPolicy, {"model": model}, GymEnvInf, env_args,
                       seeds=SEED) as batcher:
        batcher.reset()
        for iteration in range(ITERATIONS):
            batcher.execute()
            traj, _ = batcher.get()
            steps = traj.trajectories
            # Every torque the envs received is inside the Box; the stored samples are not.
            assert steps["action/action"].abs().max() <= MAX_TORQUE
            outside = (steps["action/sample"].abs() > 1).float().mean().item()
            # Pendulum's episodes (200 steps) span segments: the tracker carries their returns.
            returns += tracker(traj)[0].tolist()
            if iteration == 0:  # replay_agent re-runs the policy step by step, with gradients:
                means = replay_agent(learner, traj)["mean"]  # the means the acting copy stored
                print(f"replayed means equal the stored ones: "
                      f"{torch.allclose(means, steps['action/mean'])}")
            loss = learn(learner, optimizer, traj)
            batcher.update(model.state_dict())
            if iteration % 8 == 0 or iteration == ITERATIONS - 1:
                recent = np.mean(returns[-N_ENVS:]) if returns else float("nan")
                print(f"iteration {iteration:2d}: mean return of the last {N_ENVS} episodes "
                      f"{recent:7.1f}, std {model.log_std.exp().item():.2f}, "
                      f"samples outside [-1, 1] {outside:4.0%}, loss {loss:+.3f}")
    print(f"{ITERATIONS} iterations in {time.perf_counter() - started:.1f} s; a random policy "
          "scores about -1200 (rlstruct/algos/trpo.py and rlstruct/algos/ppo.py go on to about "
          "-200)")

    # The same policy from the library's pieces: a head picked from the action space.
    space = spaces.Box(-MAX_TORQUE, MAX_TORQUE, (1,), np.float32)
    library_model = HeadActorCritic(3, make_head(space, 64), hidden=64)
    agent = PolicyAgent(library_model)
    out, _ = agent(DictTensor(batch_size=4), DictTensor({"frame": torch.randn(4, 3)}),
                   DictTensor())
    print(f"PolicyAgent outputs {sorted(out.keys())}: the env gets 'action', the loss uses "
          f"'sample' (head.log_prob(params, sample))")


if __name__ == "__main__":
    main()
