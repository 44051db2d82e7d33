"""Memory soak: does a long training run's resident memory stay flat? (issue 38)

Runs ``rlstruct train ALGO`` (PPO on CartPole-v1 with 2 worker processes by default) for
``--minutes`` (an hour by default), with no target return and no evaluation, so that it runs
the whole time. Every ``--interval`` seconds it samples the resident memory (RSS) of the
learner (the training process) and of each of its worker processes, then fits a line to the
samples after the warm-up (``--warmup`` seconds; at most a third of the run) and reports each
process's slope in MB per hour. The target: the learner under 10 MB an hour after warm-up
(issue 38 measured 47 MB an hour, about 1.1 KB an iteration, before RunLogger stopped keeping
every row and return). The workers are reported beside it.

    python benchmarks/soak_memory.py                       # an hour; prints the slopes
    python benchmarks/soak_memory.py --minutes 5 --json soak.json

The suite does not run it at length: tests/benchmarks/test_soak_memory.py checks its slope
fit and its sampling of a process tree.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

MB = 1024 * 1024
#: The learner's target slope after warm-up, MB per hour.
TARGET_MB_PER_HOUR = 10.0


def slope_per_hour(samples: list[tuple[float, float]]) -> float:
    """The least-squares slope of ``(seconds, MB)`` samples, in MB per hour (nan with fewer than
    two distinct times)."""
    n = len(samples)
    if n < 2:
        return float("nan")
    mean_t = sum(t for t, _ in samples) / n
    mean_m = sum(m for _, m in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return float("nan")
    cov = sum((t - mean_t) * (m - mean_m) for t, m in samples)
    return cov / var * 3600.0


def sample_tree(pid: int) -> dict[str, float]:
    """RSS in MB of process ``pid`` (``"learner"``) and of each of its descendants that is a
    worker (``"worker <pid>"``). The learner's own helpers, the forkserver and the resource
    tracker (its children that multiprocessing started, holding no env), are left out; the
    workers are the forkserver's children (they share its command line)."""
    out: dict[str, float] = {}
    root = psutil.Process(pid)
    out["learner"] = root.memory_info().rss / MB
    for child in root.children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
            helper = "forkserver" in cmdline or "resource_tracker" in cmdline
            if helper and child.ppid() == pid:
                continue
            out[f"worker {child.pid}"] = child.memory_info().rss / MB
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def soak(args: argparse.Namespace) -> dict[str, object]:
    """Runs the training, samples it, and returns the report."""
    duration = args.minutes * 60.0
    warmup = min(args.warmup, duration / 3)
    runs = Path(tempfile.mkdtemp(prefix="soak-"))
    command = [sys.executable, "-m", "rlstruct", "train", args.algo, "--env-id", args.env_id,
               "--n-processes", str(args.n_processes), "--time-budget", str(duration),
               "--max-frames", str(10**12), "--target-return", "None", "--eval-every", "0",
               "--runs-dir", str(runs)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    series: dict[str, list[tuple[float, float]]] = {}
    start = time.monotonic()
    try:
        while proc.poll() is None:
            now = time.monotonic() - start
            try:
                for name, mb in sample_tree(proc.pid).items():
                    series.setdefault(name, []).append((now, mb))
            except psutil.NoSuchProcess:
                break
            time.sleep(args.interval)
        stderr = proc.communicate(timeout=duration + 120)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    rows = []
    for name, samples in series.items():
        after = [(t, m) for t, m in samples if t >= warmup] or samples[-1:]
        rows.append({"process": name, "n_samples": len(after),
                     "first_mb": after[0][1], "last_mb": after[-1][1],
                     "mb_per_hour": slope_per_hour(after)})
    learner = next((r for r in rows if r["process"] == "learner"), None)
    verdict = ("n/a" if learner is None or learner["mb_per_hour"] != learner["mb_per_hour"]
               else "PASS" if learner["mb_per_hour"] < TARGET_MB_PER_HOUR else "MISS")
    return {"command": command, "minutes": args.minutes, "warmup_s": warmup,
            "interval_s": args.interval, "returncode": proc.returncode, "rows": rows,
            "target_mb_per_hour": TARGET_MB_PER_HOUR, "verdict": verdict,
            "stderr_tail": (stderr or "")[-2000:], "runs_dir": str(runs),
            "loadavg": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="training time")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=60.0,
                        help="seconds left out of the fit (at most a third of the run)")
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--n-processes", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    report = soak(args)
    print(f"after {report['warmup_s']:.0f} s of warm-up:")
    print(f"{'process':<16} {'samples':>7} {'first MB':>9} {'last MB':>9} {'MB/hour':>9}")
    for row in report["rows"]:
        print(f"{row['process']:<16} {row['n_samples']:>7} {row['first_mb']:>9.1f} "
              f"{row['last_mb']:>9.1f} {row['mb_per_hour']:>9.2f}")
    print(f"learner slope target < {TARGET_MB_PER_HOUR} MB/hour after warm-up: "
          f"{report['verdict']} (training exit code {report['returncode']})")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
