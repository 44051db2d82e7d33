"""Torch-native envs: a SerialBatcher over torch CartPole vs gymnasium and vs a hand-written loop.

Workload: throughput.py's policy (MLP 4 -> 64 -> 64 -> 2, tanh, actions sampled from the softmax
with ``torch.multinomial``, under ``torch.no_grad()``), one torch thread, ``OMP_NUM_THREADS=1``.

Rows (all measured in the same run, in this one process):

1. ``gym_sync``: gymnasium ``SyncVectorEnv(64)`` of ``CartPole-v1`` + the MLP (throughput.py's
   row 2, its ``GymSync`` setup: ``T`` vector steps per batch; gymnasium's next-step auto-reset
   calls are not counted as transitions);
2. ``hand``: a hand-written loop, no framework: ``N`` envs as one float32 state tensor stepped by
   the same dynamics (``CartPole.dynamics``), the same MLP; a per-env step counter for the
   500-step limit; auto-reset by ``torch.where`` over fresh ``torch.rand`` initial states; each
   step's observation, action, reward, ``terminated``, ``truncated`` and next observation
   written into preallocated time-major tensors ``(T, N, ...)``. A batch is ``T`` steps (its
   tensors are handed over as they are, no copy);
3. ``rl_serial``: rlstruct ``SerialBatcher(T, MLPAgent, CartPole(n_envs=N, auto_reset=True))``:
   a batch is ``execute()`` + ``get()`` (the full key schema: 8 observation keys, the action,
   8 ``_observation`` keys, and a copy of the batch for the learner);
4. ``rl_env``: the ``CartPole`` VecEnv + the MLP in a plain loop, nothing stored (diagnostic:
   the env's own cost, without the batcher).

Method: each setup is built and warmed up (construction and the first batches are excluded);
then the repetitions are interleaved: rep ``r`` runs every setup once, in an order rotated by
``r``; a rep collects whole batches for at least ``--min-time`` seconds. Per rep: env
transitions, wall time and this process's CPU time. The summary prints median (min-max)
steps/s and steps per CPU-second (the column busy neighbours disturb least: everything here is
single-threaded), and the ratios of medians against the targets, with the range of the per-rep
paired ratios.

Targets (issue 13): ``rl_serial`` >= 10x ``gym_sync`` and >= 0.8x ``hand``.

``--profile`` then breaks a ``rl_serial`` step down, timed inside the collection loop (the agent
call, ``env.step``, the buffer write, the rest of ``execute()``, and ``get()``'s copy per step)
and prints cProfile's top functions over a few batches.
``--device cuda --n-envs 65536`` measures the torch rows on a GPU (``gym_sync`` stays on the
CPU).

Usage::

    python benchmarks/torch_envs.py                   # full run (~1 min on 2 cores)
    python benchmarks/torch_envs.py --quick           # smoke run (a few seconds)
    python benchmarks/torch_envs.py --profile --json out.json
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import torch
from throughput import GymSync, MLPAgent, make_mlp, sample_actions

from rlstruct import DictTensor
from rlstruct.batchers import SerialBatcher
from rlstruct.envs.torch import CartPole

N_ENVS = 4096
MAX_STEPS = 500  # CartPole-v1's time limit

#: (numerator, denominator, minimum ratio of median steps/s)
TARGETS: list[tuple[str, str, float]] = [
    ("rl_serial", "gym_sync", 10.0),
    ("rl_serial", "hand", 0.8),
]

ROWS: dict[str, str] = {
    "gym_sync": "gymnasium SyncVectorEnv(64) + MLP",
    "hand": "hand-written loop, torch CartPole dynamics, {n} envs",
    "rl_serial": "rlstruct SerialBatcher(CartPole({n}, auto_reset))",
    "rl_env": "CartPole({n}) VecEnv + MLP, nothing stored (diag.)",
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------ setups
class HandLoop:
    """Row 2: the same dynamics and MLP in a loop written by hand (see the module doc)."""

    def __init__(self, cfg: dict) -> None:
        dev = self.device = torch.device(cfg["device"])
        n, t = cfg["n_envs"], cfg["T"]
        self.n, self.T = n, t
        self.env = CartPole(n_envs=n, seed=0, device=dev)  # only its dynamics are used
        self.model = make_mlp().to(dev)
        self.state = (torch.rand(n, 4, device=dev) * 0.1 - 0.05).float()
        self.steps = torch.zeros(n, dtype=torch.long, device=dev)
        self.obs = torch.zeros(t, n, 4, device=dev)
        self.action = torch.zeros(t, n, dtype=torch.long, device=dev)
        self.reward = torch.zeros(t, n, device=dev)
        self.terminated = torch.zeros(t, n, dtype=torch.bool, device=dev)
        self.truncated = torch.zeros(t, n, dtype=torch.bool, device=dev)
        self.next_obs = torch.zeros(t, n, 4, device=dev)

    def batch(self) -> int:
        state, steps, model, n = self.state, self.steps, self.model, self.n
        dynamics = self.env.dynamics
        with torch.no_grad():
            for t in range(self.T):
                action = sample_actions(model(state))
                nxt, reward, terminated = dynamics(state, action)
                steps = steps + 1
                truncated = steps >= MAX_STEPS
                done = terminated | truncated
                self.obs[t] = state
                self.action[t] = action
                self.reward[t] = reward
                self.terminated[t] = terminated
                self.truncated[t] = truncated
                self.next_obs[t] = nxt
                fresh = torch.rand(n, 4, device=self.device) * 0.1 - 0.05
                state = torch.where(done[:, None], fresh, nxt)
                steps = steps.masked_fill(done, 0)
        self.state, self.steps = state, steps
        _sync(self.device)
        return n * self.T

    def close(self) -> None:
        pass


class RLSerial:
    """Row 3: ``SerialBatcher`` over ``CartPole(N, auto_reset=True)`` on ``device``."""

    def __init__(self, cfg: dict) -> None:
        dev = cfg["device"]
        self.b = SerialBatcher(
            cfg["T"], MLPAgent, {}, CartPole,
            {"n_envs": cfg["n_envs"], "auto_reset": True, "device": dev}, seeds=0, device=dev,
        )
        self.b.reset()
        self.info = {"env_wrapped": type(self.b.env).__name__,
                     "bytes_per_transition": self.b.buffer.bytes_per_transition()}

    def batch(self) -> int:
        self.b.execute()
        traj, _ = self.b.get()
        return int(traj.trajectories.lengths.sum())

    def close(self) -> None:
        self.b.close()


class RLEnv:
    """Row 4 (diagnostic): the CartPole VecEnv and the MLP, nothing stored."""

    def __init__(self, cfg: dict) -> None:
        self.device = torch.device(cfg["device"])
        self.env = CartPole(n_envs=cfg["n_envs"], seed=0, auto_reset=True, device=self.device)
        self.agent = MLPAgent()
        self.agent.model.to(self.device)
        self.obs, _ = self.env.reset()
        self.T, self.n = cfg["T"], cfg["n_envs"]
        self.empty = DictTensor(batch_size=self.n, device=self.device)

    def batch(self) -> int:
        obs, env, agent, empty = self.obs, self.env, self.agent, self.empty
        with torch.no_grad():
            for _ in range(self.T):
                action, _ = agent(empty, obs, DictTensor())
                _, (obs, _) = env.step(action)
        self.obs = obs
        _sync(self.device)
        return self.n * self.T

    def close(self) -> None:
        self.env.close()


class GymSyncRow(GymSync):
    """Row 1: throughput.py's ``GymSync`` (its ``T`` is the vector steps per batch)."""


SETUPS: dict[str, Callable[[dict], Any]] = {
    "gym_sync": GymSyncRow,
    "hand": HandLoop,
    "rl_serial": RLSerial,
    "rl_env": RLEnv,
}


# ------------------------------------------------------------------------------ measurement
def _rep(setup: Any, min_time: float) -> dict:
    steps = batches = 0
    c0, t0 = time.process_time(), time.perf_counter()
    while True:
        steps += setup.batch()
        batches += 1
        if time.perf_counter() - t0 >= min_time:
            break
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"steps": steps, "batches": batches, "wall_s": wall, "cpu_s": cpu,
            "steps_per_s": steps / wall, "steps_per_cpu_s": steps / cpu if cpu > 0 else None}


def _ratio(rows: dict, num: str, den: str, field: str) -> dict | None:
    a, b = rows.get(num, {}).get("reps"), rows.get(den, {}).get("reps")
    if not a or not b:
        return None
    paired = [x[field] / y[field] for x, y in zip(a, b) if x[field] and y[field]]
    med = statistics.median(r[field] for r in a) / statistics.median(r[field] for r in b)
    return {"median_ratio": med, "paired_min": min(paired), "paired_max": max(paired)}


def measure(cfg: dict, reps: int, min_time: float, keys: list[str]) -> dict:
    setups: dict[str, Any] = {}
    rows: dict[str, dict] = {}
    for key in keys:
        t0 = time.perf_counter()
        setup = SETUPS[key](cfg)
        construct = time.perf_counter() - t0
        for _ in range(cfg["warmup_batches"]):
            setup.batch()
        setups[key] = setup
        rows[key] = {"label": ROWS[key].format(n=cfg["n_envs"]), "construct_s": construct,
                     "info": getattr(setup, "info", {}), "reps": []}
    for r in range(reps):
        order = keys[r % len(keys):] + keys[: r % len(keys)]
        for key in order:
            rows[key]["reps"].append(_rep(setups[key], min_time))
    for setup in setups.values():
        setup.close()
    for row in rows.values():
        for field in ("steps_per_s", "steps_per_cpu_s"):
            row[field] = _common.summarize(x[field] for x in row["reps"] if x[field])
    ratios = []
    for num, den, target in TARGETS:
        wall = _ratio(rows, num, den, "steps_per_s")
        cpu = _ratio(rows, num, den, "steps_per_cpu_s")
        if wall is None:
            continue
        ratios.append({"num": num, "den": den, "target": target, "wall": wall, "cpu": cpu,
                       "met": wall["median_ratio"] >= target})
    return {"rows": rows, "ratios": ratios}


# ------------------------------------------------------------------------------ profile
class _Timed:
    """Calls ``fn`` and adds its wall time to ``acc[key]`` (synchronising a GPU first)."""

    def __init__(self, fn: Callable[..., Any], acc: dict[str, float], key: str,
                 device: torch.device) -> None:
        self.fn, self.acc, self.key, self.device = fn, acc, key, device

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        _sync(self.device)
        self.acc[self.key] += time.perf_counter() - t0
        return out


def profile(cfg: dict, n_batches: int) -> dict:
    """Where a SerialBatcher step goes, timed inside the collection loop: the agent call,
    ``env.step``, the buffer write, ``execute()``'s remainder, and ``get()`` per step; then
    cProfile's top functions over ``n_batches`` batches."""
    dev = torch.device(cfg["device"])
    setup = RLSerial(cfg)
    b = setup.b
    for _ in range(2):
        setup.batch()
    acc = dict.fromkeys(("agent_call", "env_step", "buffer_write_steps"), 0.0)
    rollout = b._rollout  # diagnostic only: time the loop's parts where they run
    rollout.agent = _Timed(rollout.agent, acc, "agent_call", dev)  # type: ignore[assignment]
    b.env.step = _Timed(b.env.step, acc, "env_step", dev)  # type: ignore[method-assign]
    b.buffer.write_steps = _Timed(  # type: ignore[method-assign]
        b.buffer.write_steps, acc, "buffer_write_steps", dev
    )
    execute = get = 0.0
    for _ in range(n_batches):
        t0 = time.perf_counter()
        b.execute()
        _sync(dev)
        t1 = time.perf_counter()
        b.get()
        _sync(dev)
        execute += t1 - t0
        get += time.perf_counter() - t1
    n_steps = n_batches * cfg["T"]
    parts = {k: v / n_steps * 1e6 for k, v in acc.items()}
    parts["rest_of_execute"] = execute / n_steps * 1e6 - sum(parts.values())
    parts["get_copy"] = get / n_steps * 1e6
    parts["total"] = (execute + get) / n_steps * 1e6
    setup.close()
    # cProfile, for the record (a fresh batcher: nothing wrapped)
    setup = RLSerial(cfg)
    setup.batch()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n_batches):
        setup.batch()
    prof.disable()
    setup.close()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
    return {"per_step_us": parts, "cprofile_top": text.getvalue()}


# ------------------------------------------------------------------------------ main
def _fmt(s: dict) -> str:
    return f"{s['median']:>12,.0f} ({s['min']:,.0f}-{s['max']:,.0f})"


def print_summary(result: dict) -> None:
    print(f"\n{'setup':<56} {'steps/s median (min-max)':>36}  {'steps/CPU-s median':>18}")
    for row in result["rows"].values():
        print(f"{row['label']:<56} {_fmt(row['steps_per_s']):>36}  "
              f"{row['steps_per_cpu_s']['median']:>18,.0f}")
    print()
    for r in result["ratios"]:
        w, c = r["wall"], r["cpu"]
        print(f"{r['num']} / {r['den']}: {w['median_ratio']:.2f}x wall (paired "
              f"{w['paired_min']:.2f}-{w['paired_max']:.2f}), {c['median_ratio']:.2f}x CPU; "
              f"target >= {r['target']}x: {'MET' if r['met'] else 'NOT MET'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, short reps")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--min-time", type=float, default=None, help="seconds per setup per rep")
    p.add_argument("-T", "--n-timesteps", type=int, default=None)
    p.add_argument("--n-envs", type=int, default=None, help=f"torch envs (default {N_ENVS})")
    p.add_argument("--device", default="cpu", help="device of the torch rows")
    p.add_argument("--profile", action="store_true", help="break a rl_serial step down")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    _common.pin_threads(1)
    cfg = {
        "T": args.n_timesteps or (16 if args.quick else 64),
        "n_envs": args.n_envs or (256 if args.quick else N_ENVS),
        "device": args.device,
        "warmup_batches": 1 if args.quick else 2,
    }
    reps = args.reps or (2 if args.quick else 5)
    min_time = args.min_time if args.min_time is not None else (0.05 if args.quick else 2.0)
    print(f"T={cfg['T']}, torch envs={cfg['n_envs']} on {cfg['device']}, {reps} reps of "
          f">= {min_time} s per setup, torch threads={torch.get_num_threads()}")
    result = measure(cfg, reps, min_time, list(SETUPS))
    print_summary(result)
    out: dict[str, Any] = {"config": {**cfg, "reps": reps, "min_time": min_time},
                           "environment": _common.environment(), **result}
    if args.profile:
        prof = profile(cfg, 2 if args.quick else 5)
        print("\nrl_serial, per step (us), timed inside the loop:")
        for name, us in prof["per_step_us"].items():
            print(f"  {name:<22} {us:>9.1f}")
        print("\ncProfile, top functions by own time:\n" + prof["cprofile_top"])
        out["profile"] = prof
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
