"""Tutorial 06 — GPUs: where they help, and how rlstruct keeps devices apart.

A GPU helps in three places, each with its own device:
  1. the learner: the loss is computed on the learner's device (move the batch there, replay);
  2. the training batcher: a SerialBatcher on a GPU steps many CPU envs behind a DeviceEnv and
     runs its OWN copy of the model on that GPU (one process, one batched agent call per step);
  3. evaluation elsewhere: a CPU batcher with its own copy, refreshed with update().
Model copies always travel through the CPU, so a copy for cuda:1 never allocates on cuda:0.
Finally, CheckDevice catches an agent that breaks the device contract.

This script runs anywhere: without CUDA every "GPU" role falls back to the CPU (it says so), and
the wrong device in the CheckDevice example is the `meta` device.

The runnable companion of one page, which explains it and links here:
[GPUs and device layouts](../docs/guide-gpus.md).

Run: python tutorials/06_gpus.py   (a few seconds on a CPU)
"""

import torch
from torch import nn

from rlstruct import (
    Agent,
    CheckDevice,
    DictTensor,
    SerialBatcher,
    replay_agent_stateless,
)
from rlstruct import functional as F
from rlstruct.envs import DeviceEnv, GymEnv, GymEnvInf
from rlstruct.errors import DeviceContractError

# --- Pick the devices ---------------------------------------------------------------------------
N_GPUS = torch.cuda.device_count()
LEARNER = torch.device("cuda:0" if N_GPUS else "cpu")
# With two GPUs the training batcher gets its own; with one it shares the learner's.
BATCHER = torch.device(f"cuda:{N_GPUS - 1}" if N_GPUS else "cpu")
EVALUATION = torch.device("cpu")
if not N_GPUS:
    print("no CUDA device here: every GPU role below falls back to the CPU")
print(f"learner on {LEARNER}, training batcher on {BATCHER}, evaluation batcher on {EVALUATION}")


class Policy(Agent):
    """A softmax policy that works on whatever device its model is on.

    Everything it builds follows the device of its input (the generator too), and agent_info,
    which the batcher keeps on the CPU, is moved to where it is needed.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._seed = 0
        self.generator: torch.Generator | None = None

    def seed(self, seed: int) -> None:
        self._seed, self.generator = seed, None

    def __call__(self, state, observation, agent_info):
        logits = self.model(observation["frame"])
        if self.generator is None or self.generator.device != logits.device:
            self.generator = torch.Generator(logits.device).manual_seed(self._seed)
        action = torch.multinomial(logits.softmax(1), 1, generator=self.generator).squeeze(1)
        if "greedy" in agent_info:
            action = torch.where(agent_info["greedy"].to(logits.device), logits.argmax(1), action)
        return DictTensor({"action": action, "logits": logits}), state


def main() -> None:
    torch.set_num_threads(1)  # tiny model: see tutorial 07
    torch.manual_seed(0)

    # --- 1. The learner: the model being trained lives on the learner device -----------------
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2)).to(LEARNER)
    learner = Policy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    # --- 2. The training batcher on its own device ----------------------------------------------
    # SerialBatcher(device=...) builds the agent from agent_args through the CPU and moves its
    # copy to `device`; the CPU envs are put behind a DeviceEnv, so observations arrive on the
    # device and actions go back to the CPU inside env.step. Here is what DeviceEnv does:
    with DeviceEnv(GymEnvInf("CartPole-v1", n_envs=2), "cpu", BATCHER) as env:
        obs, _ = env.reset()
        print(f"\nDeviceEnv: gymnasium envs on the cpu, observations on {obs.device()}")

    train = SerialBatcher(
        n_timesteps=32,
        create_agent=Policy,
        agent_args={"model": model},  # lives on LEARNER; the batcher copies it via the CPU
        create_env=GymEnvInf,
        env_args={"env": "CartPole-v1", "n_envs": 16},
        seeds=0,
        device=BATCHER,
    )
    acting = train.agent.model
    print(f"training batcher: its model copy is on {next(acting.parameters()).device}, "
          f"a separate object from the learner's: {acting is not model}")

    # --- 3. Evaluation elsewhere: a CPU batcher, greedy, over full episodes -------------------
    evaluation = SerialBatcher(
        n_timesteps=500,
        create_agent=Policy,
        agent_args={"model": model},
        create_env=GymEnv,
        env_args={"env": "CartPole-v1", "n_envs": 4},
        seeds=1,
        agent_info=DictTensor({"greedy": torch.tensor([True])}),
        device=EVALUATION,
    )

    with train, evaluation:
        train.reset()
        for iteration in range(4):
            train.execute()
            traj, _ = train.get()  # on BATCHER
            # The loss runs where the model is: one move of the whole batch (a no-op when the
            # batcher and the learner share a device), then replay with gradients there.
            batch = traj.to(LEARNER, non_blocking=True)
            steps = batch.trajectories
            logits = replay_agent_stateless(learner, batch)["logits"]
            log_prob = logits.log_softmax(-1).gather(-1, steps["action/action"].unsqueeze(-1))
            returns = F.discounted_returns(
                steps["_observation/reward"], steps["_observation/terminated"],
                steps["_observation/truncated"], steps.lengths, 0.99,
            )
            mask = steps.mask()
            loss = -F.masked_mean(log_prob.squeeze(-1) * (returns - F.masked_mean(returns, mask)),
                                  mask)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            # New weights for the acting copy: copied through the CPU to BATCHER.
            train.update(model.state_dict())
            print(f"iteration {iteration}: batch collected on {traj.device()}, loss computed on "
                  f"{loss.device}, policy_version {train.version}")

        # The evaluation batcher gets the same weights, copied to ITS device.
        evaluation.update(model.state_dict())
        evaluation.reset()
        evaluation.execute()
        episodes, _ = evaluation.get()
        print(f"greedy evaluation on {episodes.device()}: episode lengths "
              f"{episodes.lengths.tolist()}")

    # --- CheckDevice: catch an agent that breaks the device contract -------------------------
    # A classic mistake: the agent builds a tensor without `device=` (or calls .cpu() to feed the
    # env itself). Torch copies across devices silently, so the run "works" while every step
    # pays a hidden copy and sync. Here the mistake is made explicit with WRONG: the CPU when the
    # agent runs on a GPU, the `meta` device otherwise.
    wrong = torch.device("cpu" if BATCHER.type == "cuda" else "meta")

    class Sloppy(Policy):
        def __call__(self, state, observation, agent_info):
            output, state = super().__call__(state, observation, agent_info)
            return DictTensor({"action": output["action"].to(wrong)}), state

    # CheckDevice wraps the agent transparently; a batcher calls the agent once while it starts
    # (to learn the keys), so the breach is reported before any data is collected.
    try:
        SerialBatcher(
            n_timesteps=8,
            create_agent=lambda model: CheckDevice(Sloppy(model), BATCHER),
            agent_args={"model": model},
            create_env=GymEnvInf,
            env_args={"env": "CartPole-v1", "n_envs": 2},
            device=BATCHER,
        )
    except DeviceContractError as e:
        print(f"\nCheckDevice caught it:\n  {type(e).__name__}: {e}")
        print(f"  argument={e.argument!r} key={e.key!r} expected={e.expected} actual={e.actual}")


if __name__ == "__main__":
    main()
