"""PPO on Pong at full speed: rlstruct's ``--preset atari`` against stable-baselines3, the compute
limit of this machine, and what each lever of the preset brings, in one run.

Workload: PPO on ``ALE/Pong-v5`` with the Nature CNN and rl-zoo's Atari hyperparameters (8
envs, T=128, 4 epochs of minibatches of 256, lr 2.5e-4, clip 0.1, entropy 0.01, value 0.5).

1. **The compute limit**, each part timed alone in this process:
   - the env step (``make_atari_env``, 8 envs, random actions, one thread);
   - the CNN's inference on a batch of 8 (what a worker does per step, float32);
   - its training step on a minibatch of 256 (forward, backward, Adam), in float32 and under
     bfloat16 autocast, each also with channels_last weights and frames (a lever left out).

   ``limit = cores / (env + inference + epochs * training)`` agent steps per second.
2. **rlstruct**: ``rlstruct train ppo --preset atari`` for ``--seconds`` (a subprocess each), and
   variants that take one lever out (``--precision fp32``, ``--n-threads 1``) or add the one the
   preset leaves out (``--pipeline 2``: learning while the workers collect). Each setup's ratio
   to the limit is to the limit of the precision it trains in.
   Steps/s come from progress.csv after ``--warmup`` iterations; cores busy is the run's own
   process-tree figure (its median over the same rows).
3. **stable-baselines3** ``PPO("CnnPolicy")`` with the same hyperparameters, run as its users run
   it: ``make_atari_env`` (a ``DummyVecEnv`` of 8, ``AtariWrapper``) and ``VecFrameStack(4)`` on
   ``ALE/Pong-v5`` (sticky actions, as rlstruct's), torch's default threads and OpenMP's
   default wait policy (not the passive one rlstruct sets for itself: ``OMP_WAIT_POLICY`` as
   the user left it). Steps/s after the same warm-up, from a callback; cores busy of the
   process.

The sides alternate, ``--reps`` times each; the table gives medians and the ratios to SB3 and to
the limit. Not installed peers print "not installed".

Run: ``python benchmarks/atari.py [--seconds 90] [--reps 2] [--json out.json]``
(``--quick``: a smoke run of a few seconds, for the test suite; ``--limit-only``: the compute
limit alone).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import TreeMeter, environment

ROOT = Path(__file__).resolve().parents[1]
#: OpenMP's wait policy as the user left it, read before this process imports rlstruct (which
#: sets OMP_WAIT_POLICY=PASSIVE unless it is set): SB3 runs with it, as its users run it.
USER_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")
HYPER = dict(n_envs=8, n_steps=128, n_epochs=4, batch_size=256, lr=2.5e-4, clip=0.1, ent=0.01,
             vf=0.5, gamma=0.99, gae_lambda=0.95, max_grad_norm=0.5)
VARIANTS = {
    "rlstruct --preset atari": [],
    "  lever out: --precision fp32": ["--precision", "fp32"],
    "  lever out: --n-threads 1": ["--n-threads", "1"],
    "  lever tried: --pipeline 2": ["--pipeline", "2"],
}
#: Setups that train in float32 whatever the CPU: their ratio is to the float32 limit; the
#: others' to the limit of the preset's precision (bf16 where the CPU computes it natively).
FP32 = ("  lever out: --precision fp32", "sb3")


def compute_limit(precision: str, reps: int) -> dict[str, float]:
    """ms per agent step of each part, timed alone in this process (one torch thread), and the
    steps/s limit on ``os.cpu_count()`` cores."""
    import numpy as np
    import torch

    from rlstruct import DictTensor
    from rlstruct.blocks.nets import CNNActorCritic
    from rlstruct.devices import learner_autocast
    from rlstruct.envs.atari import make_atari_env

    torch.set_num_threads(1)
    n = HYPER["n_envs"]
    env = make_atari_env("ALE/Pong-v5", n_envs=n, seed=0)
    _obs, _ = env.reset()
    rng = np.random.default_rng(0)
    steps = 64 if reps > 1 else 8
    def act() -> DictTensor:
        return DictTensor({"action": torch.as_tensor(rng.integers(0, 6, n))})

    for _ in range(4):
        env.step(act())
    t = time.process_time()
    for _ in range(steps):
        env.step(act())
    env_ms = (time.process_time() - t) / (steps * n) * 1e3
    env.close()
    model = CNNActorCritic(6)
    frames = torch.randint(0, 255, (256, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        for _ in range(3):
            model(frames[:n])
        t = time.process_time()
        for _ in range(10 * reps):
            model(frames[:n])
        infer_ms = (time.process_time() - t) / (10 * reps * n) * 1e3
    opt = torch.optim.Adam(model.parameters(), lr=2.5e-4, eps=1e-5)

    def train_ms(prec: str, channels_last: bool = False) -> float:
        net = model.to(memory_format=torch.channels_last if channels_last else
                       torch.contiguous_format)
        x = frames.contiguous(memory_format=torch.channels_last) if channels_last else frames

        def step() -> None:
            with learner_autocast("cpu", prec):
                logits, value = net(x)
                loss = logits.logsumexp(-1).mean() + value.square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        step()
        times = []
        for _ in range(max(2, reps)):
            t = time.process_time()
            step()
            times.append(time.process_time() - t)
        return statistics.median(times) / 256 * 1e3

    train = {"fp32": train_ms("fp32"), precision: train_ms(precision)}
    cores = os.cpu_count() or 1
    out = {"env_ms": env_ms, "inference_ms": infer_ms, "cores": cores,  # a lever left out:
           **{f"train_{p}_channels_last_ms": train_ms(p, channels_last=True) for p in train}}
    for prec, ms in train.items():
        out[f"train_{prec}_ms"] = ms
        out[f"limit_{prec}"] = cores * 1e3 / (env_ms + infer_ms + HYPER["n_epochs"] * ms)
    return out


def run_rlstruct(extra: list[str], seconds: float, warmup: int,
                 max_frames: int | None = None) -> dict[str, float]:
    """``rlstruct train ppo --preset atari`` for ``seconds``; steps/s and cores busy after the
    first ``warmup`` iterations (from progress.csv). With ``max_frames`` the run ends there
    instead (``seconds`` is then only its deadline), with a progress row every iteration: a smoke
    run's iterations do not depend on how loaded the machine is."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(Path(sys.executable).with_name("rlstruct")), "train", "ppo", "--preset", "atari",
               "--time-budget", str(seconds), "--runs-dir", tmp, *extra]
        if max_frames is not None:
            cmd += ["--max-frames", str(max_frames), "--progress-every-s", "0"]
        if not Path(cmd[0]).exists():
            cmd[:1] = [sys.executable, "-m", "rlstruct"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 240,
                             cwd=tmp)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
        rows = list(csv.DictReader(next(Path(tmp).glob("*/progress.csv")).open()))
    if len(rows) <= warmup + 1:
        raise RuntimeError(f"only {len(rows)} iterations in {seconds} s: raise --seconds")
    a, b = rows[warmup], rows[-1]
    sps = (float(b["frames"]) - float(a["frames"])) / (float(b["wall_time"])
                                                       - float(a["wall_time"]))
    busy = statistics.median(float(r["cores_busy"]) for r in rows[warmup + 1:])
    learn = statistics.median(float(r["learn_s"]) for r in rows[warmup + 1:])
    return {"steps_per_s": sps, "cores_busy": busy, "learn_s": learn, "iterations": len(rows)}


def run_sb3(seconds: float, warmup: int) -> dict[str, float] | None:
    """SB3's PPO on the same workload for about ``seconds``; None when it is not installed."""
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import VecFrameStack
    except ImportError:
        return None
    import ale_py
    import gymnasium as gym
    import torch

    gym.register_envs(ale_py)
    torch.set_num_threads(os.cpu_count() or 1)  # its users' default: torch's own
    marks: list[tuple[float, int]] = []
    meter = TreeMeter()

    class Clock(BaseCallback):
        def _on_step(self) -> bool:  # past the time, until two iterations after the warm-up
            return time.perf_counter() - start < seconds or len(marks) < warmup + 2

        def _on_rollout_end(self) -> None:
            marks.append((time.perf_counter(), self.model.num_timesteps))
            if len(marks) == warmup + 1:
                meter.start()

    env = VecFrameStack(make_atari_env("ALE/Pong-v5", n_envs=HYPER["n_envs"], seed=0,
                                       env_kwargs={"frameskip": 1}), n_stack=4)
    model = PPO("CnnPolicy", env, n_steps=HYPER["n_steps"], n_epochs=HYPER["n_epochs"],
                batch_size=HYPER["batch_size"], learning_rate=HYPER["lr"],
                clip_range=HYPER["clip"], ent_coef=HYPER["ent"], vf_coef=HYPER["vf"],
                gamma=HYPER["gamma"], gae_lambda=HYPER["gae_lambda"],
                max_grad_norm=HYPER["max_grad_norm"], seed=0, verbose=0, device="cpu")
    start = time.perf_counter()
    model.learn(total_timesteps=10**9, callback=Clock())
    env.close()
    if len(marks) <= warmup + 1:
        raise RuntimeError(f"SB3 ran {len(marks)} iterations in {seconds} s: raise --seconds")
    window = meter.stop()
    (t0, n0), (t1, n1) = marks[warmup], marks[-1]
    return {"steps_per_s": (n1 - n0) / (t1 - t0), "cores_busy": window.cores,
            "iterations": len(marks)}


def _sb3_subprocess(seconds: float, warmup: int) -> dict[str, float] | None:
    """:func:`run_sb3` in a fresh process (its own threads and memory, like the other side)."""
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
            f"import atari; print(json.dumps(atari.run_sb3({seconds}, {warmup})))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update({} if USER_WAIT_POLICY is None else {"OMP_WAIT_POLICY": USER_WAIT_POLICY})
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=seconds + 240, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"SB3 run failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=90.0, help="per measured run")
    p.add_argument("--reps", type=int, default=2, help="runs of each side, alternated")
    p.add_argument("--warmup", type=int, default=3, help="iterations left out of the figures")
    p.add_argument("--variants", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the preset with one lever out at a time")
    p.add_argument("--quick", action="store_true", help="a smoke run (seconds, not figures)")
    p.add_argument("--limit-only", action="store_true",
                   help="only the compute limit (each part timed alone), no training runs")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    # A smoke run: 2 iterations of the preset (2 x 4 envs x 128 steps each) whatever the load,
    # within 200 s; SB3 runs its 30 s (its Clock goes on until it has 2 iterations).
    quick_frames = 2 * 1024 if args.quick else None
    if args.quick:
        args.seconds, args.reps, args.warmup, args.variants = 30.0, 1, 0, False
    print(f"load average before: {os.getloadavg()}", flush=True)
    limit = compute_limit("bf16", args.reps)
    print(json.dumps({k: round(v, 3) for k, v in limit.items()}), flush=True)
    if args.limit_only:
        return
    names = list(VARIANTS) if args.variants else list(VARIANTS)[:1]
    results: dict[str, list[dict[str, float]]] = {name: [] for name in [*names, "sb3"]}
    for rep in range(args.reps):
        for name in [*names, "sb3"]:
            if name == "sb3":
                out = _sb3_subprocess(args.seconds, args.warmup)
                if out is None:
                    results.pop("sb3", None)
                    continue
            else:
                out = run_rlstruct(VARIANTS[name], 200.0 if quick_frames else args.seconds,
                                   args.warmup, quick_frames)
            results[name].append(out)
            figures = json.dumps({k: round(v, 2) for k, v in out.items()})
            print(f"rep {rep} {name.strip()}: {figures} (load {os.getloadavg()[0]:.2f})",
                  flush=True)
    med = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
           for name, runs in results.items() if runs}
    sb3 = med.get("sb3", {}).get("steps_per_s")
    from rlstruct.devices import bf16_native

    native = bf16_native("cpu")  # what the preset's --precision auto trains in
    print(f"\nPPO on ALE/Pong-v5, Nature CNN, {HYPER}; medians of {args.reps} runs of "
          f"{args.seconds:.0f} s, after {args.warmup} iterations; load average now "
          f"{os.getloadavg()}")
    print(f"compute limit on {limit['cores']} cores: {limit['limit_fp32']:.0f} steps/s in fp32, "
          f"{limit['limit_bf16']:.0f} with bf16 training (env {limit['env_ms']:.3f} ms, inference "
          f"{limit['inference_ms']:.3f} ms, training {limit['train_fp32_ms']:.3f} / "
          f"{limit['train_bf16_ms']:.3f} ms a sample)")
    print(f"{'setup':34} {'steps/s':>8} {'cores':>6} {'x SB3':>6} {'x limit':>8}")
    for name, m in med.items():
        ratio = f"{m['steps_per_s'] / sb3:6.2f}" if sb3 else f"{'n/a':>6}"
        label = "stable-baselines3 PPO CnnPolicy" if name == "sb3" else name
        own_limit = limit["limit_fp32" if name in FP32 or not native else "limit_bf16"]
        print(f"{label:34} {m['steps_per_s']:8.0f} {m['cores_busy']:6.2f} {ratio} "
              f"{m['steps_per_s'] / own_limit:8.2f}")
    if "sb3" not in med:
        print("stable-baselines3: not installed (pip install stable-baselines3)")
    if args.json:
        Path(args.json).write_text(json.dumps({"limit": limit, "median": med, "runs": results,
                                               "environment": environment()}, indent=1))


if __name__ == "__main__":
    main()
