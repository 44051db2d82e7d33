"""Tutorial 05 — REINFORCE from scratch, with the library doing the bookkeeping.

The whole algorithm: collect full episodes with the current policy, replay the policy over them
WITH gradients to get the log-probabilities of the actions taken, weight them by the discounted
returns, step the optimiser, push the new weights to the batcher. The batcher, the replay, the
returns and the masking of padded steps come from rlstruct; what is left is the algorithm.

The runnable companion of one page, which explains it and links here:
[Concepts](../docs/concepts.md#replay-and-losses).

Run: python tutorials/05_reinforce_from_scratch.py   (a few seconds on a CPU)
"""

import time

import torch
from torch import nn

from rlstruct import Agent, DictTensor, SerialBatcher, replay_agent_stateless
from rlstruct import functional as F
from rlstruct.envs import GymEnv

N_ENVS = 16  # episodes per iteration
ITERATIONS = 16
GAMMA = 0.99
LR = 0.01
SEED = 0


class Policy(Agent):
    """A memoryless softmax policy; it returns its logits next to the sampled action."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.generator = torch.Generator()

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def __call__(self, state, observation, agent_info):
        logits = self.model(observation["frame"])
        action = torch.multinomial(logits.softmax(1), 1, generator=self.generator).squeeze(1)
        return DictTensor({"action": action, "logits": logits}), state


def main() -> None:
    # A tiny model on a CPU: one thread per process is fastest (threads cost more than they give
    # on (16, 4) matrices, and the acting agent runs in this process too).
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    # The learner replays this agent, which wraps the model being trained; the batcher acts with
    # its own copy (made from agent_args) and receives new weights through update().
    learner = Policy(model)

    # Full episodes: an episodic env and T = 500, CartPole's longest episode. A short random
    # episode costs nothing extra: the loop stops when every env is done.
    batcher = SerialBatcher(
        n_timesteps=500,
        create_agent=Policy,
        agent_args={"model": model},
        create_env=GymEnv,
        env_args={"env": "CartPole-v1", "n_envs": N_ENVS},
        seeds=SEED,
    )
    started = time.perf_counter()
    with batcher:
        for iteration in range(ITERATIONS):
            batcher.reset()  # new episodes (each env's RNG goes on: the episodes differ)
            batcher.execute()
            traj, _ = batcher.get()
            steps = traj.trajectories  # (B, T, ...): T is the longest episode of the batch
            mask = steps.mask()  # padding after each episode's end must not reach the loss

            # Replay with gradients. The policy is memoryless, so one batched call over all B*T
            # steps does (replay_agent would step through time for a recurrent policy).
            replayed = replay_agent_stateless(learner, traj)
            log_probs = replayed["logits"].log_softmax(-1)
            log_prob = log_probs.gather(-1, steps["action/action"].unsqueeze(-1)).squeeze(-1)

            # Returns within each episode; CartPole's time limit (truncated) is not bootstrapped
            # here, which REINFORCE tolerates. Subtracting the mean return reduces variance.
            returns = F.discounted_returns(
                steps["_observation/reward"],
                steps["_observation/terminated"],
                steps["_observation/truncated"],
                steps.lengths,
                GAMMA,
            )
            advantage = returns - F.masked_mean(returns, mask)
            loss = -F.masked_mean(log_prob * advantage, mask)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            # The acting copy gets the new weights (copied through the CPU).
            batcher.update(model.state_dict())

            episode_return = (steps["_observation/reward"] * mask).sum(1).mean().item()
            if iteration % 5 == 0 or iteration == ITERATIONS - 1:
                print(f"iteration {iteration:2d}: mean return {episode_return:6.1f} over "
                      f"{traj.n_elems()} episodes, loss {loss.item():+.3f}")
    print(f"{ITERATIONS} iterations in {time.perf_counter() - started:.1f} s "
          "(REINFORCE is noisy: more iterations keep improving it)")


if __name__ == "__main__":
    main()
