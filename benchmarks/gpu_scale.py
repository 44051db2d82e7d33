"""``make gpu-scale``: how much of a GPU node rlstruct fills, in one command of at most 9 minutes,
and one report (Markdown) with each figure beside the 2-core machine's.

Steps (each a subprocess with its own deadline; a failure is reported and the next step runs):

1. PPO ``--preset atari`` on ``PongNoFrameskip-v4`` at ``--layout auto`` (the layout the machine
   gets, rlstruct/runs/machine.py): steps/s, cores busy, GPU utilisation and memory (the
   resource monitor's columns of progress.csv), and the layout the rule chose;
2. PPO ``--preset atari-fast`` (60 envs x T=64) on ``PongNoFrameskip-v4`` at ``--layout auto``
   until a mean return of 18 (the last 20 training episodes) or 5 minutes: the wall time from
   launch, the agent steps, the mean reached;
3. SAC ``--preset mujoco`` on Hopper-v5 at ``--layout auto`` (the learner on the GPU when there
   is one): frames/s after learning starts, cores busy (benchmarks/sac_peers.py's measure);
4. torch-native CartPole at 65,536 envs: the ``SerialBatcher`` against the hand-written loop of
   the same dynamics (``benchmarks/torch_envs.py``), their ratio.

Not yet here: envpool against worker processes (``--layout auto`` keeps the config's backend).

The report is rewritten after every step. Without a CUDA device the command exits 2, unless
``--allow-cpu``: the same steps, shortened, on the CPU (the script's smoke test,
tests/benchmarks/test_gpu_scale_smoke.py; step 1 plays CartPole there, Pong's preset runs in
the Atari benchmark's smoke, and step 2 two iterations of CartPole). ``--only 1 3`` runs some
steps.

Run: ``make gpu-scale`` or ``python benchmarks/gpu_scale.py [--out gpu-scale.md]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

#: The 2-core machine's figures each step is read beside (docs/results.md, this wave's runs).
TWO_CORES = {
    "PPO --preset atari on Pong, --layout auto": "620 steps/s, 1.98 cores busy (2 x 4 envs, "
                                                 "2 threads; docs/results.md)",
    "PPO --preset atari-fast on Pong to 18, --layout auto": "18.15 at 1.36M agent steps, 55 "
                                                            "minutes (seed 0, docs/results.md)",
    "SAC --preset mujoco on Hopper-v5, --layout auto": "92 frames/s, 1.99 cores busy "
                                                       "(benchmarks/sac_peers.py, 2026-12-06)",
    "torch-native CartPole, SerialBatcher vs hand loop": "0.48x the hand loop at 65,536 envs on "
                                                         "an H200 (docs/guide-gpus.md)",
}


def _rows(run_dir: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((run_dir / "progress.csv").open()))


def _mean(rows: list[dict[str, str]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key) not in (None, "", "nan")]
    return round(statistics.fmean(values), 2) if values else None


def _train(args: list[str], seconds: float) -> tuple[dict[str, Any], Path, Any]:
    """``rlstruct train ARGS --layout auto`` for at most ``seconds`` in a temporary folder;
    returns (its progress rows and config.json, summary.json, wall seconds from launch), or
    raises RuntimeError with its stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "rlstruct", "train", *args, "--layout", "auto",
               "--time-budget", str(seconds), "--runs-dir", tmp]
        start = time.perf_counter()
        res = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=seconds + 200)
        wall = time.perf_counter() - start
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-1500:])
        run_dir = next(Path(tmp).glob("*/"))
        return ({"rows": _rows(run_dir), "config": json.loads((run_dir / "config.json")
                                                             .read_text())},
                json.loads((run_dir / "summary.json").read_text()), wall)


def step_ppo_pong(dev: str, quick: bool) -> dict[str, Any]:
    """PPO's Atari preset at the machine's layout: speed, cores, GPU columns, the layout."""
    env = (["--env-id", "CartPole-v1", "--env-backend", "gymnasium", "--model", "mlp",
            "--progress-every-s", "0", "--target-return", "1000", "--max-frames", "4096"]
           if quick else ["--env-id", "PongNoFrameskip-v4"])  # quick: the plumbing, 4 rows
    run, _, _ = _train(["ppo", "--preset", "atari", *env], 60 if quick else 90)
    rows, config = run["rows"], run["config"]
    layout, later = config["config"]["layout"], rows[1:] if len(rows) >= 3 else rows
    a, b = later[0], later[-1]
    wall = float(b["wall_time"]) - float(a["wall_time"])
    out = {"ok": True, "steps_per_s": round((float(b["frames"]) - float(a["frames"])) / wall)
           if wall > 0 else None, "cores_busy": _mean(later, "cores_busy"),
           "layout": f"{layout['n_processes']} x {layout['n_envs']}, learner "
                     f"{layout['learner_device']}, {config['config']['n_threads']} threads",
           "machine": config["sessions"][0].get("machine")}
    for key in rows[0]:
        if key.startswith("gpu") and key.endswith(("_util", "_mem_mb")):
            out[key] = _mean(later, key)
    return out


def step_pong_to_18(dev: str, quick: bool) -> dict[str, Any]:
    """The big-batch preset until a mean of 18 or 5 minutes: the wall time from launch."""
    target = 100.0 if quick else 18.0
    env = (["--env-id", "CartPole-v1", "--env-backend", "gymnasium", "--model", "mlp",
            "--max-frames", "7680"] if quick else [])  # the plumbing: two iterations
    run, summary, wall = _train(["ppo", "--preset", "atari-fast", *env, "--target-return",
                                 str(target)], 60 if quick else 300)
    layout = run["config"]["config"]["layout"]
    return {"ok": True, "reached": bool(summary.get("solved")), "target": target,
            "wall_s_from_launch": round(wall, 1), "agent_steps": summary.get("frames"),
            "steps_to_target": summary.get("frames_to_solve"),
            "train_return": next((v for k, v in summary.items()
                                  if k.startswith("train_return_mean")), None),
            "layout": f"{layout['n_processes']} x {layout['n_envs']}, learner "
                      f"{layout['learner_device']}"}


def step_sac_hopper(dev: str, quick: bool) -> dict[str, Any]:
    """SAC's MuJoCo preset at the machine's layout (its learner on the GPU when there is one)."""
    import sac_peers

    if quick:
        # one thread: the suite's loaded cores stall two (step 1 checks --layout auto)
        return {"ok": True, **sac_peers.run_rlstruct(600.0, 300, 350, ["--n-threads", "1"])}
    return {"ok": True, **sac_peers.run_rlstruct(120.0, 10_000, None, ["--layout", "auto"])}


def step_torch_envs(dev: str, quick: bool) -> dict[str, Any]:
    """Torch-native CartPole on ``dev``: the batcher against the hand loop."""
    import gpu_check

    out = gpu_check.step_torch_envs(dev, quick)
    rows = out.get("steps_per_s", {})
    if out["ok"] and rows.get("hand"):
        out["serial_vs_hand"] = round(rows["rl_serial"] / rows["hand"], 2)
    return out


STEPS = {
    "PPO --preset atari on Pong, --layout auto": step_ppo_pong,
    "PPO --preset atari-fast on Pong to 18, --layout auto": step_pong_to_18,
    "SAC --preset mujoco on Hopper-v5, --layout auto": step_sac_hopper,
    "torch-native CartPole, SerialBatcher vs hand loop": step_torch_envs,
}


def report(results: dict[str, dict], dev: str, seconds: float) -> str:
    """The Markdown report: each step's figures beside the 2-core machine's."""
    import gpu_check

    return gpu_check.report(results, dev, seconds, "gpu-scale",
                            ("on the 2-core machine", TWO_CORES))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="gpu-scale.md", help="the report (Markdown)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="without CUDA, run the steps shortened on the CPU (the script's smoke)")
    p.add_argument("--only", nargs="*", default=None, help="run only these steps (numbers 1-3)")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("gpu-scale: no CUDA device here (torch.cuda.is_available() is False); run it on a "
              "GPU machine, or with --allow-cpu to smoke-test the script", file=sys.stderr)
        return 2
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    quick = dev == "cpu"
    start, results, text = time.perf_counter(), {}, ""
    for i, (step, fn) in enumerate(STEPS.items(), 1):
        if args.only is not None and str(i) not in args.only:
            continue
        t = time.perf_counter()
        try:
            results[step] = fn(dev, quick)
        except Exception as exc:  # noqa: BLE001 - a failed step is reported; the next one runs
            results[step] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-1500:]}
        results[step]["seconds"] = round(time.perf_counter() - t, 1)
        print(f"{step}: {'ok' if results[step]['ok'] else 'FAILED'} "
              f"({results[step]['seconds']} s)", flush=True)
        text = report(results, dev, time.perf_counter() - start)  # a run cut short keeps its
        Path(args.out).write_text(text)  # finished steps
    print(text)
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
