"""SAC's learn step alone: where its time goes (torch's profiler), eager against ``torch.compile``.

Workload: one ``rlstruct.algos.sac.learn`` call at ``sac --preset mujoco``'s shapes on Hopper-v5
(256-wide ReLU nets, batches of 256, 11 observation and 3 action dimensions, fused Adam, the
Polyak update), on a fixed synthetic batch, so that only the update is timed: no env, no
buffer, no worker. Each variant runs on every thread count asked for (``--threads``, default 1
and the machine's cores), in this process, one after the other:

* ``eager``: ``sac.learn`` as the algorithm calls it;
* ``concurrent``: ``sac.learn`` with a one-thread pool (``sac --concurrent-losses``): the
  critic's loss and the policy's built and back-propagated at once, each thread on half the
  torch threads (on 2 threads or more, as the flag);
* ``compile``: ``torch.compile(sac.learn)`` (inductor, default mode); its first call, which
  compiles, is timed apart (``first_call_s``).

step (self CPU time per operator, per step). ``--quick`` is a smoke run (a few steps, no
compile; figures meaningless). rlstruct is imported first, so OpenMP's wait policy is the one
``rlstruct train`` runs with (passive unless ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is set).

Run: ``python benchmarks/sac_update.py [--threads 1 2] [--reps 5] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from _common import environment
from sac_peers import ACT_DIM, BATCH, HIDDEN, OBS_DIM, update_matmuls


def setup() -> tuple[Any, Any, Any, Any]:
    """The preset's nets, their fused Adam, a synthetic batch of ``BATCH`` transitions and the
    preset's config: ``(nets, optimizer, batch, cfg)``."""
    import gymnasium as gym
    import torch

    from rlstruct import DictTensor
    from rlstruct import keys as K
    from rlstruct.algos import sac
    from rlstruct.blocks.distributions import space_spec
    from rlstruct.blocks.optim import adam

    torch.manual_seed(0)
    spec = space_spec(gym.spaces.Box(-1.0, 1.0, (ACT_DIM,)))
    nets = sac.sac_nets(lambda: sac.Actor(OBS_DIM, spec, HIDDEN),
                        lambda: sac.TwinQ(OBS_DIM, ACT_DIM, HIDDEN), 1.0)
    optimizer = adam(list(nets.parameters()), lr=3e-4, device=torch.device("cpu"))
    batch = DictTensor({
        K.OBS_FRAME: torch.randn(BATCH, OBS_DIM), sac.STORED_SQUASHED: torch.rand(BATCH, ACT_DIM)
        * 2 - 1, K.NEXT_FRAME: torch.randn(BATCH, OBS_DIM), K.NEXT_REWARD: torch.randn(BATCH),
        K.NEXT_TERMINATED: torch.rand(BATCH) < 0.01,
        K.NEXT_TRUNCATED: torch.zeros(BATCH, dtype=torch.bool)})
    cfg = sac.Config(hidden=HIDDEN, batch_size=BATCH, lr=3e-4, tau=0.005, gamma=0.99)
    return nets, optimizer, batch, cfg


def time_steps(step: Any, reps: int, n: int) -> dict[str, Any]:
    """``step()`` timed: the first call apart, then ``reps`` rounds of ``n`` calls (ms a call)."""
    t = time.perf_counter()
    step()
    first = time.perf_counter() - t
    for _ in range(5):
        step()
    rounds = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n):
            step()
        rounds.append((time.perf_counter() - t) / n * 1e3)
    return {"ms": statistics.median(rounds), "rounds_ms": rounds, "first_call_s": first}


def profile_table(step: Any, n: int, rows: int = 12) -> list[dict[str, Any]]:
    """torch's profiler over ``n`` calls of ``step``: the operators with the most self CPU time,
    per call (``ms``), their calls per step and their share of the step."""
    import torch

    for _ in range(3):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [{"op": e.key, "calls": e.count / n, "ms": e.self_cpu_time_total / n / 1e3,
             "share": e.self_cpu_time_total / total} for e in events[:rows]]


def measure(threads: int, variants: list[str], reps: int, n: int) -> dict[str, Any]:
    """Every variant on ``threads`` torch threads, and the matmuls alone on as many."""
    import torch

    from rlstruct.algos import sac

    torch.set_num_threads(threads)
    out: dict[str, Any] = {"limit": update_matmuls(reps)}
    for name in [v for v in variants if threads > 1 or v != "concurrent"]:
        nets, optimizer, batch, cfg = setup()
        with ThreadPoolExecutor(1) as pool:
            torch.set_num_threads(threads // 2 if name == "concurrent" else threads)
            learn = (torch.compile(sac.learn) if name == "compile" else
                     partial(sac.learn, pool=pool if name == "concurrent" else None))
            out[name] = time_steps(lambda: learn(nets, optimizer, batch, cfg), reps, n)  # noqa: B023
        out[name]["of_limit"] = out["limit"]["matmul_ms"] / out[name]["ms"]
        print(f"{threads} thread(s), {name}: {out[name]['ms']:.2f} ms a step (first call "
              f"{out[name]['first_call_s']:.2f} s; load {os.getloadavg()[0]:.2f})", flush=True)
    torch.set_num_threads(threads)
    for name in ("compile", "concurrent"):
        if name in out:
            out[f"{name}_over_eager"] = out[name]["ms"] / out["eager"]["ms"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help="torch thread counts (default: 1 and the machine's cores)")
    p.add_argument("--reps", type=int, default=5, help="timed rounds a variant")
    p.add_argument("--steps", type=int, default=100, help="steps a round")
    p.add_argument("--no-compile", action="store_true", help="eager only")
    p.add_argument("--quick", action="store_true", help="a smoke run (seconds, not figures)")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    threads = args.threads or sorted({1, len(os.sched_getaffinity(0))})
    import rlstruct  # noqa: F401  (before torch: OpenMP's wait policy of rlstruct train)

    variants = ["eager", "concurrent"] + ([] if args.no_compile or args.quick else ["compile"])
    if args.quick:
        threads, args.reps, args.steps = [2], 2, 5  # concurrent: 2 threads of 1
    print(f"load average before: {os.getloadavg()}", flush=True)
    results = {str(t): measure(t, variants, args.reps, args.steps) for t in threads}
    import torch

    from rlstruct.algos import sac

    torch.set_num_threads(threads[0])
    nets, optimizer, batch, cfg = setup()
    table = profile_table(lambda: sac.learn(nets, optimizer, batch, cfg), args.steps)
    print(f"\nSAC's learn step at the preset's shapes (batch {BATCH}, {HIDDEN}-wide nets); "
          f"load average now {os.getloadavg()}")
    print(f"{'threads':>7} {'variant':8} {'ms/step':>8} {'first call s':>13} {'x limit':>8}")
    for t, r in results.items():
        for name in [v for v in variants if v in r]:
            print(f"{t:>7} {name:8} {r[name]['ms']:8.2f} {r[name]['first_call_s']:13.2f} "
                  f"{r[name]['of_limit']:8.2f}")
        print(f"{t:>7} {'matmuls':8} {r['limit']['matmul_ms']:8.2f} {'':>13} {1.0:8.2f}")
        for name in ("compile", "concurrent"):
            if f"{name}_over_eager" in r:
                print(f"{t:>7} {name} / eager: {r[f'{name}_over_eager']:.2f}")
    print(f"\nprofile of the eager step on {threads[0]} thread(s), self CPU per step:")
    print(f"{'operator':36} {'calls':>6} {'ms':>7} {'share':>6}")
    for row in table:
        print(f"{row['op'][:36]:36} {row['calls']:6.1f} {row['ms']:7.3f} {row['share']:6.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": results, "profile": table,
                                               "env": environment()}, indent=1))


if __name__ == "__main__":
    main()
