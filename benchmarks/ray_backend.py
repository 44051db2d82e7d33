"""RayBatcher next to Batcher on one machine: start-up, throughput, update cost, restart time.

Everything is measured in the same run, with the same workload for both backends:

1. start-up: the program's first ``Batcher`` (2 workers), the first ``RayBatcher`` (2 actors;
   it starts a local Ray cluster: loopback only, no dashboard), and a second ``RayBatcher`` on
   the cluster already running (constructor time: actors started and ready);
2. throughput: the workload of ``throughput.py`` (CartPole-v1, MLP 4-64-64-2 with sampled
   actions: ``from throughput import MLPAgent``), 2 workers/actors x ``GymEnvInf(32)``,
   ``T=64``; both batchers alive at once, repetitions interleaved (rep ``r`` runs each backend
   for at least ``--min-time`` seconds); median steps/s and the ratio Ray / Batcher;
3. ``update()`` of a 50M-parameter state_dict (two ``Linear(5000, 5000)``, 200 MB) to 2
   workers/actors: the call itself (Batcher: a copy into shared memory; RayBatcher: one
   ``ray.put``), and the extra time of the next ``execute()``/``get()`` (every worker/actor
   loads the new version) over one without an update;
4. restart time: worker 1's env 0 raises at its 100th step (every replacement's too), so a
   restart happens every other segment; the extra time of a ``get()`` with a restart over one
   without, for an env exception (``raise``) and a dead process/actor (``kill``; ``--quick``:
   ``raise`` only).

One machine is the worst case for Ray: it pays per call (object store, gRPC) what a shared-memory
``Batcher`` does not; what it buys is the second machine. No target here: the ratios are reported
as measured.

Usage::

    python benchmarks/ray_backend.py            # ~2-3 min on 2 cores
    python benchmarks/ray_backend.py --quick    # smoke run (small sizes; numbers mean little)
    python benchmarks/ray_backend.py --json out.json
"""

from __future__ import annotations

import os

# One thread per process, before torch starts its pool; workers and actors inherit it.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"
# The cluster this script starts for sections 2-4 (after RayBatcher started and shut down its
# own in section 1): loopback only and no usage statistics, like RayBatcher's own; read by Ray
# when it is imported, so before that.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import _common
import cloudpickle
import gymnasium as gym
import throughput
import torch
from throughput import ENV_ID, MLPAgent
from torch import nn

from rlstruct.agent import Agent
from rlstruct.batchers import Batcher
from rlstruct.batchers.restart import RestartPolicy
from rlstruct.batchers.seeding import SEED_BLOCK
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.faults import FaultyEnv
from rlstruct.envs.gym import GymEnvInf

# Ray actors do not see benchmarks/ on their sys.path: the policy travels by value.
cloudpickle.register_pickle_by_value(throughput)

N_PROCS = 2
N_ENVS = 32  # per worker/actor
FAULT_AT_STEP = 100  # with T=64: in every other segment of a worker's life


class BigModelAgent(Agent):
    """Random actions; holds a model of ``2 * width**2`` parameters that updates load into."""

    def __init__(self, width: int = 5000) -> None:
        with torch.random.fork_rng(devices=[]):
            self.model = nn.Sequential(nn.Linear(width, width), nn.Linear(width, width))

    def __call__(self, state, observation, agent_info):
        n = observation["frame"].shape[0]
        return DictTensor({"action": torch.randint(2, (n,))}), state


class AlternatingAgent(Agent):
    """Actions 0/1 by env step (cheap: the restart measurement times the restart)."""

    def __call__(self, state, observation, agent_info):
        return DictTensor({"action": observation["env_step"] % 2}), state


def cartpole(n_envs: int, seed: int) -> GymEnvInf:
    return GymEnvInf(ENV_ID, n_envs=n_envs, seed=seed)


def _make_faulty(fault: str) -> gym.Env:
    return FaultyEnv(gym.make(ENV_ID), fault, FAULT_AT_STEP)


def faulty_cartpole(n_envs: int, seed: int, fault: str) -> GymEnvInf:
    """Worker 1's env 0 fails at its ``FAULT_AT_STEP``-th step, in every replacement too."""
    worker = (seed % SEED_BLOCK) // n_envs
    factories: list[Callable[[], gym.Env]] = [lambda: gym.make(ENV_ID)] * n_envs
    if worker == 1:
        factories[0] = lambda: _make_faulty(fault)
    return GymEnvInf(factories, seed=seed)


def ray_batcher(*args: Any, **kw: Any) -> Any:
    from rlstruct.batchers import RayBatcher

    return RayBatcher(*args, **kw)


BACKENDS: dict[str, Callable[..., Any]] = {"batcher": Batcher, "ray": ray_batcher}


def collection(cls: Callable[..., Any], n_envs: int, t: int) -> Any:
    return cls(t, MLPAgent, {}, cartpole, {"n_envs": n_envs}, n_processes=N_PROCS, seeds=0)


def one_batch(b: Any) -> int:
    b.execute()
    batch, _ = b.get()
    return int(batch.trajectories.lengths.sum())


# ------------------------------------------------------------------------------ 1. start-up
def measure_startup(n_envs: int, t: int) -> dict[str, float]:
    """Constructor times: the program's first Batcher; the first RayBatcher, which starts a
    local cluster (and shuts it down at close); then, with a cluster started by this script
    (kept for the other sections), a RayBatcher on a running cluster."""
    import ray

    out = {}
    for name, cls in (("batcher", Batcher), ("ray", ray_batcher)):
        t0 = time.perf_counter()
        b = cls(t, MLPAgent, {}, cartpole, {"n_envs": n_envs}, n_processes=N_PROCS)
        out[f"{name}_first"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        b.close()
        out[f"{name}_close"] = time.perf_counter() - t0
    assert not ray.is_initialized()
    ray.init(address="local", num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1")
    for key in ("ray_later", "ray_later_again"):
        t0 = time.perf_counter()
        b = ray_batcher(t, MLPAgent, {}, cartpole, {"n_envs": n_envs}, n_processes=N_PROCS)
        out[key] = time.perf_counter() - t0
        t0 = time.perf_counter()
        b.close()
        out["ray_close_on_running_cluster"] = time.perf_counter() - t0
    return out


# ------------------------------------------------------------------------------ 2. throughput
def measure_throughput(n_envs: int, t: int, reps: int, min_time: float) -> dict[str, Any]:
    batchers = {name: collection(cls, n_envs, t) for name, cls in BACKENDS.items()}
    try:
        for b in batchers.values():
            b.reset()
            for _ in range(2):  # warm-up
                one_batch(b)
        samples: dict[str, list[float]] = {name: [] for name in batchers}
        latency: dict[str, list[float]] = {name: [] for name in batchers}
        order = list(batchers)
        for r in range(reps):
            for name in order[r % 2 :] + order[: r % 2]:
                b, steps, n = batchers[name], 0, 0
                t0 = time.perf_counter()
                while True:
                    steps += one_batch(b)
                    n += 1
                    if time.perf_counter() - t0 >= min_time:
                        break
                wall = time.perf_counter() - t0
                samples[name].append(steps / wall)
                latency[name].append(wall / n)
    finally:
        for b in batchers.values():
            b.close()
    med = {name: statistics.median(s) for name, s in samples.items()}
    return {
        "steps_per_s": {name: _common.summarize(s) for name, s in samples.items()},
        "seconds_per_batch": {name: statistics.median(s) for name, s in latency.items()},
        "ratio_ray_to_batcher": med["ray"] / med["batcher"],
        "paired_ratios": [r / b for r, b in zip(samples["ray"], samples["batcher"])],
    }


# ------------------------------------------------------------------------------ 3. update
def measure_update(width: int, n_updates: int) -> dict[str, Any]:
    learner = nn.Sequential(nn.Linear(width, width), nn.Linear(width, width))
    state_dict = {k: v.detach() for k, v in learner.state_dict().items()}
    out: dict[str, Any] = {"n_params": sum(v.numel() for v in state_dict.values())}
    for name, cls in BACKENDS.items():
        calls, loads = [], []
        with cls(
            4,
            BigModelAgent,
            {"width": width},
            cartpole,
            {"n_envs": 4},
            n_processes=N_PROCS,
            timeout=600,
        ) as b:
            b.reset()
            b.update(state_dict)  # the first one allocates (Batcher's ring)
            b.execute()
            b.get()
            for _ in range(n_updates):
                t0 = time.perf_counter()
                b.execute()
                b.get()
                plain = time.perf_counter() - t0
                with torch.no_grad():
                    learner[0].bias.add_(1.0)  # a new version each time
                t0 = time.perf_counter()
                b.update(state_dict)
                calls.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                b.execute()
                b.get()  # every worker/actor has loaded the new version
                loads.append(time.perf_counter() - t0 - plain)
        out[name] = {"call_s": _common.summarize(calls), "load_s": _common.summarize(loads)}
    return out


# ------------------------------------------------------------------------------ 4. restarts
def measure_restarts(
    n_segments: int, faults: tuple[str, ...] = ("raise", "kill")
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, cls in BACKENDS.items():
        for fault in faults:
            with cls(
                64,
                AlternatingAgent,
                {},
                faulty_cartpole,
                {"n_envs": 4, "fault": fault},
                n_processes=N_PROCS,
                restart=RestartPolicy(max_restarts=1000),
            ) as b:
                b.reset()
                clean, faulty = [], []
                for _ in range(n_segments):
                    n_faults = len(b.faults)
                    t0 = time.perf_counter()
                    b.execute()
                    b.get()
                    (faulty if len(b.faults) > n_faults else clean).append(time.perf_counter() - t0)
            base = statistics.median(clean)
            out[f"{name}_{fault}"] = {
                "restart_s": _common.summarize([f - base for f in faulty]),
                "clean_get_s": base,
            }
    return out


# ------------------------------------------------------------------------------ main
def run(quick: bool, reps: int | None, min_time: float | None) -> dict[str, Any]:
    if quick:
        n_envs, t, reps, min_time, width, n_updates, n_segments = 4, 16, 1, 0.05, 64, 2, 4
    else:
        n_envs, t, width, n_updates, n_segments = N_ENVS, 64, 5000, 5, 9
        reps, min_time = reps or 5, min_time or 3.0
    result: dict[str, Any] = {"environment": _common.environment(quick=quick)}
    result["startup_s"] = measure_startup(n_envs, t)
    result["throughput"] = measure_throughput(n_envs, t, reps, min_time)
    result["update"] = measure_update(width, n_updates)
    result["restart"] = measure_restarts(n_segments, ("raise",) if quick else ("raise", "kill"))
    import ray

    ray.shutdown()
    return result


def print_result(result: dict[str, Any]) -> None:
    s = result["startup_s"]
    print("start-up (s)")
    print(f"  Batcher, program's first (2 workers)      {s['batcher_first']:7.2f}")
    print(f"  RayBatcher, first (starts local cluster)  {s['ray_first']:7.2f}")
    print(
        f"  RayBatcher, on a running cluster          {s['ray_later']:7.2f} "
        f"(again: {s['ray_later_again']:.2f})"
    )
    print(
        f"  close: Batcher {s['batcher_close']:.2f}, RayBatcher on a running cluster "
        f"{s['ray_close_on_running_cluster']:.2f}, RayBatcher + cluster shutdown "
        f"{s['ray_close']:.2f}"
    )
    th = result["throughput"]
    print(f"throughput, CartPole {N_PROCS} x {N_ENVS} envs, T=64 (median steps/s, min-max)")
    for name in BACKENDS:
        x = th["steps_per_s"][name]
        print(
            f"  {name:8s} {x['median']:10,.0f} ({x['min']:,.0f}-{x['max']:,.0f})   "
            f"{th['seconds_per_batch'][name] * 1000:6.1f} ms/batch"
        )
    paired = th["paired_ratios"]
    print(
        f"  ratio RayBatcher / Batcher: {th['ratio_ray_to_batcher']:.2f} "
        f"(paired {min(paired):.2f}-{max(paired):.2f})"
    )
    up = result["update"]
    print(f"update of a {up['n_params'] / 1e6:.1f}M-parameter state_dict (median s)")
    for name in BACKENDS:
        print(
            f"  {name:8s} call {up[name]['call_s']['median']:.3f}   "
            f"load by the workers (extra on the next batch) {up[name]['load_s']['median']:.3f}"
        )
    print(
        f"  ratio RayBatcher / Batcher: call "
        f"{up['ray']['call_s']['median'] / up['batcher']['call_s']['median']:.1f}, "
        f"call + load {_total(up, 'ray') / _total(up, 'batcher'):.1f}"
    )
    print("restart (extra seconds of a get() with a restart, median)")
    for key, x in result["restart"].items():
        print(f"  {key:15s} {x['restart_s']['median']:.2f} ({x['restart_s']['n']} restarts)")
    rs = result["restart"]
    for fault in sorted({key.split("_")[1] for key in rs}):
        ratio = (
            rs[f"ray_{fault}"]["restart_s"]["median"]
            / rs[f"batcher_{fault}"]["restart_s"]["median"]
        )
        print(f"  ratio RayBatcher / Batcher ({fault}): {ratio:.1f}")


def _total(up: dict[str, Any], name: str) -> float:
    return up[name]["call_s"]["median"] + up[name]["load_s"]["median"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes")
    parser.add_argument("--reps", type=int, default=None, help="throughput repetitions")
    parser.add_argument("--min-time", type=float, default=None, help="seconds per repetition")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    _common.pin_threads(1)
    result = run(args.quick, args.reps, args.min_time)
    print_result(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
