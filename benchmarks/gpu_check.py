"""``make gpu-check``: every GPU path of rlstruct in one call, in under 8 minutes on one GPU, and
one report (Markdown) of what passed and what it measured.

Steps (each a subprocess with its own deadline; a failure is reported and the next step runs):

1. the ``gpu``-marked tests (``pytest -m gpu``);
2. PPO ``--preset atari`` on ALE/Pong-v5 with the learner on the GPU, beside the same preset with
   the learner on the CPU (steps/s and cores busy of each; needs the atari extra);
3. torch-native CartPole at 65,536 envs on the GPU (``benchmarks/torch_envs.py --device cuda``);
4. a ``SerialBatcher`` on cuda: PPO with ``--env-backend torch --batcher-device cuda``, device
   contracts checked;
5. a learner on ``cuda:0`` with a CPU batcher (worker processes), device contracts checked.

The report is rewritten after every step; pytest's whole output of step 1 goes beside it
(``gpu-report.tests.log``). Without a CUDA device it exits 2, unless ``--allow-cpu`` (the
plumbing's smoke test: ``cuda`` becomes ``cpu`` and the steps are shortened).

Run: ``make gpu-check`` or ``python benchmarks/gpu_check.py [--out gpu-report.md]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))


def _cli() -> list[str]:
    return [sys.executable, "-m", "rlstruct"]


def _summary(runs_dir: str) -> dict:
    return json.loads(next(Path(runs_dir).glob("*/summary.json")).read_text())


def step_gpu_tests(dev: str, quick: bool) -> dict:
    """The ``gpu``-marked tests; their pass/skip/fail counts, and pytest's whole output as
    ``log`` (which :func:`main` writes beside the report)."""
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfEs", "-m", "gpu", "-p",
                          "no:cacheprovider", "rlstruct", "tests"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120 if quick else 240)
    last = (res.stdout.strip().splitlines() or [""])[-1]
    return {"ok": res.returncode in (0, 5), "result": last,
            "failures": [ln for ln in res.stdout.splitlines() if ln.startswith("FAILED")][:20],
            "log": res.stdout + res.stderr}


def step_atari(dev: str, quick: bool) -> dict:
    """PPO ``--preset atari`` with the learner on ``dev`` and on the CPU."""
    import atari

    seconds, warmup = (20.0, 0) if quick else (75.0, 3)
    out = {"ok": True}
    for name, device in (("learner_" + dev, dev), ("learner_cpu", "cpu")):
        out[name] = atari.run_rlstruct(["--learner-device", device], seconds, warmup)
    out["ratio"] = out["learner_" + dev]["steps_per_s"] / out["learner_cpu"]["steps_per_s"]
    return out


def step_torch_envs(dev: str, quick: bool) -> dict:
    """Torch-native CartPole at 65,536 envs (``--quick``: 4,096) on ``dev``."""
    with tempfile.TemporaryDirectory() as tmp:
        n_envs = 4096 if quick else 65536
        cmd = [sys.executable, str(ROOT / "benchmarks" / "torch_envs.py"), "--device", dev,
               "--n-envs", str(n_envs), "--json", f"{tmp}/t.json"]
        cmd += ["--quick"] if quick else ["--reps", "3", "--min-time", "3"]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                             timeout=120 if quick else 240)
        if res.returncode != 0:
            return {"ok": False, "error": res.stderr[-1500:]}
        data = json.loads(Path(f"{tmp}/t.json").read_text())
    rows = {name: round(row["steps_per_s"]["median"]) for name, row in data["rows"].items()
            if "steps_per_s" in row}
    return {"ok": True, "n_envs": n_envs, "steps_per_s": rows}


def _train(args: list[str], quick: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        # --quick: the plumbing, a few iterations whatever the load (the budget a backstop)
        budget = ["--max-frames", "8192", "--time-budget", "60"] if quick else [
            "--time-budget", "40"]
        res = subprocess.run([*_cli(), "train", "ppo", *budget, "--runs-dir", tmp,
                              "--check-devices", *args], cwd=tmp, capture_output=True, text=True,
                             timeout=200)
        if res.returncode != 0:
            return {"ok": False, "error": res.stderr[-1500:]}
        s = _summary(tmp)
    keys = ("frames", "wall_time", "stopped_by", "train_return_mean20")
    return {"ok": True, **{k: s.get(k) for k in keys},
            "steps_per_s": round(s["frames"] / s["wall_time"])}


def step_serial_batcher(dev: str, quick: bool) -> dict:
    """A ``SerialBatcher`` on ``dev``: PPO on torch-native CartPole, env and learner there."""
    return _train(["--env-backend", "torch", "--batcher-device", dev, "--learner-device", dev,
                   "--n-envs", "256"], quick)


def step_cuda_learner(dev: str, quick: bool) -> dict:
    """A learner on ``dev:0`` with a CPU batcher of worker processes."""
    return _train(["--learner-device", f"{dev}:0" if dev == "cuda" else dev], quick)


STEPS = {
    "gpu-marked tests": step_gpu_tests,
    "PPO --preset atari, learner on the GPU vs the CPU": step_atari,
    "torch-native envs at 65k envs": step_torch_envs,
    "SerialBatcher on cuda": step_serial_batcher,
    "learner on cuda:0, CPU batcher": step_cuda_learner,
}


def report(results: dict[str, dict], dev: str, seconds: float, title: str = "gpu-check",
           beside: tuple[str, dict[str, str]] | None = None) -> str:
    """The Markdown report of :func:`main` (and of gpu_scale.py: its ``title``, and ``beside``,
    a column's name and each step's entry in it)."""
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    extra = f" {beside[0]} |" if beside else ""
    lines = [f"# rlstruct {title}: {name}", "",
             f"torch {torch.__version__}, {os.cpu_count()} CPU cores, device `{dev}`, "
             f"{seconds:.0f} s in all, load average {os.getloadavg()}", "",
             f"| step | ok | figures |{extra}", "|---|---|---|" + ("---|" if beside else "")]
    for step, out in results.items():
        figures = {k: v for k, v in out.items() if k != "ok"}
        text = json.dumps(figures, default=str).replace("|", "/")[:900]
        cell = f" {beside[1][step]} |" if beside else ""
        lines.append(f"| {step} | {'yes' if out.get('ok') else '**no**'} | `{text}` |{cell}")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="gpu-report.md", help="the report (Markdown)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="without CUDA, run every step on the CPU (a smoke test of the script)")
    p.add_argument("--only", nargs="*", default=None, help="run only these steps (numbers 1-5)")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False); run it on a "
              "GPU machine, or with --allow-cpu to smoke-test the script", file=sys.stderr)
        return 2
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    quick = dev == "cpu"
    start, results = time.perf_counter(), {}
    for i, (step, fn) in enumerate(STEPS.items(), 1):
        if args.only is not None and str(i) not in args.only:
            continue
        t = time.perf_counter()
        try:
            results[step] = fn(dev, quick)
        except Exception as exc:  # noqa: BLE001 - a failed step is reported; the next one runs
            results[step] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-1500:]}
        results[step]["seconds"] = round(time.perf_counter() - t, 1)
        log = results[step].pop("log", None)
        if log is not None:
            Path(args.out).with_suffix(".tests.log").write_text(log)
        print(f"{step}: {'ok' if results[step]['ok'] else 'FAILED'} "
              f"({results[step]['seconds']} s)", flush=True)
        # written after every step: a run cut short keeps the steps it finished
        text = report(results, dev, time.perf_counter() - start)
        Path(args.out).write_text(text)
    print(text)
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
