"""SAC on Hopper-v5 against stable-baselines3's SAC, with the same settings, in one run.

Workload: ``sac --preset mujoco`` on ``Hopper-v5`` (rl-zoo's settings: 256-wide ReLU nets, lr
3e-4, batches of 256, tau 0.005, gamma 0.99, one gradient step per frame from one env, learning
from 10k frames, a 1M buffer) against SB3's ``SAC("MlpPolicy")`` with the same settings
(``net_arch=[256, 256]``, ``train_freq=1``, ``gradient_steps=1``, ``ent_coef="auto"``), as its
users run it: torch's default threads, one env. Each side runs in a fresh process, one after
the other; frames/s are counted after learning starts, where the update sets the pace, and
cores busy is the process tree's CPU time over that window.

The compute limit: the update's matrix products (every ``mm``, ``bmm`` and ``addmm`` of one
gradient step at the preset's shapes, forward and backward) timed alone on the machine's cores,
the way docs/guide-atari.md derives Pong's limit. A frame costs one update (``utd`` 1), so the
limit in frames/s is one over that time; the table gives each side's fraction of it.

The table gives each side's frames/s, cores busy, the ratio and the fraction of the limit, from
one run (``--reps N``: each side N times, alternated, and the medians). ``--quick`` is a smoke
run of a few seconds (figures meaningless), for the test suite; ``--rlstruct-flags`` passes
more flags to rlstruct's side (another layout, say).

Run: ``python benchmarks/sac_peers.py [--seconds 120] [--reps 3] [--json out.json]``
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import TreeMeter, environment, median_row

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "Hopper-v5"
HIDDEN, BATCH, OBS_DIM, ACT_DIM = 256, 256, 11, 3  # the preset's nets and batch, Hopper's sizes


def rlstruct_cmd(tmp: str, seconds: float, learning_starts: int, max_frames: int | None,
                 extra: list[str]) -> list[str]:
    """The ``rlstruct train sac`` line (the preset, the measure's budget and overrides)."""
    cmd = [str(Path(sys.executable).with_name("rlstruct")), "train", "sac", "--preset", "mujoco",
           "--env-id", ENV_ID, "--time-budget", str(seconds), "--runs-dir", tmp,
           "--learning-starts", str(learning_starts), "--checkpoint-every", "1000000", *extra]
    if max_frames is not None:  # the smoke run: a row every iteration
        cmd += ["--max-frames", str(max_frames), "--progress-every-s", "0"]
    if not Path(cmd[0]).exists():
        cmd[:1] = [sys.executable, "-m", "rlstruct"]
    return cmd


def run_rlstruct(seconds: float, learning_starts: int, max_frames: int | None,
                 extra: list[str]) -> dict[str, float]:
    """One rlstruct run: frames/s and cores busy over its progress rows after learning starts."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = rlstruct_cmd(tmp, seconds, learning_starts, max_frames, extra)
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 300, cwd=tmp)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
        rows = list(csv.DictReader(next(Path(tmp).glob("*/progress.csv")).open()))
    rows = [r for r in rows if float(r["frames"]) > learning_starts]
    if len(rows) < 2:
        raise RuntimeError(f"under two progress rows after learning started in {seconds} s: "
                           "raise --seconds")
    a, b = rows[0], rows[-1]
    wall = float(b["wall_time"]) - float(a["wall_time"])
    busy = [float(r["cores_busy"]) for r in rows[1:] if r.get("cores_busy")]
    return {"frames_per_s": (float(b["frames"]) - float(a["frames"])) / wall,
            "cores_busy": sum(busy) / len(busy) if busy else float("nan"), "rows": len(rows),
            "updates": max((float(r["updates"]) for r in rows  # the end row's: nan
                            if r.get("updates") and math.isfinite(float(r["updates"]))),
                           default=float("nan"))}


def run_sb3(seconds: float, learning_starts: int) -> dict[str, float] | None:
    """SB3's SAC for about ``seconds`` after learning starts; None when it is not installed."""
    try:
        from stable_baselines3 import SAC
        from stable_baselines3.common.callbacks import BaseCallback
    except ImportError:
        return None
    import gymnasium as gym

    meter, marks = TreeMeter(), []

    class Clock(BaseCallback):
        def _on_step(self) -> bool:
            if self.model.num_timesteps >= learning_starts and not marks:
                marks.append((time.perf_counter(), self.model.num_timesteps))
                meter.start()
            return not marks or time.perf_counter() - marks[0][0] < seconds

    env = gym.make(ENV_ID)
    model = SAC("MlpPolicy", env, learning_rate=3e-4, buffer_size=1_000_000,
                learning_starts=learning_starts, batch_size=BATCH, tau=0.005, gamma=0.99,
                train_freq=1, gradient_steps=1, ent_coef="auto",
                policy_kwargs={"net_arch": [HIDDEN, HIDDEN]}, seed=0, verbose=0, device="cpu")
    model.learn(total_timesteps=10**9, callback=Clock())
    t1, n1 = time.perf_counter(), model.num_timesteps
    window = meter.stop()
    env.close()
    return {"frames_per_s": (n1 - marks[0][1]) / (t1 - marks[0][0]), "cores_busy": window.cores}


def _sb3_subprocess(seconds: float, learning_starts: int) -> dict[str, float] | None:
    """:func:`run_sb3` in a fresh process (its own threads and memory, like rlstruct's)."""
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
            f"import sac_peers as b; print(json.dumps(b.run_sb3({seconds}, {learning_starts})))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=seconds + 600)
    if res.returncode != 0:
        raise RuntimeError(f"SB3 SAC failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def update_matmuls(reps: int) -> dict[str, float]:
    """The update's matrix products timed alone (ms, the median of ``reps`` rounds of 50).

    One SAC update at the preset's shapes: the actor forward on ``s`` and ``s'`` (``2B`` rows)
    and its backward; the twin critics at ``(s, a)`` and ``(s, a~)`` and the target critics at
    ``(s', a')`` (``B`` rows each, two critics as one batched product), and the backward of the
    two online ones (weights and inputs). Backward products are two per layer (the gradient of
    the weight and of the input); the first layer's input gradient is needed where an action
    carries the actor's gradient, and counted everywhere (an upper bound on the work).
    """
    import statistics

    import torch

    threads = torch.get_num_threads()
    layers = [(OBS_DIM + ACT_DIM, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 1)]
    actor = [(OBS_DIM, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 2 * ACT_DIM)]
    ops: list[Any] = []
    for n_in, n_out in actor:  # forward, grad of the weight, grad of the input
        x, w, g = torch.randn(2 * BATCH, n_in), torch.randn(n_in, n_out), torch.randn(2 * BATCH,
                                                                                        n_out)
        ops += [(torch.mm, x, w), (torch.mm, x.t(), g), (torch.mm, g, w.t())]
    for n_in, n_out in layers:  # 3 forward passes of both critics, 2 backward
        x, w, g = torch.randn(2, BATCH, n_in), torch.randn(2, n_in, n_out), torch.randn(2, BATCH,
                                                                                         n_out)
        ops += [(torch.bmm, x, w)] * 3 + [(torch.bmm, x.transpose(1, 2), g),
                                         (torch.bmm, g, w.transpose(1, 2))] * 2
    times = []
    for _ in range(reps + 1):  # the first round warms up
        t = time.perf_counter()
        for _ in range(50):
            for op, a, b in ops:
                op(a, b)
        times.append((time.perf_counter() - t) / 50 * 1e3)
    ms = statistics.median(times[1:])
    return {"matmul_ms": ms, "limit_frames_per_s": 1e3 / ms, "threads": threads}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=120.0, help="each side, after learning starts")
    p.add_argument("--learning-starts", type=int, default=10_000, help="both sides")
    p.add_argument("--rlstruct-flags", default="", help="more flags for rlstruct's side")
    p.add_argument("--no-peer", action="store_true", help="rlstruct's side and the limit only")
    p.add_argument("--reps", type=int, default=1,
                   help="runs of each side, alternated (the table gives the medians)")
    p.add_argument("--quick", action="store_true", help="a smoke run (seconds, not figures)")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    if args.reps < 1:
        p.error(f"--reps must be at least 1, got {args.reps}")
    max_frames, extra = None, shlex.split(args.rlstruct_flags)
    if args.quick:  # 150 rows after learning starts, on one thread: a loaded machine (the test
        args.seconds, args.learning_starts = 5.0, 300  # suite's) stalls threads that wait
        max_frames, extra = args.learning_starts + 150, [*extra, "--n-threads", "1"]
        import torch  # for each other

        torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()}", flush=True)
    limit = update_matmuls(3 if args.quick else 10)
    print(f"update matmuls alone: {json.dumps(limit)}", flush=True)
    mine_runs, peer_runs = [], []
    for _ in range(1 if args.quick else args.reps):  # alternated: the drift reaches both alike
        mine_runs.append(run_rlstruct(600.0 if args.quick else args.seconds + 30,
                                      args.learning_starts, max_frames, extra))
        print(f"rlstruct sac: {json.dumps(mine_runs[-1])} (load {os.getloadavg()[0]:.2f})",
              flush=True)
        peer = None if args.no_peer else _sb3_subprocess(args.seconds, args.learning_starts)
        print(f"sb3 sac: {json.dumps(peer) if peer else 'stable-baselines3: not run'} "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)
        peer_runs += [peer] if peer else []
    mine, peer = median_row(mine_runs), median_row(peer_runs) if peer_runs else None
    rows = {"rlstruct": mine, "sb3": peer}
    for r in filter(None, rows.values()):
        r["of_limit"] = r["frames_per_s"] / limit["limit_frames_per_s"]
    ratio = mine["frames_per_s"] / peer["frames_per_s"] if peer else None
    print(f"\nSAC on {ENV_ID}, {args.seconds:.0f} s a side after {args.learning_starts} frames; "
          f"load average now {os.getloadavg()}")
    print(f"compute limit: {limit['limit_frames_per_s']:.0f} frames/s ({limit['matmul_ms']:.2f} ms "
          f"of matmuls an update on {limit['threads']} threads)")
    print(f"{'side':9} {'frames/s':>9} {'cores':>6} {'x limit':>8}")
    for name, r in rows.items():
        if r:
            print(f"{name:9} {r['frames_per_s']:9.1f} {r['cores_busy']:6.2f} {r['of_limit']:8.2f}")
    print(f"rlstruct / SB3: {ratio:.2f}" if ratio else "rlstruct / SB3: n/a (no peer)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "ratio": ratio, "limit": limit,
                                               "env": environment(), "seconds": args.seconds,
                                               "rlstruct_flags": args.rlstruct_flags}, indent=1))


if __name__ == "__main__":
    main()
