"""envpool and Atari: collection throughput with envpool vs gymnasium envs, and Pong's batch cost.

Part 1, CartPole-v1 (throughput.py's workload: policy MLP 4 -> 64 -> 64 -> 2, tanh, actions
sampled from the softmax, ``throughput.MLPAgent``; one torch thread per process,
``OMP_NUM_THREADS=1``; 64 envs in all; a batch is ``T`` steps, ``execute()`` + ``get()``):

1. ``gym_serial``: ``SerialBatcher`` over ``GymEnvInf(64)`` (throughput.py's row 5);
2. ``gym_batcher``: ``Batcher``, 2 processes x ``GymEnvInf(32)`` (throughput.py's row 6);
3. ``ep_serial``: ``SerialBatcher`` over ``EnvPoolEnv("CartPole-v1", 64, num_threads=1)``;
4. ``ep_batcher``: ``Batcher``, 2 processes x ``EnvPoolEnv("CartPole-v1", 32, num_threads=1)``.

``num_threads=1``: envpool steps its envs in one C++ thread per VecEnv (the process's own
thread waits meanwhile), so every setup uses one core per process; ``--envpool-threads 0``
lets envpool take one thread per core.

Part 2, Pong (2 processes x 16 envs, ``T=128``, a uniform random agent, batches of 4096 steps):

5. ``pong_gym``: ``Batcher`` over ``make_atari_env("ALE/Pong-v5", 16)`` (gymnasium's Atari
   preprocessing, uint8 frames ``(4, 84, 84)``);
6. ``pong_envpool``: ``Batcher`` over ``EnvPoolEnv("Pong-v5", 16, num_threads=1)`` (envpool's
   own preprocessing, with its defaults: no sticky actions, FIRE at reset).

Per batch it reports the wall time of ``execute()`` + ``get()``, the time of the ``get()`` call
that returns the batch (the copy out of the shared buffer: ``get(blocking=False)`` is polled every
2 ms, so the call that returns the batch does the copy and nothing else), and the batch's bytes
(every tensor of the returned ``Trajectories``).

Method: every setup is built and warmed up first (construction and the first batches are
excluded); then the repetitions are interleaved: rep ``r`` runs every setup of a part once, in an
order rotated by ``r``, while the others sit idle. A rep collects whole batches for at least
``--min-time`` seconds (part 1) or ``--pong-batches`` batches (part 2). Per rep: steps, wall time
and CPU seconds of this process and all its children (psutil). The summary prints median
(min-max) steps/s, steps per CPU-second (the column busy neighbours disturb least) and the ratios
of medians with the range of the per-rep paired ratios. No target: the rows are informative.

Usage::

    python benchmarks/envpool_atari.py                 # full run (~3 min on 2 cores)
    python benchmarks/envpool_atari.py --quick         # smoke run (its numbers mean little)
    python benchmarks/envpool_atari.py --json out.json --skip-pong
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import torch
from throughput import MLPAgent

from rlstruct import DictTensor
from rlstruct.agent import Agent
from rlstruct.batchers import Batcher, SerialBatcher
from rlstruct.envs.atari import make_atari_env
from rlstruct.envs.envpool import EnvPoolEnv
from rlstruct.envs.gym import GymEnvInf

N_PROCS = 2

ROWS: dict[str, str] = {
    "gym_serial": "SerialBatcher(GymEnvInf(CartPole, {n}))",
    "gym_batcher": "Batcher({p} x GymEnvInf(CartPole, {h}))",
    "ep_serial": "SerialBatcher(EnvPoolEnv(CartPole, {n}))",
    "ep_batcher": "Batcher({p} x EnvPoolEnv(CartPole, {h}))",
    "pong_gym": "Batcher({p} x make_atari_env(Pong-v5, {ph}))",
    "pong_envpool": "Batcher({p} x EnvPoolEnv(Pong-v5, {ph}))",
}
#: (numerator, denominator): ratios of median steps/s printed for each part
RATIOS: list[tuple[str, str]] = [
    ("ep_serial", "gym_serial"),
    ("ep_batcher", "gym_batcher"),
    ("ep_batcher", "ep_serial"),
    ("gym_batcher", "gym_serial"),
    ("pong_envpool", "pong_gym"),
]


class RandomAtariAgent(Agent):
    """Uniform random actions among ``n_actions`` (Pong's minimal set has 6)."""

    def __init__(self, n_actions: int = 6) -> None:
        self.n_actions = n_actions

    def __call__(self, state, observation, agent_info):
        n = observation["frame"].shape[0]
        return DictTensor({"action": torch.randint(0, self.n_actions, (n,))}), state


# ------------------------------------------------------------------------------ setups
def _batch_bytes(traj: Any) -> int:
    tensors = [*traj.trajectories.values(), traj.trajectories.lengths, *traj.info.values()]
    return sum(t.numel() * t.element_size() for t in tensors)


class Setup:
    """One batcher; ``batch()`` collects one segment and returns its number of steps."""

    def __init__(self, batcher: SerialBatcher | Batcher) -> None:
        self.b = batcher
        self.b.reset()
        self.info: dict[str, Any] = {
            "bytes_per_transition": self.b.buffer.bytes_per_transition()
            if hasattr(self.b, "buffer")
            else self.b.buffers[0].bytes_per_transition()
        }
        self.get_s: list[float] = []
        self.batch_bytes = 0

    def batch(self) -> int:
        self.b.execute()
        if isinstance(self.b, SerialBatcher):
            g0 = time.perf_counter()
            traj, _ = self.b.get()
        else:
            while True:
                g0 = time.perf_counter()
                traj, _ = self.b.get(blocking=False)
                if traj is not None:
                    break
                time.sleep(0.002)
        self.get_s.append(time.perf_counter() - g0)
        self.batch_bytes = _batch_bytes(traj)
        return int(traj.trajectories.lengths.sum())

    def close(self) -> None:
        self.b.close()


def _cartpole(kind: str, cfg: dict) -> Setup:
    n, half, t = cfg["n_envs"], cfg["n_envs"] // N_PROCS, cfg["T"]
    ep = {"env": "CartPole-v1", "num_threads": cfg["envpool_threads"]}
    gym_env = {"env": "CartPole-v1"}
    if kind == "gym_serial":
        b = SerialBatcher(t, MLPAgent, {}, GymEnvInf, {**gym_env, "n_envs": n}, seeds=0)
    elif kind == "ep_serial":
        b = SerialBatcher(t, MLPAgent, {}, EnvPoolEnv, {**ep, "n_envs": n}, seeds=0)
    elif kind == "gym_batcher":
        b = Batcher(t, MLPAgent, {}, GymEnvInf, {**gym_env, "n_envs": half},
                    n_processes=N_PROCS, seeds=0, n_threads=1)
    else:
        b = Batcher(t, MLPAgent, {}, EnvPoolEnv, {**ep, "n_envs": half},
                    n_processes=N_PROCS, seeds=0, n_threads=1)
    return Setup(b)


def _pong(kind: str, cfg: dict) -> Setup:
    n, t = cfg["pong_envs"], cfg["pong_T"]
    if kind == "pong_gym":
        create, args = make_atari_env, {"env": "ALE/Pong-v5", "n_envs": n}
    else:
        create = EnvPoolEnv
        args = {"env": "Pong-v5", "n_envs": n, "num_threads": cfg["envpool_threads"]}
    return Setup(Batcher(t, RandomAtariAgent, {}, create, args, n_processes=N_PROCS, seeds=0,
                         n_threads=1, timeout=600))


SETUPS: dict[str, Callable[[str, dict], Setup]] = {
    "gym_serial": _cartpole,
    "gym_batcher": _cartpole,
    "ep_serial": _cartpole,
    "ep_batcher": _cartpole,
    "pong_gym": _pong,
    "pong_envpool": _pong,
}


# ------------------------------------------------------------------------------ measurement
def _rep(setup: Setup, meter: _common.TreeMeter, min_time: float, min_batches: int) -> dict:
    steps = batches = 0
    first_get = len(setup.get_s)
    meter.start()
    t0 = time.perf_counter()
    while True:
        steps += setup.batch()
        batches += 1
        if time.perf_counter() - t0 >= min_time and batches >= min_batches:
            break
    w = meter.stop()
    gets = setup.get_s[first_get:]
    per_cpu = steps / w.cpu_s if w.cpu_s else None
    return {"steps": steps, "batches": batches, "wall_s": w.wall_s, "cpu_s": w.cpu_s,
            "steps_per_s": steps / w.wall_s, "steps_per_cpu_s": per_cpu,
            "batch_s": w.wall_s / batches, "get_s": statistics.median(gets)}


def _ratio(rows: dict, num: str, den: str, field: str) -> dict | None:
    a, b = rows.get(num, {}).get("reps"), rows.get(den, {}).get("reps")
    if not a or not b:
        return None
    paired = [x[field] / y[field] for x, y in zip(a, b) if x[field] and y[field]]
    med = statistics.median(r[field] for r in a) / statistics.median(r[field] for r in b)
    return {"median_ratio": med, "paired_min": min(paired), "paired_max": max(paired)}


def measure(cfg: dict, keys: list[str], reps: int, min_time: float, min_batches: int) -> dict:
    setups: dict[str, Setup] = {}
    rows: dict[str, dict] = {}
    labels = {"n": cfg["n_envs"], "h": cfg["n_envs"] // N_PROCS, "p": N_PROCS,
              "ph": cfg["pong_envs"]}
    meter = _common.TreeMeter()
    try:
        for key in keys:
            t0 = time.perf_counter()
            setup = SETUPS[key](key, cfg)
            construct = time.perf_counter() - t0
            for _ in range(cfg["warmup_batches"]):
                setup.batch()
            setups[key] = setup
            rows[key] = {"label": ROWS[key].format(**labels), "construct_s": construct,
                         "info": setup.info, "reps": []}
        for r in range(reps):
            order = keys[r % len(keys):] + keys[: r % len(keys)]
            for key in order:
                rows[key]["reps"].append(_rep(setups[key], meter, min_time, min_batches))
    finally:
        for setup in setups.values():
            setup.close()
    for key, row in rows.items():
        for field in ("steps_per_s", "steps_per_cpu_s", "batch_s", "get_s"):
            row[field] = _common.summarize(x[field] for x in row["reps"] if x[field])
        row["batch_bytes"] = setups[key].batch_bytes
    ratios = []
    for num, den in RATIOS:
        wall = _ratio(rows, num, den, "steps_per_s")
        if wall is not None:
            ratios.append({"num": num, "den": den, "wall": wall,
                           "cpu": _ratio(rows, num, den, "steps_per_cpu_s")})
    return {"rows": rows, "ratios": ratios}


# ------------------------------------------------------------------------------ main
def _fmt(s: dict, scale: float = 1.0, spec: str = ",.0f") -> str:
    return (f"{s['median'] * scale:>10{spec}} "
            f"({s['min'] * scale:{spec}}-{s['max'] * scale:{spec}})")


def print_summary(result: dict, pong: bool) -> None:
    print(f"\n{'setup':<44} {'steps/s median (min-max)':>30} {'steps/CPU-s':>12}", end="")
    print(f" {'batch MB':>9} {'get() ms median (min-max)':>28}" if pong else "")
    for row in result["rows"].values():
        line = (f"{row['label']:<44} {_fmt(row['steps_per_s']):>30} "
                f"{row['steps_per_cpu_s']['median']:>12,.0f}")
        if pong:
            line += (f" {row['batch_bytes'] / 1e6:>9.1f} "
                     f"{_fmt(row['get_s'], 1e3, ',.1f'):>28}")
        print(line)
    for r in result["ratios"]:
        w, c = r["wall"], r["cpu"]
        print(f"  {r['num']} / {r['den']}: {w['median_ratio']:.2f}x steps/s (paired "
              f"{w['paired_min']:.2f}-{w['paired_max']:.2f}), {c['median_ratio']:.2f}x steps/CPU-s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: small sizes, short reps")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--min-time", type=float, default=None, help="CartPole: seconds per rep")
    p.add_argument("--pong-batches", type=int, default=None, help="Pong: batches per rep")
    p.add_argument("--envpool-threads", type=int, default=1, help="envpool num_threads (0: auto)")
    p.add_argument("--skip-cartpole", action="store_true")
    p.add_argument("--skip-pong", action="store_true")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    _common.pin_threads(1)
    q = args.quick
    cfg = {
        "n_envs": 8 if q else 64,
        "T": 16 if q else 64,
        "pong_envs": 2 if q else 16,
        "pong_T": 16 if q else 128,
        "envpool_threads": args.envpool_threads,
        "warmup_batches": 1 if q else 2,
    }
    reps = args.reps or (1 if q else 5)
    min_time = args.min_time if args.min_time is not None else (0.05 if q else 2.0)
    pong_batches = args.pong_batches or (1 if q else 3)
    out: dict[str, Any] = {"config": {**cfg, "reps": reps, "min_time": min_time,
                                      "pong_batches": pong_batches},
                           "environment": _common.environment(
                               envpool=_version("envpool"), ale_py=_version("ale_py"))}
    missing = [m for m in ("envpool", "ale_py", "cv2") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"missing {missing}: pip install -e '.[envpool,atari]' in a clone of rlstruct",
              file=sys.stderr)
        return 2
    print(f"{reps} reps; CartPole: T={cfg['T']}, {cfg['n_envs']} envs, >= {min_time} s per rep; "
          f"Pong: T={cfg['pong_T']}, {N_PROCS} x {cfg['pong_envs']} envs, {pong_batches} "
          f"batches per rep; envpool num_threads={cfg['envpool_threads']}")
    if not args.skip_cartpole:
        keys = ["gym_serial", "gym_batcher", "ep_serial", "ep_batcher"]
        out["cartpole"] = measure(cfg, keys, reps, min_time, 1)
        print_summary(out["cartpole"], pong=False)
    if not args.skip_pong:
        out["pong"] = measure(cfg, ["pong_gym", "pong_envpool"], reps, 0.0, pong_batches)
        print_summary(out["pong"], pong=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - any failure to import reads as 'not installed' in the table
        return None


if __name__ == "__main__":
    sys.exit(main())
