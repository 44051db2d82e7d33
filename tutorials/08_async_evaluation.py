"""Tutorial 08 — Evaluate while you train, without waiting for the evaluation.

Evaluation episodes are long and must not slow training down. Give them their own batcher in a
worker process: execute() it, and poll it with get(blocking=False) between training iterations.
When a result arrives, report it, send the evaluation batcher the latest weights with update()
and start the next evaluation. Training never waits; the evaluation always runs the freshest
weights it can. The training loop is tutorial 05's REINFORCE; evaluation is greedy, which the
same agent does when agent_info says so.

The runnable companion of one page, which explains it and links here:
[Algorithms: what a run does](../docs/algorithms.md#what-a-run-does).

Run: python tutorials/08_async_evaluation.py   (about 7 seconds on a CPU, worker start-up included)
"""

import time

import torch
from torch import nn

from rlstruct import Agent, Batcher, DictTensor, SerialBatcher, replay_agent_stateless
from rlstruct import functional as F
from rlstruct.envs import GymEnv

ITERATIONS = 15
N_ENVS = 16
N_EVAL_ENVS = 4


class Policy(Agent):
    """Samples from a softmax policy, or takes the argmax on rows where agent_info["greedy"]."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.generator = torch.Generator()

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def __call__(self, state, observation, agent_info):
        logits = self.model(observation["frame"])
        action = torch.multinomial(logits.softmax(1), 1, generator=self.generator).squeeze(1)
        if "greedy" in agent_info:
            action = torch.where(agent_info["greedy"], logits.argmax(1), action)
        return DictTensor({"action": action, "logits": logits}), state


def mean_return(traj) -> float:
    steps = traj.trajectories
    return (steps["_observation/reward"] * steps.mask()).sum(1).mean().item()


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    learner = Policy(model)
    cartpole = {"env": "CartPole-v1"}

    # Training collects in this process; evaluation in one worker process of its own, with
    # agent_info making every row greedy. Both start from the same weights (their own copies).
    train = SerialBatcher(500, Policy, {"model": model}, GymEnv, {**cartpole, "n_envs": N_ENVS},
                          seeds=0)
    evaluation = Batcher(500, Policy, {"model": model}, GymEnv,
                         {**cartpole, "n_envs": N_EVAL_ENVS}, n_processes=1, seeds=1,
                         agent_info=DictTensor({"greedy": torch.tensor([True])}))
    with train, evaluation:
        # The first evaluation starts at once and runs while training goes on.
        evaluation.reset()
        evaluation.execute()
        evaluated = 0  # how many updates the weights of the evaluation in flight have seen
        started = time.perf_counter()
        for iteration in range(ITERATIONS):
            # --- one training iteration (tutorial 05) ---
            train.reset()
            train.execute()
            traj, _ = train.get()
            steps = traj.trajectories
            mask = steps.mask()
            logits = replay_agent_stateless(learner, traj)["logits"]
            log_prob = logits.log_softmax(-1).gather(-1, steps["action/action"].unsqueeze(-1))
            returns = F.discounted_returns(
                steps["_observation/reward"], steps["_observation/terminated"],
                steps["_observation/truncated"], steps.lengths, 0.99,
            )
            advantage = returns - F.masked_mean(returns, mask)
            loss = -F.masked_mean(log_prob.squeeze(-1) * advantage, mask)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            train.update(model.state_dict())

            # --- the evaluation: look, do not wait ---
            result, _ = evaluation.get(blocking=False)
            if result is not None:
                print(f"iteration {iteration:2d} | evaluation of the weights after {evaluated:2d} "
                      f"updates (policy_version {result.info['policy_version'][0].item()}):"
                      f" greedy return {mean_return(result):6.1f} "
                      f"(training return {mean_return(traj):5.1f})")
                evaluation.update(model.state_dict())  # the latest weights, copied to the worker
                evaluation.reset()  # full episodes: every env ended, start new ones
                evaluation.execute()
                evaluated = iteration + 1
        print(f"{ITERATIONS} training iterations in {time.perf_counter() - started:.1f} s, "
              "never waiting for the evaluation")

        # At the end, the last evaluation may still run: this time, wait for it.
        result, _ = evaluation.get()
        print(f"last evaluation (weights after {evaluated} updates): greedy return "
              f"{mean_return(result):.1f}")


# The evaluation Batcher spawns a worker that imports this file: the guard keeps it from
# running main() again.
if __name__ == "__main__":
    main()
