"""Tutorial 07 — Using the machine: let the tuner choose the batcher's layout.

How fast a run collects depends on its *layout*: one process stepping all the envs
(SerialBatcher) or P worker processes (Batcher), how many envs each process steps (one batched
agent call per step for all of them), the segment length T, and whether the workers collect the
next segment while the learner learns (pipeline 2). The best layout depends on the machine, on
what else runs on it, on the env and on the model, so rlstruct measures it instead of guessing:

    rlstruct tune --algo rlstruct.algos.tuning:ppo --budget 60 --out tune.json   # shell
    rlstruct.tools.tune.tune(create_agent, agent_args, create_env, env_args, budget_s=60)  # Python

The tuner builds each candidate batcher, collects for a moment and reports steps/s, the cores
the whole process tree kept busy, steps per CPU-second and the start-up time. It does not try
the whole grid: a coordinate search moves from the middle of the grid along one axis at a time
(workers, envs per process, T, pipeline) towards the fastest layout, then measures the leaders
again, longer and in turn, so a lucky quiet moment on a shared machine does not decide. It
writes its pick to a JSON file of LayoutConfig fields that make_batcher and the algorithms read.

This tutorial tunes a small candidate set (12 layouts) within a budget of 8 seconds of
measurements (the search measures only some of them: how many depends on the machine's load
and on each batcher's start-up), then builds the chosen batcher from the file. Numbers depend
on the machine and its load; with `objective="steps_per_cpu_s"` the tuner prefers layouts that
waste no core (a shared machine).

The runnable companion of one page, which explains it and links here:
[Resources: tuning the layout](../docs/guide-resources.md#tuning-the-layout).

Run: python tutorials/07_resource_usage.py   (5.4 s on a quiet 2-core machine: it measured 5 of
the 12 layouts in 2.3 s of its 8-second budget)
"""

import json
import tempfile
from pathlib import Path

import torch
from torch import nn

from rlstruct import Agent, DictTensor
from rlstruct.batchers.make import make_batcher
from rlstruct.envs import GymEnvInf
from rlstruct.runs.layout_file import read_layout, write_layout
from rlstruct.tools.tune import candidate_grid, tune, tuned_layout


class Policy(Agent):
    """A small MLP that samples actions: a realistic cost per agent call."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.generator = torch.Generator()

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def __call__(self, state, observation, agent_info):
        probs = self.model(observation["frame"]).softmax(1)
        action = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
        return DictTensor({"action": action}), state


def main() -> None:
    torch.set_num_threads(1)  # small models: intra-op threads only fight the workers for cores
    model = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))

    # 1. The candidates: SerialBatcher (1 process) or 2 workers, 8 or 32 envs per process,
    #    T = 16 or 32, pipelined or not (workers only). On a machine with a GPU the default grid
    #    also holds a SerialBatcher on cuda:0; here we pass devices=() to stay on the CPU.
    candidates = candidate_grid(processes=(1, 2), n_envs_options=(8, 32),
                                n_timesteps_options=(16, 32), pipelines=(1, 2), devices=())
    print(f"{len(candidates)} candidate layouts, e.g. {candidates[0].label!r}, "
          f"{candidates[-1].label!r}\n")

    # 2. Tune. Every candidate collects with the same fake learner: learn_s seconds of sleep per
    #    batch (0: pure collection), then update(weights) as a training loop publishes its
    #    weights. A pipelined layout only pays off when there is learning to overlap with:
    #    set learn_s to your learner's time per batch to see it, or better, pass learn= your
    #    learn step on one batch (learn(traj)) so that each layout is measured under it, and
    #    batch_size= to keep P x n_envs x T fixed (what `rlstruct tune` does).
    result = tune(Policy, {"model": model}, GymEnvInf, {"env": "CartPole-v1"},
                  candidates=candidates, budget_s=8.0, learn_s=0.0,
                  weights=model.state_dict(), verbose=False)
    print(result.table())
    print(f"\nthe tuner measured {len(result.stats)} of {result.n_candidates} layouts "
          f"({result.n_measurements} measurements, {result.spent_s:.1f} s) and picked "
          f"{result.best.label!r}")

    # 3. The pick as a layout file: LayoutConfig's fields, n_timesteps and the measurements.
    with tempfile.TemporaryDirectory() as tmp:
        path = write_layout(Path(tmp) / "tune.json", tuned_layout(result, env_id="CartPole-v1"))
        data = json.loads(path.read_text())
        print("\ntune.json:", {k: v for k, v in data.items() if k != "tuned"})

        # 4. Use it: make_batcher takes the layout (an algorithm takes --layout tune.json).
        tuned = read_layout(path)
        with make_batcher(**tuned.batcher_kwargs(), create_agent=Policy,
                          agent_args={"model": model}, create_env=GymEnvInf,
                          env_args={"env": "CartPole-v1", "n_envs": tuned.layout.n_envs},
                          seeds=0) as batcher:
            batcher.reset()
            batcher.execute()
            traj, _ = batcher.get()
            print(f"\n{type(batcher).__name__} from the file collected "
                  f"{int(traj.lengths.sum())} steps in one batch "
                  f"({tuned.layout.n_processes} x {tuned.layout.n_envs} envs x "
                  f"T={tuned.n_timesteps})")

    print("""
Reading the table:
  steps/s      what a run's collection speed will be (the default objective).
  cores busy   CPU seconds of the process tree per second: 2 workers should keep about 2
               cores busy; when they keep fewer, other programs hold the cores.
  steps/CPU-s  efficiency: the objective to choose on a shared machine (the CLI's
               --objective steps_per_cpu_s).
  start-up s   constructor and reset: workers start in a fraction of a second once the
               program's first Batcher has started the forkserver.
Rules that still hold: batch the agent call first (more envs per process), then add
processes up to one per core, one torch thread per worker for small models.""")


if __name__ == "__main__":
    main()
