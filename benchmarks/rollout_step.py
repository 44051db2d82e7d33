"""The cost of one vector step in one process: what a ``Batcher`` worker pays per step.

Workload: throughput.py's (CartPole-v1, the MLP 4-64-64-2 with tanh, ``torch.multinomial``
sampling, under ``no_grad``, one torch thread), with 32 envs: one worker of throughput.py's
``Batcher(2 x GymEnvInf(32))``. The rlstruct row runs the batchers' acquisition loop
(:class:`rlstruct.batchers.rollout.Rollout` over ``GymEnvInf(32)`` and a ``SlotBuffer``, segments
of ``T`` steps) in this process; the reference rows run gymnasium's ``SyncVectorEnv`` with the
same MLP, on 32 and on 64 envs (throughput.py's row 2). A fourth row is the rlstruct row with
``GymEnvInf(..., check_obs=False)``: the "observation check" line gives what the check of NaN and
infinite observations costs per worker step (the difference of the medians, and the median of
the per-rep paired differences and ratios). On a busy machine that difference drowns in the
noise, so a last pass times ``GymEnvInf(32).step`` alone with the check on and off, in
``--blocks`` interleaved blocks of 64 steps (random actions, so about 1.5 episodes end per
step), and reports the minimum, 10th percentile and median per step of each: the minimum is what
neighbours disturb least.

Method: CPU time (``time.process_time``) of whole segments, after two warm-up segments; the rows
are interleaved, ``--reps`` times, and each figure is the median (min-max) over the reps, in µs
per vector step and per env transition (a vector step of ``n`` envs holds ``n`` transitions; the
next-step auto-reset calls of ``SyncVectorEnv`` count as steps here). A separate pass splits the
rlstruct step with timers around its parts (agent call, ``env.step``, buffer write; the rest is
the loop and the agent-output checks); the timers add about 1 µs per step.

Usage::

    python benchmarks/rollout_step.py               # ~15 s
    python benchmarks/rollout_step.py --quick       # smoke run
    python benchmarks/rollout_step.py --json out.json
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import _common
import gymnasium as gym
import torch
from throughput import ENV_ID, MLPAgent, make_cartpole, make_mlp, sample_actions

from rlstruct.batchers.buffer import SlotBuffer
from rlstruct.batchers.rollout import Rollout, infer_specs
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.gym import GymEnvInf

N_ENVS = 32  # one worker of throughput.py's Batcher(2 x GymEnvInf(32))


class RolloutLoop:
    """The batchers' loop over ``GymEnvInf(32)`` in this process."""

    n = N_ENVS

    def __init__(self, n_timesteps: int, check_obs: bool = True) -> None:
        self.T = n_timesteps
        self.label = "rlstruct Rollout(GymEnvInf(32)) + MLP" + (
            "" if check_obs else ", check_obs=False")
        torch.manual_seed(0)
        self.env = GymEnvInf(ENV_ID, n_envs=self.n, seed=0, check_obs=check_obs)
        self.agent = MLPAgent()
        empty = DictTensor(batch_size=self.n, device="cpu")
        step_specs, info_specs = infer_specs(self.env, self.agent, empty, empty)
        self.buffer = SlotBuffer(self.n, n_timesteps, step_specs, info_specs)
        self.rollout = Rollout(self.env, self.agent, self.buffer, offset=0)
        self.rollout.reset(empty, empty)

    def segment(self) -> None:
        self.rollout.run(self.T)


class GymLoop:
    """gymnasium ``SyncVectorEnv(n)`` and the batched MLP (throughput.py's row 2 for 64)."""

    def __init__(self, n_timesteps: int, n: int) -> None:
        self.T, self.n = n_timesteps, n
        self.label = f"gymnasium SyncVectorEnv({n}) + MLP"
        self.envs = gym.vector.SyncVectorEnv([make_cartpole] * n, copy=False)
        self.obs, _ = self.envs.reset(seed=0)
        self.model = make_mlp()

    def segment(self) -> None:
        obs, model, envs = self.obs, self.model, self.envs
        with torch.no_grad():
            for _ in range(self.T):
                actions = sample_actions(model(torch.from_numpy(obs))).numpy()
                obs, _, _, _, _ = envs.step(actions)
        self.obs = obs


def cpu_us_per_step(loop: Any, segments: int) -> float:
    t0 = time.process_time()
    for _ in range(segments):
        loop.segment()
    return (time.process_time() - t0) / (segments * loop.T) * 1e6


def env_step_check_cost(blocks: int) -> dict[str, dict[str, float]]:
    """Wall µs per ``GymEnvInf(32).step`` with ``check_obs`` on and off: ``blocks`` interleaved
    blocks of 64 steps each; ``{"on"|"off": {"min", "p10", "median"}}``."""
    gen = torch.Generator().manual_seed(0)
    actions = [DictTensor({"action": torch.randint(0, 2, (N_ENVS,), generator=gen)})
               for _ in range(64)]
    envs = {k: GymEnvInf(ENV_ID, n_envs=N_ENVS, seed=0, check_obs=k == "on")
            for k in ("on", "off")}
    times: dict[str, list[float]] = {k: [] for k in envs}
    for env in envs.values():
        env.reset()
    for b in range(blocks):
        for key in ("on", "off") if b % 2 else ("off", "on"):
            env = envs[key]
            t0 = time.perf_counter()
            for a in actions:
                env.step(a)
            times[key].append((time.perf_counter() - t0) / len(actions) * 1e6)
    out = {}
    for key, v in times.items():
        v.sort()
        out[key] = {"min": v[0], "p10": v[len(v) // 10], "median": statistics.median(v)}
    return out


def _timed(obj: Any, name: str, label: str, acc: Counter) -> Callable[[], None]:
    """Wraps ``obj.name`` with a timer adding to ``acc[label]``; returns the undo."""
    inner = getattr(obj, name)
    clock = time.perf_counter

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            return inner(*args, **kwargs)
        finally:
            acc[label] += clock() - t0

    setattr(obj, name, timed)
    return lambda: setattr(obj, name, inner)


def breakdown(loop: RolloutLoop, segments: int) -> dict[str, float]:
    """µs per vector step of each part of the rlstruct step (wall clock, timers around parts)."""
    acc: Counter = Counter()
    rollout = loop.rollout
    undo = [
        _timed(loop.env, "step", "env.step", acc),
        _timed(loop.buffer, "write_steps", "buffer write", acc),
    ]
    # The agent is called through the rollout's attribute: time it there.
    agent = rollout.agent
    rollout.agent = lambda *a: _call(agent, acc, *a)
    undo.append(lambda: setattr(rollout, "agent", agent))
    try:
        t0 = time.perf_counter()
        for _ in range(segments):
            loop.segment()
        total = time.perf_counter() - t0
    finally:
        for u in reversed(undo):
            u()
    steps = segments * loop.T
    parts = {k: v / steps * 1e6 for k, v in acc.items()}
    parts["total"] = total / steps * 1e6
    parts["rest (loop, checks)"] = parts["total"] - sum(
        v for k, v in parts.items() if k != "total"
    )
    return parts


def _call(agent: Any, acc: Counter, *args: Any) -> Any:
    t0 = time.perf_counter()
    try:
        return agent(*args)
    finally:
        acc["agent call"] += time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (a few segments)")
    parser.add_argument("--reps", type=int, default=None, help="interleaved reps (default 7)")
    parser.add_argument("--segments", type=int, default=None, help="segments per rep (20)")
    parser.add_argument("-T", dest="T", type=int, default=64, help="steps per segment (64)")
    parser.add_argument("--blocks", type=int, default=None,
                        help="blocks of the env.step check_obs pass (default 200, quick 4)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    args = parser.parse_args(argv)
    reps = args.reps or (2 if args.quick else 7)
    segments = args.segments or (2 if args.quick else 20)
    _common.pin_threads(1)
    loops = [RolloutLoop(args.T), GymLoop(args.T, N_ENVS), GymLoop(args.T, 2 * N_ENVS),
             RolloutLoop(args.T, check_obs=False)]
    for loop in loops:
        for _ in range(2):
            loop.segment()
    samples: dict[str, list[float]] = {loop.label: [] for loop in loops}
    for rep in range(reps):
        for loop in loops[rep % len(loops):] + loops[: rep % len(loops)]:
            samples[loop.label].append(cpu_us_per_step(loop, segments))
    parts = breakdown(loops[0], segments)
    env = _common.environment()
    print(
        f"one vector step in one process: {ENV_ID}, T={args.T}, {reps} reps x {segments} "
        f"segments, interleaved; torch {env['torch']}, load avg {env['loadavg_at_start']}"
    )
    print(f"{'setup':<42} {'CPU us per vector step':>26} {'us per transition':>18}")
    rows = []
    for loop in loops:
        s = _common.summarize(samples[loop.label])
        rows.append({"label": loop.label, "n_envs": loop.n, "us_per_step": s,
                     "us_per_transition": s["median"] / loop.n})
        print(f"{loop.label:<42} {s['median']:>9.1f} ({s['min']:.1f}-{s['max']:.1f})".ljust(70)
              + f"{s['median'] / loop.n:>17.2f}")
    on, off = samples[loops[0].label], samples[loops[3].label]
    paired = [a - b for a, b in zip(on, off)]
    check = {
        "us_per_step": _common.summarize(on)["median"] - _common.summarize(off)["median"],
        "paired_us": _common.summarize(paired),
        "paired_ratio": _common.summarize([a / b for a, b in zip(on, off)]),
    }
    print(f"observation check (check_obs=True - False): {check['us_per_step']:+.1f} us per vector "
          f"step ({check['us_per_step'] / _common.summarize(off)['median']:+.1%} of the step); "
          f"paired per rep: {check['paired_us']['median']:+.1f} us "
          f"({check['paired_us']['min']:+.1f} to {check['paired_us']['max']:+.1f}), ratio "
          f"{check['paired_ratio']['median']:.3f}")
    alone = env_step_check_cost(args.blocks or (4 if args.quick else 200))
    on_, off_ = alone["on"], alone["off"]
    check["env_step_alone_us"] = alone
    print(f"GymEnvInf(32).step alone, check_obs on / off (wall us per step): min "
          f"{on_['min']:.1f} / {off_['min']:.1f} ({on_['min'] - off_['min']:+.1f}), p10 "
          f"{on_['p10']:.1f} / {off_['p10']:.1f}, median {on_['median']:.1f} / "
          f"{off_['median']:.1f}")
    print("rlstruct step, split (wall us per vector step, timers around the parts):")
    for k, v in parts.items():
        print(f"  {k:<24} {v:7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "rollout_step", "T": args.T, "reps": reps,
                       "segments": segments, "environment": env, "rows": rows,
                       "check_obs_cost": check, "split_us": parts}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
