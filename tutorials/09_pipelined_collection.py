"""Tutorial 09 — Keep every core busy: synchronous vs pipelined collection.

A synchronous loop alternates: the workers collect a batch while the learner waits, then the
learner learns while the workers wait. On a machine whose learner runs on a GPU (or whose
learning is otherwise not CPU-bound) half of the time is lost. `Batcher(..., pipeline=2)` gives
each worker two segment slots: after `get()` hands batch k to the learner, the workers are
already collecting batch k+1, and batch k+2 starts with the weights of the next `update()`.

The two loops below differ by two lines. They run the same CartPole workload with a fake learner
that takes as long as collecting a batch (it sleeps, like a CPU waiting for its GPU), and print
the steps per second and the cores the whole process tree kept busy.

When to choose which:
- synchronous: every batch is collected with the newest weights (on-policy methods as written in
  the papers: PPO, A2C); simplest to reason about.
- pipelined: batch k+1 is collected with the weights from before learning on batch k (one update
  of lag, visible in `info["policy_version"]`). Off-policy methods (DQN) do not care; IMPALA
  corrects the lag with V-trace; PPO's clipping tolerates one update of lag. The data still
  depend only on the seeds and the sequence of calls, so runs stay reproducible.

The runnable companion of one page, which explains it and links here:
[Performance](../docs/guide-performance.md).

Run: python tutorials/09_pipelined_collection.py   (about 10 seconds on 2 cores)
"""

import time

import psutil
import torch
from torch import nn

from rlstruct import Agent, Batcher, DictTensor
from rlstruct.envs import GymEnvInf

N_BATCHES = 12


class Policy(Agent):
    def __init__(self) -> None:
        self.model = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))

    def __call__(self, state, observation, agent_info):
        logits = self.model(observation["frame"])
        action = torch.distributions.Categorical(logits=logits).sample()
        return DictTensor({"action": action}), state


def cartpole(n_envs: int, seed: int) -> GymEnvInf:
    return GymEnvInf("CartPole-v1", n_envs=n_envs, seed=seed)


def cpu_seconds() -> float:
    """CPU time used so far by this process and all its children (the workers)."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def run(pipeline: int, learn_seconds: float) -> tuple[float, float, list[int]]:
    learner = Policy().model
    with Batcher(32, Policy, {}, cartpole, {"n_envs": 16}, n_processes=2, seeds=0,
                 pipeline=pipeline) as batcher:
        batcher.reset()
        if pipeline > 1:
            batcher.execute()  # starts the stream: the workers fill their slots
        start, cpu0, steps, versions = time.perf_counter(), cpu_seconds(), 0, []
        for _ in range(N_BATCHES):
            if pipeline == 1:
                batcher.execute()  # synchronous: ask for one batch...
            batch, _ = batcher.get()  # ...and wait for it (pipelined: the oldest ready one)
            steps += int(batch.trajectories.lengths.sum())
            versions.append(int(batch.info["policy_version"][0]))
            time.sleep(learn_seconds)  # the fake learner
            batcher.update(learner.state_dict())  # shared memory; returns at once
        wall = time.perf_counter() - start
        return steps / wall, (cpu_seconds() - cpu0) / wall, versions


if __name__ == "__main__":
    torch.set_num_threads(1)
    # How long does collecting one batch take? The fake learner takes as long.
    with Batcher(32, Policy, {}, cartpole, {"n_envs": 16}, n_processes=2, seeds=0) as b:
        b.reset()
        for _ in range(3):
            t0 = time.perf_counter()
            b.execute()
            b.get()
            collect = time.perf_counter() - t0
    print(f"collecting one batch (2 workers x 16 envs x 32 steps) takes {collect * 1e3:.0f} ms")

    sync_speed, sync_cores, sync_versions = run(pipeline=1, learn_seconds=collect)
    pipe_speed, pipe_cores, pipe_versions = run(pipeline=2, learn_seconds=collect)
    print(f"synchronous: {sync_speed:8.0f} steps/s, {sync_cores:.2f} cores busy")
    print(f"pipelined:   {pipe_speed:8.0f} steps/s, {pipe_cores:.2f} cores busy "
          f"({pipe_speed / sync_speed:.2f}x)")
    print("policy_version of each batch, synchronous:", sync_versions)
    print("policy_version of each batch, pipelined:  ", pipe_versions, "(one update of lag)")
    assert pipe_versions == [0] + sync_versions[:-1]
