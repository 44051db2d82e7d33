"""Time to solve CartPole-v1 and Pendulum-v1, and HalfCheetah-v5 at a frame budget: rlstruct's
algorithms vs stable-baselines3 (and sb3-contrib) with default settings.

*Solved* means: the mean return of the last 20 finished **training** episodes reaches the task's
target (CartPole 475; Pendulum -200 for SAC, -250 for TRPO and PPO, within 300k frames).
HalfCheetah-v5 has no target: every run plays 100k frames and the rows compare the mean return
of the last 20 episodes and the launch->exit time (the mujoco extra:
``pip install -e '.[mujoco]'``).
Rows (all measured in the same run, over the same seeds):

* rlstruct ``rlstruct/algos/reinforce.py``, ``rlstruct/algos/a2c.py``, ``rlstruct/algos/ppo.py``,
``rlstruct/algos/dqn.py`` with
  their own defaults (the seed, the time budget, the target return and the output folder are the
  only settings this script passes);
* stable-baselines3 ``PPO``, ``A2C`` and ``DQN`` with their DEFAULT hyperparameters:
  ``PPO("MlpPolicy", "CartPole-v1", seed=s, device="cpu")`` etc.; a callback reads the finished
  episodes (``infos[i]["episode"]["r"]``, from the Monitor wrapper SB3 puts around the env) and
  stops ``learn()`` once the 20-episode mean reaches 475, or at the wall-clock cap. A row says
  "not installed" when stable-baselines3 is missing (``pip install -e .[bench]`` installs the
  peers; keep your torch with ``-c <(echo torch==X)``);
* continuous control (``sac_pendulum``, ``trpo_pendulum``, ``ppo_pendulum``,
  ``sac_halfcheetah``, ``ppo_halfcheetah``): ``rlstruct/algos/sac.py``, ``rlstruct/algos/trpo.py``
  and
  ``rlstruct/algos/ppo.py`` with their defaults on the task's env (except PPO: its Box settings, and
  HalfCheetah SAC: 256-wide nets; see ``VARIANTS``) beside SB3's ``SAC``/``PPO`` and
  sb3-contrib's ``TRPO`` with their defaults;
* garage's sampler table (``trpo_serial12``, ``trpo_2x6``, ``trpo_ray2x6``, not run by default):
  TRPO on Pendulum with its 12 envs collected in the learner's process, by two worker processes
  and by two Ray actors (docs/guide-resources.md).

Method:

* every (algorithm, seed) runs in its own subprocess, one at a time (the machine has 2 cores),
  so start-up (imports, worker spawn) is part of the measured time; the order of the rows is
  rotated from one seed to the next so that a change of the machine's load hits every row alike;
* two times per run: **launch->solve**, from the parent's ``Popen`` to the solve (the headline
  figure, used by the targets), and **algo**, the time the algorithm reports (rlstruct's
  ``time_to_solve``, measured from ``main()``'s start; for SB3 from the model's construction).
  For rlstruct, launch->solve = (the time ``main()`` was entered - launch) + ``time_to_solve``;
  an algo whose summary has no ``time_to_solve`` but stops when solved is read from its
  ``seconds``/``wall_time`` and ``frames`` instead (the JSON says which);
* a run that does not solve within its budget counts as +inf in the medians ("unsolved"), so a
  median is finite only if more than half of the seeds solved;
* threads: every child starts WITHOUT ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` (both are removed
  from its environment): rlstruct's algorithms pin their own learner (1 thread by default) and
  SB3 runs with one torch thread, like the rlstruct learner (``--sb3-threads 0``: torch's
  default). The JSON records the thread count each run ended with. Measured on a busy 2-core
  machine (load 4-9), SB3 with torch's default 2 threads collapsed (PPO: 10k-20k steps in
  120 s, vs ~35k in 20-50 s with one thread);
* the 1-minute load average is sampled every 2 s for the whole benchmark and reported (other
  people's jobs may share the machine); each run also records its process tree's CPU seconds.

Targets (the issues): rlstruct PPO and A2C median launch->solve <= 0.5x SB3's PPO resp. A2C in
the same run; REINFORCE and DQN solve on 3 of 3 seeds (at least 3 seeds), each within 120 s.
Pendulum: SAC (-200) and TRPO (-250) solve 3 of 3 seeds with a median launch->solve <= 0.5x
SB3 SAC's resp. sb3-contrib TRPO's; PPO solves 3 of 3. HalfCheetah: rlstruct SAC's and PPO's
median return >= SB3's, and their median launch->exit <= SB3's.

The rows (tasks, settings, peers) and the verdicts live in ``_learning_targets.py``.

Usage::

    python benchmarks/learning.py                        # 3 seeds, every algorithm + SB3 peers
    python benchmarks/learning.py --algos ppo a2c --seeds 0 1 2 3 4 --json out.json
    python benchmarks/learning.py --quick --algos ppo --no-peers   # plumbing check (~20 s)
    python benchmarks/learning.py --peers ppo            # every algorithm, SB3 PPO only
    python benchmarks/learning.py --algos sac_pendulum   # SAC vs SB3 SAC on Pendulum, 3 seeds
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import math
import os
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import _common
from _learning_targets import (
    ALGOS,
    ENV_ID,
    NOT_BY_DEFAULT,
    PEER_PACKAGES,
    SB3_PEERS,
    TARGET_RETURN,
    TASKS,
    TUNED_LAYOUT,
    VARIANTS,
    WINDOW,
    Task,
    finish_row,
    peer_key,
    print_table,
    row_spec,
    targets,
)

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = Path(__file__).resolve().parent
GRACE_S = 90.0  # beyond a run's budget before the parent kills it (start-up + teardown)


# ============================================================================ child processes
def run_rlstruct(name: str, seed: int, budget: float, out_root: str,
                 tuned_layout: str | None = None) -> dict[str, Any]:
    """Runs ``rlstruct.algos.<name>`` in this process; returns its summary plus what was passed.

    Every algorithm's ``Config`` subclasses ``rlstruct.runs.run.RunConfig``, so the same fields
    set the seed, the time budget, the output folder and the stop test (the benchmark's own
    definition of solved) everywhere; ``main(cfg)`` returns the run's summary.
    """
    import torch  # the algo imports it anyway

    module, task_name, layout_fields, config_fields = row_spec(name)
    task = TASKS[task_name]
    mod = importlib.import_module(f"rlstruct.algos.{module}")
    overrides: dict[str, Any] = {
        "seed": seed, "time_budget": float(budget), "runs_dir": out_root,
        "target_return": task.target, "target_window": WINDOW, "env_id": task.env_id,
    }
    if task.frames is not None:
        overrides["max_frames"] = task.frames
    if layout_fields:
        overrides["layout"] = dataclasses.replace(mod.Config().layout, **layout_fields)
    overrides.update({key: tuned_layout if value == TUNED_LAYOUT else value
                      for key, value in config_fields.items()})
    entered = time.time()
    summary = mod.main(mod.Config(**overrides))
    return {
        "main_entered": entered,
        "overrides": {k: str(v) for k, v in overrides.items()},
        "call": "main(Config)",
        "summary": summary,
        "torch_threads": torch.get_num_threads(),
    }


def run_sb3(algo: str, seed: int, budget: float, max_steps: int, threads: int,
            task: Task) -> dict[str, Any]:
    """Trains SB3's (or sb3-contrib's) ``algo`` with defaults on ``task``: until solved (no
    test when ``task.target`` is None), ``budget`` seconds or ``max_steps``."""
    import stable_baselines3 as sb3
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    package = importlib.import_module(PEER_PACKAGES.get(algo, "stable_baselines3"))

    if threads > 0:
        torch.set_num_threads(threads)

    class StopWhenSolved(BaseCallback):
        """Tracks finished episodes; stops on the target or on the wall-clock cap."""

        def __init__(self, start: float) -> None:
            super().__init__()
            self.start, self.returns = start, []
            self.solved: tuple[int, float, float] | None = None
            self.capped = False

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            last = self.returns[-WINDOW:]
            if (task.target is not None and len(last) == WINDOW
                    and sum(last) / WINDOW >= task.target):
                self.solved = (self.num_timesteps, time.perf_counter() - self.start, time.time())
                return False
            if time.perf_counter() - self.start >= budget:
                self.capped = True
                return False
            return True

    start = time.perf_counter()
    model = getattr(package, algo)("MlpPolicy", task.env_id, seed=seed, device="cpu", verbose=0)
    callback = StopWhenSolved(start)
    model.learn(total_timesteps=max_steps, callback=callback)
    last = callback.returns[-WINDOW:]
    solved = callback.solved
    return {
        "summary": {
            "solved": solved is not None,
            "frames_to_solve": None if solved is None else solved[0],
            "time_to_solve": None if solved is None else solved[1],
            "solved_at": None if solved is None else solved[2],
            "frames": int(model.num_timesteps),
            "wall_time": time.perf_counter() - start,
            "episodes": len(callback.returns),
            "train_return": sum(last) / len(last) if last else math.nan,
            "stopped_by": "target" if solved else "time cap" if callback.capped else "step cap",
        },
        "torch_threads": torch.get_num_threads(),
        "sb3_version": sb3.__version__,
        "peer_package": f"{package.__name__} {package.__version__}",
    }


def runner(argv: list[str]) -> int:
    """Entry point of a child: runs one (algorithm, seed) and writes the result as JSON."""
    p = argparse.ArgumentParser()
    p.add_argument("--kind", choices=("rlstruct", "sb3"), required=True)
    p.add_argument("--algo", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--budget", type=float, required=True)
    p.add_argument("--max-steps", type=int, default=1_000_000)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out-root", default=".")
    p.add_argument("--result", required=True)
    p.add_argument("--task", choices=tuple(TASKS), default="cartpole")
    p.add_argument("--frames", type=int, default=None)
    p.add_argument("--tuned-layout", default=None)
    a = p.parse_args(argv)
    set_fixed_budget(a.frames)
    try:
        if a.kind == "rlstruct":
            res = run_rlstruct(a.algo, a.seed, a.budget, a.out_root, a.tuned_layout)
        else:
            task = TASKS[a.task]
            steps = task.frames if task.frames is not None else a.max_steps
            res = run_sb3(a.algo, a.seed, a.budget, steps, a.threads, task)
        res["status"] = "ok"
    except BaseException as e:  # noqa: BLE001 - reported in the row, never fatal to the benchmark
        res = {"status": "error", "error": f"{type(e).__name__}: {e}",
               "traceback": traceback.format_exc()[-3000:]}
    Path(a.result).write_text(json.dumps(res, default=str))
    return 0 if res["status"] == "ok" else 1


def tune_layout(tune_args: str, out: Path) -> tuple[Path | None, dict[str, Any]]:
    """Runs ``rlstruct tune --algo rlstruct.algos.tuning:ppo`` as a user would; returns
    the
    layout file it wrote (None when it failed) and what it did (command, seconds, pick)."""
    cmd = [sys.executable, "-m", "rlstruct", "tune", "--algo", "rlstruct.algos.tuning:ppo",
           *shlex.split(tune_args), "--out", str(out)]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, env=_child_env(), capture_output=True, text=True,
                         timeout=900)
    info: dict[str, Any] = {"command": " ".join(cmd[1:]), "seconds": time.perf_counter() - t0,
                            "rc": res.returncode}
    if res.returncode != 0 or not out.exists():
        info["error"] = (res.stdout + res.stderr)[-2000:]
        print(f"tuner failed (rc {res.returncode}): the ppo_tuned row will fail\n{info['error']}")
        return None, info
    info["pick"] = json.loads(out.read_text()).get("tuned", {})
    print(f"tuned layout for ppo_tuned in {info['seconds']:.0f} s: {info['pick'].get('label')}")
    return out, info


def set_fixed_budget(frames: int | None) -> None:
    """Replaces the frame budget of the tasks without a target (HalfCheetah) by ``frames``."""
    if frames is not None:
        for name, task in TASKS.items():
            if task.target is None:
                TASKS[name] = dataclasses.replace(task, frames=frames)


# ============================================================================ parent process
class LoadSampler:
    """Samples the 1-minute load average every ``period`` seconds in a daemon thread."""

    def __init__(self, period: float = 2.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(period,), daemon=True)

    def _loop(self, period: float) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(period)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(BENCH_DIR), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _kill_group(proc: subprocess.Popen) -> None:
    """Ends the child we started and its workers (its own session/process group)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
            return


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _monitor_cores(run_dir: Path) -> float | None:
    """Median ``cores_busy`` of a run's progress.csv (the resource monitor's measure of the
    whole process tree). ``cpu_cores`` from ``RUSAGE_CHILDREN`` misses the workers: they are
    children of the forkserver, which outlives the run and is reaped by init."""
    try:
        with open(run_dir / "progress.csv", newline="") as f:
            values = sorted(float(r["cores_busy"]) for r in csv.DictReader(f)
                            if r.get("cores_busy") not in (None, "", "nan"))
    except (OSError, KeyError, ValueError):
        return None
    return values[len(values) // 2] if values else None


def launch(kind: str, algo: str, seed: int, budget: float, args: argparse.Namespace,
           workdir: Path, task: str = "cartpole") -> dict[str, Any]:
    """Runs one child to completion; returns the run's record (times from the launch)."""
    workdir.mkdir(parents=True)
    result = workdir / "result.json"
    cmd = [
        sys.executable, "-c",
        "import sys, learning; sys.exit(learning.runner(sys.argv[1:]))",
        "--kind", kind, "--algo", algo, "--seed", str(seed), "--budget", str(budget),
        "--max-steps", str(args.sb3_max_steps), "--threads", str(args.sb3_threads),
        "--out-root", str(workdir / "runs"), "--result", str(result), "--task", task,
    ] + ([] if args.frames is None else ["--frames", str(args.frames)]) + (
        [] if args.tuned_layout is None else ["--tuned-layout", str(args.tuned_layout)])
    load0 = os.getloadavg()[0]
    cpu0 = _children_cpu()
    algo_file = ROOT / "rlstruct" / "algos" / f"{row_spec(algo)[0]}.py"
    sha = (hashlib.sha256(algo_file.read_bytes()).hexdigest()[:16]
           if kind == "rlstruct" and algo_file.exists() else None)
    with open(workdir / "stdout.txt", "wb") as out, open(workdir / "stderr.txt", "wb") as err:
        t_launch, t0 = time.time(), time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=workdir, env=_child_env(), stdout=out, stderr=err,
                                start_new_session=True)
        killed = False
        try:
            proc.wait(timeout=budget + GRACE_S)
        except subprocess.TimeoutExpired:
            killed = True
            _kill_group(proc)
        exit_s = time.perf_counter() - t0
    cpu_s = _children_cpu() - cpu0
    rec: dict[str, Any] = {
        "seed": seed, "budget_s": budget, "rc": proc.returncode, "launch_to_exit": exit_s,
        "cpu_s": cpu_s, "cpu_cores": cpu_s / exit_s if exit_s > 0 else 0.0,
        "loadavg_1m_at_launch": load0, "loadavg_1m_at_exit": os.getloadavg()[0],
        "launched_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t_launch)),
    }
    if sha is not None:  # the version of the algo file this run measured
        rec["file_sha256"] = sha
    res = json.loads(result.read_text()) if result.exists() else None
    if res is None or res.get("status") != "ok":
        rec["status"] = "killed (over budget + grace)" if killed else "error"
        rec["error"] = (res or {}).get("error") or f"rc={proc.returncode}, no result"
        rec["traceback"] = (res or {}).get("traceback") or _tail(workdir / "stderr.txt")
        rec["solved"] = False
        return rec
    s = res["summary"]
    rec["status"] = "ok"
    if s.get("run_dir"):  # the run's own monitor: the whole tree, forkserver workers included
        rec["cores_busy"] = _monitor_cores(workdir / s["run_dir"])
    rec["torch_threads"] = res.get("torch_threads")
    rec["solved"] = bool(s.get("solved"))
    rec["frames"] = s.get("frames")
    rec["train_return"] = s.get(f"train_return_mean{WINDOW}", s.get("train_return"))
    rec["wall_time"] = s.get("wall_time", s.get("seconds"))
    for key in ("overrides", "call", "sb3_version", "peer_package"):
        if key in res:
            rec[key] = res[key]
    if "stopped_by" in s:
        rec["stopped_by"] = s["stopped_by"]
    # The algorithm's own time and frames to solve; fall back to its stop time and frames.
    tts, fts, source = s.get("time_to_solve"), s.get("frames_to_solve"), "time_to_solve"
    if rec["solved"] and tts is None:
        tts, source = s.get("seconds", s.get("wall_time")), "seconds/wall_time at stop"
        fts = s.get("frames")
    rec["time_to_solve"] = tts if rec["solved"] else None
    rec["frames_to_solve"] = fts if rec["solved"] else None
    rec["time_source"] = source
    if kind == "rlstruct":  # launch -> main() entered: interpreter start and imports
        rec["startup_s"] = res["main_entered"] - t_launch
    if rec["solved"] and tts is not None:
        if kind == "sb3":
            rec["launch_to_solve"] = s["solved_at"] - t_launch
        else:
            rec["launch_to_solve"] = rec["startup_s"] + tts
    else:
        rec["launch_to_solve"] = None
    return rec


def _sanitize(x: Any) -> Any:
    """JSON-safe: inf/nan -> None (the text format says "unsolved")."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _sanitize(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_sanitize(v) for v in x]
    return x


def cli_ok(algo: str) -> bool:
    """``rlstruct train <algo> --help`` exits 0."""
    try:
        module = VARIANTS.get(algo, (algo, {}, {}))[0]
        r = subprocess.run([sys.executable, "-m", "rlstruct", "train", module, "--help"], cwd=ROOT,
                           env=_child_env(), capture_output=True, timeout=60)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--algos", nargs="+", choices=ALGOS,
                   default=[a for a in ALGOS if a not in NOT_BY_DEFAULT],
                   help="rows to run (default: all but the HalfCheetah ones, which take an hour "
                        "per seed with SB3's SAC, and the TRPO layout rows; name them to run "
                        "them)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds per run, rlstruct and SB3 (default: the task's, CartPole 120, "
                        "Pendulum 400, HalfCheetah 3600; --quick 15)")
    p.add_argument("--sb3-dqn-budget", type=float, default=None,
                   help="SB3 DQN cap in seconds (default 60: with defaults it does not solve)")
    p.add_argument("--sb3-max-steps", type=int, default=1_000_000,
                   help="total_timesteps passed to SB3 learn() (the step cap)")
    p.add_argument("--sb3-threads", type=int, default=1,
                   help="torch threads of the SB3 runs (1: one core, like the rlstruct learner; "
                        "0: torch's default)")
    p.add_argument("--frames", type=int, default=None,
                   help="frame budget of the rows without a target (HalfCheetah; default 100k)")
    p.add_argument("--tune-args", default="--budget 60",
                   help="options of the `rlstruct tune --algo "
                        "rlstruct.algos.tuning:ppo` run that writes the ppo_tuned row's layout "
                        "(default: %(default)s)")
    p.add_argument("--no-peers", action="store_true", help="skip stable-baselines3")
    p.add_argument("--peers", nargs="+", choices=tuple(SB3_PEERS), default=None,
                   help="run the SB3 peers of these algorithms only (default: of every one run)")
    p.add_argument("--quick", action="store_true",
                   help="one seed, ~15 s budgets: checks the plumbing, the numbers mean little")
    p.add_argument("--keep-runs", action="store_true", help="keep the run folders (printed)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    set_fixed_budget(args.frames)
    if args.quick:
        args.seeds = args.seeds[:1]
    budget = args.time_budget or (15.0 if args.quick else None)  # None: the task's own
    dqn_budget = args.sb3_dqn_budget or (15.0 if args.quick else 60.0)

    sb3_installed = importlib.util.find_spec("stable_baselines3") is not None
    rows: dict[str, dict[str, Any]] = {}
    for algo in args.algos:
        module, task_name, _, _ = row_spec(algo)
        task = TASKS[task_name]
        path = ROOT / "rlstruct" / "algos" / f"{module}.py"
        task_budget = budget or task.budget_s
        rows[f"rlstruct/{algo}"] = {
            "key": f"rlstruct/{algo}", "algo": algo, "impl": "rlstruct", "task": task_name,
            "label": f"rlstruct rlstruct/algos/{module}.py"
                     + (f" ({algo})" if algo != module else ""),
            "budget_s": task_budget, "runs": [],
            "status": "pending" if path.exists()
                      else f"missing (rlstruct/algos/{module}.py does not exist)",
            "cli_help_ok": cli_ok(algo) if path.exists() else None,
            # Which version of the file was measured (the algos change while being tuned).
            "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            if path.exists() else None,
        }
        if algo in SB3_PEERS and not args.no_peers and algo in (args.peers or SB3_PEERS):
            cls = SB3_PEERS[algo]
            package = PEER_PACKAGES.get(cls, "stable_baselines3")
            installed = sb3_installed and importlib.util.find_spec(package) is not None
            rows[peer_key(algo)] = {
                "key": peer_key(algo), "algo": algo, "impl": "sb3", "task": task_name,
                "label": f"{'sb3-contrib' if package == 'sb3_contrib' else 'SB3'} {cls} "
                         "(defaults)", "runs": [],
                "budget_s": dqn_budget if cls == "DQN" else task_budget,
                "status": "pending" if installed else f"not installed ({package})",
            }
    todo = [k for k, r in rows.items() if r["status"] == "pending"]

    env = _common.environment(
        benchmark="learning", env_id=ENV_ID, target_return=TARGET_RETURN, window=WINDOW,
        tasks={k: vars(t) for k, t in TASKS.items()},
        seeds=args.seeds, quick=args.quick, time_budget_s=budget or "per task",
        sb3_dqn_budget_s=dqn_budget,
        sb3_max_steps=args.sb3_max_steps, sb3_threads=args.sb3_threads or "torch default",
        child_threads="OMP/MKL_NUM_THREADS unset; rlstruct: the algo's own setting; "
                      "SB3: --sb3-threads (default 1)",
        sb3_installed=sb3_installed,
    )
    print(f"learning benchmark: {', '.join(todo) or 'nothing to run'}; seeds {args.seeds}; "
          f"budget {f'{budget:g} s' if budget else 'per task'} (SB3 DQN {dqn_budget:g} s); "
          f"load {os.getloadavg()}")
    tmp = Path(tempfile.mkdtemp(prefix="rlstruct-learning-"))
    t_start = time.perf_counter()
    args.tuned_layout = None
    if "ppo_tuned" in args.algos:
        args.tuned_layout, env["tuned"] = tune_layout(args.tune_args, tmp / "tuned.json")
    with LoadSampler() as sampler:
        for i, seed in enumerate(args.seeds):
            order = todo[i % len(todo):] + todo[:i % len(todo)] if todo else []
            for key in order:
                row = rows[key]
                kind = row["impl"]
                name = row["algo"] if kind == "rlstruct" else SB3_PEERS[row["algo"]]
                rec = launch(kind, name, seed, row["budget_s"], args,
                             tmp / f"{key.replace('/', '_')}_seed{seed}", row["task"])
                row["runs"].append(rec)
                print(f"  {row['label']:<26} seed {seed}: {rec['status']}, "
                      f"{'solved' if rec['solved'] else 'not solved'}"
                      + (f" [monitor: {rec['cores_busy']:.2f} cores busy]"
                         if rec.get("cores_busy") is not None else "")
                      + (f" launch->solve {rec['launch_to_solve']:.1f} s"
                         f" (algo {rec['time_to_solve']:.1f} s), {rec['frames_to_solve']} steps"
                         if rec.get("launch_to_solve") is not None else "")
                      + f"; exit {rec['launch_to_exit']:.1f} s, {rec['cpu_cores']:.2f} cores, "
                      f"load {rec['loadavg_1m_at_exit']:.2f}"
                      + (f"; {rec['error']}" if rec["status"] != "ok" else ""), flush=True)
    for row in rows.values():
        finish_row(row)
    samples = sampler.samples or [os.getloadavg()[0]]
    load = {"min": min(samples), "median": statistics.median(samples), "max": max(samples),
            "n_samples": len(samples), "loadavg_at_end": os.getloadavg()}
    tgts = targets(rows, args.seeds)
    print_table(rows, tgts, load)
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if args.keep_runs:
        print(f"run folders kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json is not None:
        data = {"environment": env, "loadavg_1m": load, "rows": list(rows.values()),
                "targets": tgts}
        args.json.write_text(json.dumps(_sanitize(data), indent=2, default=str))
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
