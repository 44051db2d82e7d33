"""Tutorial 07 — Using the machine: serial vs processes, envs per process, threads.

Collection speed is steps per second, and the machine's share in it is how many cores the
process tree keeps busy. This tutorial measures both, for about a second each, on CartPole:
one process with one env, one process with N envs (one batched agent call per step), and
worker processes with N/2 envs each. It prints a table and the rules of thumb that follow.
Numbers depend on the machine and on what else runs on it; the ratios are what matter.

Run: python tutorials/07_resource_usage.py   (about 8 seconds: three 1 s runs plus worker start-up)
"""

import os
import time

import torch
from torch import nn

from rlstruct import Agent, Batcher, DictTensor, SerialBatcher
from rlstruct.envs import GymEnvInf

try:
    import psutil  # installed with the dev extras; without it only steps/s are measured
except ImportError:
    psutil = None

N_ENVS = 8
SECONDS = 1.0
T = 32


class Policy(Agent):
    """A small MLP that samples actions: a realistic cost per agent call."""

    def __init__(self) -> None:
        self.model = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))
        self.generator = torch.Generator()

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def __call__(self, state, observation, agent_info, history=None):
        probs = self.model(observation["frame"]).softmax(1)
        action = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
        return DictTensor({"action": action}), state


def cpu_seconds() -> float:
    """CPU time (user + system) used so far by this process and its children (the workers)."""
    if psutil is None:
        return float("nan")
    tree = [psutil.Process(), *psutil.Process().children(recursive=True)]
    total = 0.0
    for proc in tree:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def measure(batcher) -> tuple[float, float]:
    """Steps per second and busy cores over about SECONDS of execute/get."""
    batcher.reset()
    batcher.execute()  # a first segment outside the measure: caches and workers warm up
    batcher.get()
    steps, cpu0, start = 0, cpu_seconds(), time.perf_counter()
    while time.perf_counter() - start < SECONDS:
        batcher.execute()
        traj, _ = batcher.get()
        steps += int(traj.lengths.sum())
    wall = time.perf_counter() - start
    return steps / wall, (cpu_seconds() - cpu0) / wall


def main() -> None:
    # One torch thread in this process: for small models intra-op threads only add overhead
    # (and fight the workers for cores). Batcher workers use n_threads=1 by default.
    torch.set_num_threads(1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    env = {"env": "CartPole-v1"}
    layouts = [
        ("SerialBatcher, 1 env", lambda: SerialBatcher(
            T, Policy, {}, GymEnvInf, {**env, "n_envs": 1})),
        (f"SerialBatcher, {N_ENVS} envs", lambda: SerialBatcher(
            T, Policy, {}, GymEnvInf, {**env, "n_envs": N_ENVS})),
        (f"Batcher, 2 x {N_ENVS // 2} envs", lambda: Batcher(
            T, Policy, {}, GymEnvInf, {**env, "n_envs": N_ENVS // 2}, n_processes=2)),
    ]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{cores} cores available, load average {load:.1f} (other programs compete for them); "
          f"each layout collects for about {SECONDS:.0f} s\n")
    print(f"{'layout':26s} {'steps/s':>9s} {'busy cores':>11s} {'steps/s per core':>17s}")
    for name, make in layouts:
        with make() as batcher:
            speed, busy = measure(batcher)
        per_core = f"{speed / busy:17.0f}" if psutil is not None else f"{'-':>17s}"
        busy_text = f"{busy:11.2f}" if psutil is not None else f"{'-':>11s}"
        print(f"{name:26s} {speed:9.0f} {busy_text} {per_core}")
    if psutil is None:
        print("(install psutil to see the CPU use of the process tree)")
    elif busy < 1.5:
        # Two busy workers should keep about two cores busy; when they do not, other programs
        # hold the cores and more processes cannot help (the last row pays for nothing).
        print(f"(the 2 workers kept only {busy:.2f} cores busy: the cores are shared with other "
              "programs, so processes cannot pay off here)")

    print("""
Rules of thumb:
  1. Batch the agent call first. A step costs one agent call for all the envs of a process, so
     N envs in one process cost little more than one: the 1 env -> N envs row is the cheapest
     speed-up there is.
  2. Then add processes, up to one per core (Batcher(n_processes=cores)); more only fight for
     the same cores. Workers take a second or two to start: create the Batcher once, reuse it.
  3. Envs per process: enough that the agent call is amortised (the agent time per step stays
     a small part of the step), few enough that segments stay short; 4-64 is the usual range.
  4. One torch thread per worker (the Batcher's default n_threads=1) and in the main process
     for small models; intra-op threads on tiny matrices cost more than they give.
  5. A big model or image observations: a SerialBatcher on a GPU (tutorial 06) may beat them
     all.""")


if __name__ == "__main__":
    main()
