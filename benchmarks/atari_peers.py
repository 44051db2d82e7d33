"""DQN and A2C on Pong against stable-baselines3's, with the same settings, in one run.

Workload: ``PongNoFrameskip-v4``, the Nature CNN on 4 stacked 84x84 frames.

- **DQN**: ``rlstruct train dqn --preset atari`` (CleanRL's settings: batches of 32, one
  gradient step per 4 frames, lr 1e-4, a hard target copy every 1,000 frames) against SB3's
  ``DQN("CnnPolicy")`` with the same settings over the same 8 envs (``train_freq=1`` vector
  step, ``gradient_steps=2``: one gradient step per 4 frames). For a measure of minutes both
  take a buffer of ``--buffer-size`` (50k) and learn from ``--learning-starts`` (10k) frames:
  the preset's 1M and 80k would spend the window filling it. Frames/s are counted after
  learning starts, where the learner sets the pace.
- **A2C**: ``rlstruct train a2c --preset atari`` (rl-zoo's settings: 16 envs, 5 steps, RMSprop
  like TensorFlow's, eps 1e-5) against SB3's ``A2C("CnnPolicy")`` with rl-zoo's settings
  (``RMSpropTFLike``, ``ent_coef=0.01``, ``vf_coef=0.25``) over 16 envs.

SB3 runs as its users run it: ``make_atari_env`` (``DummyVecEnv``, ``AtariWrapper``) and
``VecFrameStack(4)``, torch's default threads. Each side runs ``--seconds`` in a fresh process;
cores busy is the process tree's CPU time over the measured window. The table gives each
side's frames/s, cores busy and the ratio, from one run; ``--reps N`` runs each side N times,
alternated, and gives the medians (this machine's speed drifts by a fifth within minutes, and a
single pair of runs with it); ``--quick`` is a smoke run of a few iterations (figures
meaningless), for the test suite.

``--rlstruct-flags="--n-threads 1"`` passes more flags to rlstruct's side (a variant measured
against the preset: DQN with collection after learning, ``--no-overlap`` in a trial, made 144
frames/s against the preset's 153 in one quiet run, and was left out); ``--no-peer`` skips SB3.

Run: ``python benchmarks/atari_peers.py [--algos dqn a2c] [--seconds 120] [--reps 3]
[--json out.json]``
"""

from __future__ import annotations

import argparse
import csv
import json
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
ENV_ID = "PongNoFrameskip-v4"


def rlstruct_cmd(algo: str, tmp: str, seconds: float, buffer_size: int,
                 learning_starts: int, max_frames: int | None = None,
                 extra: tuple[str, ...] = ()) -> list[str]:
    """The ``rlstruct train`` line of one side (the preset, with the measure's overrides); with
    ``max_frames`` (the smoke run) the run stops there, whatever its start-up took."""
    cmd = [str(Path(sys.executable).with_name("rlstruct")), "train", algo, "--preset", "atari",
           "--time-budget", str(seconds), "--runs-dir", tmp, *extra]
    if max_frames is not None:  # the smoke run: a row every iteration
        cmd += ["--max-frames", str(max_frames), "--progress-every-s", "0"]
    if not Path(cmd[0]).exists():
        cmd[:1] = [sys.executable, "-m", "rlstruct"]
    if algo == "dqn":
        cmd += ["--buffer-size", str(buffer_size), "--learning-starts", str(learning_starts)]
    return cmd


def run_rlstruct(algo: str, seconds: float, buffer_size: int, learning_starts: int,
                 max_frames: int | None = None, extra: tuple[str, ...] = ()) -> dict[str, float]:
    """One rlstruct run: frames/s and cores busy over its progress rows after learning starts
    (and after its first row, the start-up)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = rlstruct_cmd(algo, tmp, seconds, buffer_size, learning_starts, max_frames, extra)
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 300, cwd=tmp)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
        rows = list(csv.DictReader(next(Path(tmp).glob("*/progress.csv")).open()))
    start = learning_starts if algo == "dqn" else 0
    rows = [r for r in rows[1:] if float(r["frames"]) > start]
    if len(rows) < 2:
        raise RuntimeError(f"{algo}: under two progress rows after learning started in "
                           f"{seconds} s: raise --seconds")
    a, b = rows[0], rows[-1]
    wall = float(b["wall_time"]) - float(a["wall_time"])
    busy = [float(r["cores_busy"]) for r in rows[1:] if r.get("cores_busy")]
    return {"frames_per_s": (float(b["frames"]) - float(a["frames"])) / wall,
            "cores_busy": sum(busy) / len(busy) if busy else float("nan"), "rows": len(rows)}


def _sb3_model(algo: str, env: Any, buffer_size: int, learning_starts: int) -> Any:
    """SB3's DQN or A2C with the preset's settings."""
    if algo == "dqn":
        from stable_baselines3 import DQN

        return DQN("CnnPolicy", env, learning_rate=1e-4, buffer_size=buffer_size,
                   learning_starts=learning_starts, batch_size=32, tau=1.0, gamma=0.99,
                   train_freq=1, gradient_steps=2, target_update_interval=1000,
                   exploration_fraction=0.1, exploration_final_eps=0.01, max_grad_norm=10,
                   optimize_memory_usage=False, seed=0, verbose=0, device="cpu")
    from stable_baselines3 import A2C
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

    return A2C("CnnPolicy", env, learning_rate=7e-4, n_steps=5, gamma=0.99, gae_lambda=1.0,
               ent_coef=0.01, vf_coef=0.25, max_grad_norm=0.5, seed=0, verbose=0, device="cpu",
               policy_kwargs={"optimizer_class": RMSpropTFLike,
                              "optimizer_kwargs": {"eps": 1e-5}})


def run_sb3(algo: str, seconds: float, buffer_size: int,
            learning_starts: int) -> dict[str, float] | None:
    """SB3's side for about ``seconds`` after learning starts; None when it is not installed."""
    try:
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import VecFrameStack
    except ImportError:
        return None
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    n_envs = 8 if algo == "dqn" else 16
    start = learning_starts if algo == "dqn" else 0
    meter, marks = TreeMeter(), []

    class Clock(BaseCallback):
        def _on_step(self) -> bool:
            n = self.model.num_timesteps
            if n >= start and not marks:
                marks.append((time.perf_counter(), n))
                meter.start()
            return not marks or time.perf_counter() - marks[0][0] < seconds

    env = VecFrameStack(make_atari_env(ENV_ID, n_envs=n_envs, seed=0), n_stack=4)
    model = _sb3_model(algo, env, buffer_size, learning_starts)
    model.learn(total_timesteps=10**9, callback=Clock())
    t1, n1 = time.perf_counter(), model.num_timesteps
    window = meter.stop()
    env.close()
    return {"frames_per_s": (n1 - marks[0][1]) / (t1 - marks[0][0]), "cores_busy": window.cores}


def _sb3_subprocess(algo: str, seconds: float, buffer_size: int,
                    learning_starts: int) -> dict[str, float] | None:
    """:func:`run_sb3` in a fresh process (its own threads and memory, like rlstruct's)."""
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
            f"import atari_peers as b; print(json.dumps(b.run_sb3({algo!r}, {seconds}, "
            f"{buffer_size}, {learning_starts})))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=seconds + 600)
    if res.returncode != 0:
        raise RuntimeError(f"SB3 {algo} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--algos", nargs="+", default=["dqn", "a2c"], choices=["dqn", "a2c"])
    p.add_argument("--seconds", type=float, default=120.0, help="each side, after learning starts")
    p.add_argument("--buffer-size", type=int, default=50_000, help="DQN's, both sides")
    p.add_argument("--learning-starts", type=int, default=10_000, help="DQN's, both sides")
    p.add_argument("--reps", type=int, default=1,
                   help="runs of each side, alternated (the table gives the medians)")
    p.add_argument("--quick", action="store_true", help="a smoke run (seconds, not figures)")
    p.add_argument("--rlstruct-flags", default="", help="more flags for rlstruct's side")
    p.add_argument("--no-peer", action="store_true", help="rlstruct's side only")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    if args.reps < 1:
        p.error(f"--reps must be at least 1, got {args.reps}")
    # The smoke run: three iterations after learning starts (DQN's 8 envs x 32 steps a row;
    # A2C's 16 x 5), however long a loaded machine's start-up takes; SB3 10 s.
    max_frames = None
    if args.quick:
        args.seconds, args.buffer_size, args.learning_starts = 10.0, 5_000, 256
        max_frames = args.learning_starts + 3 * 256
    print(f"load average before: {os.getloadavg()}", flush=True)
    rows: dict[str, dict[str, Any]] = {}
    reps = 1 if args.quick else args.reps
    for algo in args.algos:
        extra = tuple(shlex.split(args.rlstruct_flags))
        mine_runs, peer_runs = [], []
        for _ in range(reps):  # the sides alternate: the machine's drift reaches both alike
            mine_runs.append(run_rlstruct(algo, 600.0 if args.quick else args.seconds,
                                          args.buffer_size, args.learning_starts, max_frames,
                                          extra))
            print(f"rlstruct {algo}: {json.dumps(mine_runs[-1])} "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
            peer = None if args.no_peer else _sb3_subprocess(algo, args.seconds,
                                                              args.buffer_size,
                                                              args.learning_starts)
            none = ("stable-baselines3: not run" if args.no_peer
                    else "stable-baselines3: not installed")
            print(f"sb3 {algo}: {json.dumps(peer) if peer else none} "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
            peer_runs += [peer] if peer else []
        mine, peer = median_row(mine_runs), median_row(peer_runs) if peer_runs else None
        ratio = mine["frames_per_s"] / peer["frames_per_s"] if peer else None
        rows[algo] = {"rlstruct": mine, "sb3": peer, "ratio": ratio}
    print(f"\n{ENV_ID}, {args.seconds:.0f} s a side, medians of {reps} run(s) a side; "
          f"load average now {os.getloadavg()}")
    print(f"{'algo':6} {'rlstruct f/s':>13} {'cores':>6} {'SB3 f/s':>9} {'cores':>6} {'x SB3':>6}")
    for algo, r in rows.items():
        peer = r["sb3"] or {}
        print(f"{algo:6} {r['rlstruct']['frames_per_s']:13.1f} {r['rlstruct']['cores_busy']:6.2f}"
              f" {peer.get('frames_per_s', float('nan')):9.1f}"
              f" {peer.get('cores_busy', float('nan')):6.2f}"
              f" {r['ratio'] if r['ratio'] is not None else float('nan'):6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "env": environment(),
                                               "seconds": args.seconds}, indent=1))


if __name__ == "__main__":
    main()
