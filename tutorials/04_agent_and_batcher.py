"""Tutorial 04 — Agents and batchers: collect trajectories in the three usage modes.

An Agent maps (state, observation, agent_info) to (action, new_state) for a batch of envs. A
batcher runs the ONE acquisition loop (agent -> action -> env.step -> write by index) for T steps
and hands back Trajectories. SerialBatcher runs it in this process; Batcher runs it in CPU worker
processes and returns exactly the same data for the same seeds. The call order is always

    reset() -> execute() -> get() -> execute() -> get() ... -> close()

and what you get depends on the env and on T: whole episodes, chunks of episodes, or endless
segments. The last part starts two worker processes, polls them without blocking, changes the
exploration of each row and pushes new weights.

The runnable companion of one page, which explains it and links here:
[Concepts](../docs/concepts.md#batchers-and-their-three-modes).

Run: python tutorials/04_agent_and_batcher.py   (about 6 seconds on a CPU, worker start-up included)
"""

import time

import torch
from torch import nn

from rlstruct import Agent, Batcher, DictTensor, SerialBatcher, masked_dicttensor
from rlstruct.envs import GymEnv, GymEnvInf
from rlstruct.errors import BatcherStateError


# The agent is defined at module level so that spawned worker processes can import it.
class EpsilonGreedy(Agent):
    """Greedy on a model's scores, random with probability agent_info["epsilon"] (per row).

    Its state counts the steps of the current episode, to show how a batcher carries state.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model  # the only nn.Module attribute: the default update() loads into it
        self.generator = torch.Generator()

    def seed(self, seed: int) -> None:
        # Each batcher (and each worker) seeds its own copy of the agent.
        self.generator.manual_seed(seed)

    def initial_state(self, agent_info: DictTensor, n: int) -> DictTensor:
        return DictTensor({"steps": torch.zeros(n, dtype=torch.long)})

    def __call__(self, state, observation, agent_info):
        n = observation.n_elems()
        # Rows that start an episode get a fresh state: the agent owns its resets.
        fresh = observation["initial_state"]
        state = masked_dicttensor(state, self.initial_state(agent_info, n), fresh)
        scores = self.model(observation["frame"])
        random = torch.randint(scores.shape[1], (n,), generator=self.generator)
        explore = torch.rand(n, generator=self.generator) < agent_info["epsilon"]
        action = torch.where(explore, random, scores.argmax(1))
        # Everything returned next to "action" is stored too: here the flag says why.
        output = DictTensor({"action": action, "explored": explore})
        return output, DictTensor({"steps": state["steps"] + 1})


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(4, 2)  # CartPole: 4 observation floats, 2 actions


# The batcher copies everything in agent_args (through the CPU): the model trained here and the
# copy that acts in the batcher are independent until update() is called.
model = make_model()
# agent_info fixes the keys, shapes and dtypes of the per-row parameters; one row is broadcast.
EPSILON = DictTensor({"epsilon": torch.tensor([0.1])})
COMMON = dict(create_agent=EpsilonGreedy, agent_args={"model": model}, agent_info=EPSILON, seeds=0)


def full_episodes() -> None:
    # Mode 1, full episodes: an episodic env and T = the longest possible episode (CartPole
    # truncates at 500). One execute() then runs every episode to its end.
    batcher = SerialBatcher(500, create_env=GymEnv, env_args={"env": "CartPole-v1", "n_envs": 4},
                            **COMMON)
    batcher.reset()
    n_running = batcher.n_elems()
    while n_running > 0:
        batcher.execute()
        traj, n_running = batcher.get()
        print("full episodes: B =", traj.n_elems(), "T =", traj.trajectories.n_timesteps(),
              "episode lengths", traj.lengths.tolist(), "still running:", n_running)
    # Every episode ended: a new execute() is refused until reset() starts new ones.
    try:
        batcher.execute()
    except BatcherStateError as e:
        print("refused:", e)
    batcher.close()


def chunks() -> None:
    # Mode 2, chunks of episodes: the same episodic env with a small T. Each get() returns the
    # next T steps of the envs that were still running; finished envs drop out of the batch.
    # info["agent_state/steps"] is the agent's state at the start of each chunk, which a
    # recurrent loss needs to replay the chunk (replay_agent reads it).
    with SerialBatcher(16, create_env=GymEnv, env_args={"env": "CartPole-v1", "n_envs": 4},
                       **COMMON) as batcher:
        batcher.reset()
        n_running = batcher.n_elems()
        print("\nchunks of T=16:")
        while n_running > 0:
            batcher.execute()
            traj, n_running = batcher.get()
            print(f"  rows of envs {traj.info['env_id'].tolist()}, lengths {traj.lengths.tolist()},"
                  f" agent_state/steps at start {traj.info['agent_state/steps'].tolist()}")


def infinite_segments() -> None:
    # Mode 3, infinite segments: an auto-reset env never stops, so every get() is a full
    # B x T block; episodes end and restart inside it (look at "done").
    with SerialBatcher(16, create_env=GymEnvInf, env_args={"env": "CartPole-v1", "n_envs": 4},
                       **COMMON) as batcher:
        batcher.reset()  # once: the envs and the agent state continue from segment to segment
        print("\ninfinite segments of T=16:")
        for _ in range(3):
            batcher.execute()
            traj, n_running = batcher.get()
            steps = traj.trajectories
            print(f"  B x T = {steps.n_elems()} x {steps.n_timesteps()}, full: {steps.full()}, "
                  f"episodes ended inside: {int(steps['_observation/done'].sum())}, "
                  f"still running: {n_running}")


def multi_process() -> None:
    # The same loop in 2 worker processes, 2 envs each (B = 4). Workers start in a second or two
    # (each imports torch), so create a Batcher once and keep it.
    started = time.perf_counter()
    batcher = Batcher(16, create_env=GymEnvInf, env_args={"env": "CartPole-v1", "n_envs": 2},
                      n_processes=2, **COMMON)
    print(f"\nBatcher: {batcher.n_processes} workers x 2 envs started in "
          f"{time.perf_counter() - started:.1f} s")
    with batcher:
        # The multi-process Batcher returns the same data as a SerialBatcher with the same seeds:
        # env seeds follow the global env index, not the process layout.
        with SerialBatcher(16, create_env=GymEnvInf,
                           env_args={"env": "CartPole-v1", "n_envs": 4}, **COMMON) as serial:
            greedy = DictTensor({"epsilon": torch.zeros(1)})
            for b in (serial, batcher):
                b.reset(agent_info=greedy)
                b.execute()
            same = serial.get()[0].trajectories.equal(batcher.get()[0].trajectories)
        print("greedy segment equals the SerialBatcher's:", same)

        # execute() returns at once; get(blocking=False) answers (None, None) until the workers
        # are done, so the caller can do something useful (a gradient step) meanwhile.
        # agent_info now gives each row its own epsilon: two greedy rows, two random ones.
        epsilon = DictTensor({"epsilon": torch.tensor([0.0, 0.0, 1.0, 1.0])})
        batcher.execute(agent_info=epsilon)
        polls = 1
        traj, _ = batcher.get(blocking=False)
        while traj is None:
            time.sleep(0.001)  # stands for useful work
            polls += 1
            traj, _ = batcher.get(blocking=False)
        explored = traj.trajectories["action/explored"].float().mean(1)
        print(f"non-blocking get() calls until ready: {polls}")
        print(f"epsilon per row {traj.info['agent_info/epsilon'].tolist()}, "
              f"share of random actions {[round(x, 2) for x in explored.tolist()]}")

        # update() sends new weights to every worker. Called while a segment is in flight, it
        # lands after that segment, never in the middle of one: info["policy_version"] tells
        # which weights collected each row.
        batcher.execute()
        batcher.update(make_model(seed=1).state_dict())
        traj, _ = batcher.get()
        print("segment in flight during update(): policy_version",
              traj.info["policy_version"].tolist())
        batcher.execute()
        traj, _ = batcher.get()
        print("next segment:                      policy_version",
              traj.info["policy_version"].tolist())


# Batcher workers are spawned processes that import this file: without the guard each of them
# would start batchers of its own.
if __name__ == "__main__":
    torch.set_num_threads(1)  # a tiny model: one thread is fastest (tutorial 07 says why)
    full_episodes()
    chunks()
    infinite_segments()
    multi_process()
