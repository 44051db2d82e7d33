"""The layout tuner against the exhaustive grid, in one run, on the same candidates.

Workload: PPO's model and agent (``rlstruct/algos/ppo.py``: ``ActorCritic`` 4->64->64->2 twice,
``PPOAgent``, handed over by ``rlstruct/algos/tuning.py``) collecting CartPole-v1 with
``GymEnvInf``; the
model's ``state_dict`` is published with ``update`` after every batch, as PPO does. After every
batch, ``--learner`` runs PPO's own learn step on it (steps/s is then the speed of training);
otherwise the fake learner takes ``--learn-s`` seconds per batch (default 0: pure collection).
``--batch-size N`` keeps ``P * n_envs * T`` at N steps while the layout varies (the grid is
then smaller). One torch thread per process.

Candidates (36 on any machine): SerialBatcher or a Batcher with 2 workers; 8, 16, 32 or 64
envs per process; T = 16, 32 or 64; pipeline 1 or 2 (workers only). ``--quick``: 2 x 2 x 2
candidates (+ pipelines) and short windows, a smoke run whose numbers mean little.

Method:

1. Warm-up: the workers' forkserver starts and imports once (neither side pays it).
2. Grid: every candidate measured once for ``--grid-s`` seconds (each measurement also pays its
   start-up, a warm-up batch and the close); its wall time is the grid's time.
3. Tuner: :func:`rlstruct.tools.tune.search` over the same candidates with a budget of
   ``--budget-frac`` (default 0.22) of the grid's time; its wall time is the tuner's time.
4. Figures: the ratio of the tuner's pick's steps/s *as the grid measured it* to the grid's best
   steps/s (target >= 0.9), and the time ratio tuner / grid (target <= 0.25).

On a shared machine every figure moves with the neighbours' load: the grid's best is the max of
36 noisy measurements (biased up), so the quality ratio is a conservative one.

Usage::

    python benchmarks/tune_vs_grid.py            # about 2 minutes on 2 cores
    python benchmarks/tune_vs_grid.py --quick    # about 15 s
    python benchmarks/tune_vs_grid.py --json out.json --learn-s 0.01
    python benchmarks/tune_vs_grid.py --learner --batch-size 2048   # under PPO's learner
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from rlstruct.algos import tuning
from rlstruct.tools.tune import BatcherMeasure, candidate_grid, grid_search, search

QUALITY_TARGET = 0.9
TIME_TARGET = 0.25


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (8 candidates)")
    parser.add_argument("--grid-s", type=float, default=2.0, help="window per grid candidate")
    parser.add_argument("--budget-frac", type=float, default=0.22,
                        help="the tuner's budget as a fraction of the grid's time")
    parser.add_argument("--learn-s", type=float, default=0.0, help="fake learner s per batch")
    parser.add_argument("--learner", action="store_true",
                        help="run PPO's learn step on every batch (instead of --learn-s)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="keep P x n_envs x T at this many steps (default: any)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the tuner's finals")
    parser.add_argument("--objective", default="steps_per_s",
                        choices=("steps_per_s", "steps_per_cpu_s"))
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    if args.learner and args.learn_s:
        parser.error("--learner and --learn-s exclude each other")
    if args.quick:
        candidates = candidate_grid((1, 2), (8, 32), (16, 32), (1, 2), devices=(),
                                    batch_size=args.batch_size)
        args.grid_s = min(args.grid_s, 0.3)
    else:
        candidates = candidate_grid((1, 2), (8, 16, 32, 64), (16, 32, 64), (1, 2), devices=(),
                                    batch_size=args.batch_size)
    setup = tuning.ppo(hidden=64)
    measure = BatcherMeasure(setup.create_agent, setup.agent_args, setup.create_env,
                             setup.env_args, learn_s=args.learn_s, weights=setup.weights,
                             learn=setup.learn if args.learner else None)
    measure.warm_up()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    learner = "PPO's learn step" if args.learner else f"fake learner {args.learn_s} s"
    print(f"{len(candidates)} candidates, {os.cpu_count()} cores, load {load:.1f}; grid: "
          f"{args.grid_s} s each; objective {args.objective}; {learner}; batch "
          f"{args.batch_size or 'any'}")

    t0 = time.perf_counter()
    grid = grid_search(candidates, measure, seconds=args.grid_s, objective=args.objective)
    grid_wall = time.perf_counter() - t0
    budget = args.budget_frac * grid_wall
    if args.quick:  # a smoke run: the tuner needs one measurement and its start-up, whatever
        budget = max(budget, 4 * args.grid_s + 1.0)  # the tiny grid took (no verdict holds)
    t0 = time.perf_counter()
    tuned = search(candidates, measure, budget_s=budget, objective=args.objective,
                   n_rounds=args.rounds)
    tune_wall = time.perf_counter() - t0

    print(f"\ngrid ({grid_wall:.1f} s, {grid.n_measurements} measurements), best 10:")
    print("\n".join(grid.table().splitlines()[:11]))
    print(f"\ntuner ({tune_wall:.1f} s of a {budget:.1f} s budget, {tuned.n_measurements} "
          f"measurements of {len(tuned.stats)} candidates):")
    print(tuned.table())

    best_value = grid.stats[grid.best].score(args.objective)
    pick_value = grid.stats[tuned.best].score(args.objective)
    quality, time_ratio = pick_value / best_value, tune_wall / grid_wall
    rank = [s.candidate for s in grid.ranked()].index(tuned.best) + 1
    ok = quality >= QUALITY_TARGET and time_ratio <= TIME_TARGET
    print(f"\ngrid's pick:  {grid.best.label}  ({best_value:.0f})")
    print(f"tuner's pick: {tuned.best.label}  ({pick_value:.0f} as the grid measured it, "
          f"rank {rank} of {len(candidates)} in the grid)")
    print(f"quality: tuner's pick / grid's best = {quality:.3f} (target >= {QUALITY_TARGET})")
    print(f"time: tuner / grid = {time_ratio:.3f} (target <= {TIME_TARGET})")
    print("PASS" if ok else "MISS")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "n_candidates": len(candidates), "grid_s": args.grid_s, "learn_s": args.learn_s,
            "learner": args.learner, "batch_size": args.batch_size, "rounds": args.rounds,
            "objective": args.objective, "grid_wall_s": grid_wall, "tune_wall_s": tune_wall,
            "budget_s": budget, "grid_best": grid.best.label, "tuner_pick": tuned.best.label,
            "tuner_rank": rank, "quality_ratio": quality, "time_ratio": time_ratio,
            "tuner_measurements": tuned.n_measurements, "verdict": "PASS" if ok else "MISS",
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
