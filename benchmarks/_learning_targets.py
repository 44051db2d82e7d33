"""The rows of benchmarks/learning.py and how they are judged: the tasks (env, target, frame
budget, time cap), which algorithm and settings each row runs and its SB3 / sb3-contrib peer,
the summary of a row's runs, the targets' verdicts and the printed table.

No process is started here and nothing heavier than the standard library is imported, so the
verdicts can be tested on hand-built run records
(tests/benchmarks/test_learning_targets.py).
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass
from typing import Any

ENV_ID = "CartPole-v1"
TARGET_RETURN = 475.0
WINDOW = 20  # finished training episodes averaged


@dataclass(frozen=True)
class Task:
    """What a row is measured on: the env, the target return (``None``: no stop test, the row
    runs its frame budget and compares returns), the frame budget (``None``: the algorithm's
    own ``max_frames``; SB3: ``--sb3-max-steps``) and the default time cap in seconds."""

    env_id: str
    target: float | None
    frames: int | None
    budget_s: float


TASKS = {
    "cartpole": Task(ENV_ID, TARGET_RETURN, None, 120.0),
    # SB3's SAC with its defaults needed ~181 s on one thread (load 1): room for it to solve
    "pendulum_sac": Task("Pendulum-v1", -200.0, None, 400.0),
    "pendulum": Task("Pendulum-v1", -250.0, 300_000, 400.0),
    "halfcheetah": Task("HalfCheetah-v5", None, 100_000, 3600.0),
}
ALGOS = ("reinforce", "a2c", "ppo", "ppo_pipelined", "ppo_torch_env", "dqn", "impala", "appo",
         "appo_thread", "appo_20x8", "appo_2t", "appo_8x64", "sac_pendulum", "trpo_pendulum",
         "ppo_pendulum", "sac_halfcheetah", "ppo_halfcheetah", "trpo_serial12", "trpo_2x6",
         "trpo_ray2x6", "ppo_tuned")
PPO_BOX = {"gae_lambda": 0.95, "n_epochs": 10, "normalize_obs": True}  # PPO's Box settings
#: Rows that run an algorithm otherwise: name -> (module, task, layout fields, config fields).
#: Any other row name is ``rlstruct/algos/<name>.py`` on CartPole with its defaults.
VARIANTS: dict[str, tuple[str, str, dict[str, Any], dict[str, Any]]] = {
    "ppo_pipelined": ("ppo", "cartpole", {"pipeline": 2}, {}),
    # APPO with IMPALA's learner thread, on the settings that suit its longer lag (the earlier
    # defaults: fewer frames than 10 epochs x 16 envs in paired runs, docs/algorithms.md)
    "appo_thread": ("appo", "cartpole", {"n_envs": 8}, {"queue": 1, "n_epochs": 20}),
    "appo_20x8": ("appo", "cartpole", {"n_envs": 8}, {"n_epochs": 20}),  # the earlier default
    "appo_2t": ("appo", "cartpole", {}, {"n_threads": 2}),  # the learner on 2 torch threads
    # the same 1024-frame segments from 2 x 8 envs x 64 steps: each frame costs the workers
    # about as much as the learner, so they keep the second core busy (docs/algorithms.md)
    "appo_8x64": ("appo", "cartpole", {"n_envs": 8}, {"n_timesteps": 64}),
    # torch-native CartPole in a SerialBatcher on the learner's device (the CPU here)
    "ppo_torch_env": ("ppo", "cartpole", {"n_processes": 1, "n_envs": 16},
                      {"env_backend": "torch"}),
    # continuous control: SAC's and TRPO's defaults are Pendulum's; PPO's are CartPole's, so it
    # gets the Pendulum settings its tests use (tests/algos/test_algo_ppo.py, PENDULUM)
    "sac_pendulum": ("sac", "pendulum_sac", {}, {}),
    "trpo_pendulum": ("trpo", "pendulum", {}, {}),
    "ppo_pendulum": ("ppo", "pendulum", {}, PPO_BOX | {"gamma": 0.9, "lr": 1e-3, "n_timesteps": 128,
                                                         "minibatch_size": 64}),
    # MuJoCo at a fixed frame budget: SB3-sized nets for SAC (Pendulum's 64 are too small)
    "sac_halfcheetah": ("sac", "halfcheetah", {},
                        {"hidden": 256, "lr": 1e-3, "batch_size": 256, "learning_starts": 5000}),
    "ppo_halfcheetah": ("ppo", "halfcheetah", {}, PPO_BOX | {  # docs/algorithms.md's MuJoCo flags
        "lr": 3e-4, "gamma": 0.99, "minibatch_size": 64, "n_timesteps": 128, "anneal_lr": False}),
    # garage's sampler table (docs/guide-resources.md): TRPO on Pendulum, 12 envs in all,
    # collected in the learner's process (garage's VecWorker), by 2 worker processes, by 2 Ray
    # actors
    "trpo_serial12": ("trpo", "pendulum", {"n_processes": 1, "n_envs": 12}, {}),
    "trpo_2x6": ("trpo", "pendulum", {"n_processes": 2, "n_envs": 6}, {}),
    "trpo_ray2x6": ("trpo", "pendulum", {"n_processes": 2, "n_envs": 6, "backend": "ray"}, {}),
    # PPO with the layout a fresh `rlstruct tune` wrote (benchmarks/learning.py runs
    # the tuner first, with --tune-args)
    "ppo_tuned": ("ppo", "cartpole", {}, {"layout_file": "<tuned layout>"}),
}
TUNED_LAYOUT = "<tuned layout>"  # replaced by the path of the layout file the tuner wrote
TUNED_MAX_RATIO = 1.0  # PPO --layout (freshly tuned) / PPO with its default layout
#: rows left out of the default run (name them to run them): an hour per seed with SB3's SAC,
#: the layout table of docs/guide-resources.md, a tuner run, APPO's earlier default
NOT_BY_DEFAULT = ("sac_halfcheetah", "ppo_halfcheetah", "trpo_serial12", "trpo_2x6",
                  "trpo_ray2x6", "ppo_tuned", "appo_20x8", "appo_2t", "appo_8x64")
IMPALA_MAX_RATIO = 0.6  # IMPALA / rlstruct PPO median launch->solve
IMPALA_MIN_CORES = 1.8  # cores busy during an IMPALA run
#: rlstruct row -> its peer's class, with its defaults ("MlpPolicy") on the row's task
SB3_PEERS = {"ppo": "PPO", "a2c": "A2C", "dqn": "DQN", "sac_pendulum": "SAC",
             "trpo_pendulum": "TRPO", "ppo_pendulum": "PPO", "sac_halfcheetah": "SAC",
             "ppo_halfcheetah": "PPO"}
PEER_PACKAGES = {"TRPO": "sb3_contrib"}  # peer class -> package (default stable_baselines3)
MAX_RATIO = 0.5  # rlstruct PPO / A2C (CartPole), SAC / TRPO (Pendulum) launch->solve vs SB3's
SOLVE_WITHIN_S = 120.0  # REINFORCE and DQN: every seed within this


def row_spec(name: str) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """``(module, task, layout fields, config fields)`` of an rlstruct row."""
    return VARIANTS.get(name, (name, "cartpole", {}, {}))


def _censored(values: list[float | None]) -> list[float]:
    return [math.inf if v is None else float(v) for v in values]


def _stats(values: list[float | None]) -> dict[str, Any] | None:
    """min / median / max with unsolved runs as +inf (None when there is no run)."""
    if not values:
        return None
    v = _censored(values)
    return {"min": min(v), "median": statistics.median(v), "max": max(v), "n": len(v)}


def finish_row(row: dict[str, Any]) -> None:
    runs = row["runs"]
    if not runs:
        return
    ok = [r for r in runs if r["status"] == "ok"]
    row["status"] = "ok" if len(ok) == len(runs) else "error" if not ok else "partial"
    row["n_runs"], row["n_solved"] = len(runs), sum(bool(r["solved"]) for r in runs)
    for key in ("launch_to_solve", "time_to_solve", "frames_to_solve"):
        row[key] = _stats([r.get(key) for r in runs])


def _fmt_s(x: float | None) -> str:
    return "unsolved" if x is None or math.isinf(x) else f"{x:.1f}"


def _fmt_stats(s: dict[str, Any] | None, steps: bool = False) -> str:
    if s is None:
        return "-"
    if steps:
        m = s["median"]
        return "unsolved" if m is None or math.isinf(m) else f"{m:,.0f}"
    if s["n"] == 1:
        return _fmt_s(s["median"])
    return f"{_fmt_s(s['median'])} ({_fmt_s(s['min'])}-{_fmt_s(s['max'])})"


def peer_key(algo: str) -> str:
    """The row key of ``algo``'s peer: ``sb3/PPO`` on CartPole, ``sb3/SAC@Pendulum-v1``..."""
    task = row_spec(algo)[1]
    where = "" if task == "cartpole" else f"@{TASKS[task].env_id}"
    return f"sb3/{SB3_PEERS[algo]}{where}"


def _name(algo: str) -> str:
    module, task, _, _ = row_spec(algo)
    return module.upper() + ("" if task == "cartpole" else f" {TASKS[task].env_id}")


def _peer_name(algo: str) -> str:
    cls = SB3_PEERS[algo]
    return f"{'sb3-contrib' if PEER_PACKAGES.get(cls) == 'sb3_contrib' else 'SB3'} {cls}"


def targets(rows: dict[str, dict[str, Any]], seeds: list[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for algo in ("ppo", "a2c", "sac_pendulum", "trpo_pendulum"):
        mine, peer = rows.get(f"rlstruct/{algo}"), rows.get(peer_key(algo))
        if mine is None:
            continue
        every_seed = algo != "ppo" and algo != "a2c"  # continuous control: 3/3 seeds too
        t: dict[str, Any] = {
            "name": f"rlstruct {_name(algo)} / {_peer_name(algo)}",
            "metric": "median launch->solve",
            "threshold": f"<= {MAX_RATIO}" + (f", {len(seeds)}/{len(seeds)} solved (>= 3)"
                                              if every_seed else ""),
        }
        if every_seed and mine["runs"] and len(seeds) < 3:
            t["verdict"] = f"n/a (needs >= 3 seeds; {mine['n_solved']}/{len(seeds)} solved)"
        elif every_seed and mine["runs"] and mine["n_solved"] < len(seeds):
            t["verdict"] = f"MISS ({mine['n_solved']}/{len(seeds)} seeds solved)"
        elif mine.get("launch_to_solve") is None:
            t["verdict"] = "n/a (rlstruct: " + mine.get("status", "not run") + ")"
        elif peer is None or peer.get("launch_to_solve") is None:
            t["verdict"] = "n/a (SB3: " + (peer or {}).get("status", "not run") + ")"
        else:
            a, b = mine["launch_to_solve"]["median"], peer["launch_to_solve"]["median"]
            if math.isinf(a):
                t["ratio"], t["verdict"] = None, "MISS (rlstruct unsolved)"
            elif math.isinf(b):  # SB3 did not solve within its cap: the ratio is below a/cap
                t["ratio"], t["ratio_upper_bound"] = None, a / peer["budget_s"]
                t["verdict"] = f"PASS (SB3 unsolved within its {peer['budget_s']:g} s cap)"
            else:
                t["ratio"] = a / b
                t["verdict"] = "PASS" if a / b <= MAX_RATIO else "MISS"
            ra = (mine.get("time_to_solve") or {}).get("median", math.inf)
            rb = (peer.get("time_to_solve") or {}).get("median", math.inf)
            if math.isfinite(ra) and math.isfinite(rb):
                t["ratio_algo_reported"] = ra / rb
        out.append(t)
    impala, ppo = rows.get("rlstruct/impala"), rows.get("rlstruct/ppo")
    if impala is not None:
        t = {"name": "rlstruct IMPALA / rlstruct PPO",
             "threshold": f"<= {IMPALA_MAX_RATIO}, {len(seeds)}/{len(seeds)} solved, "
                          f">= {IMPALA_MIN_CORES} cores busy", "metric": "median launch->solve"}
        cores = [r["cores_busy"] for r in impala["runs"] if r.get("cores_busy") is not None]
        t["cores_median"] = sorted(cores)[len(cores) // 2] if cores else None
        if None in (impala.get("launch_to_solve"), (ppo or {}).get("launch_to_solve")):
            t["verdict"] = "n/a (needs both IMPALA and PPO)"
        else:
            a, b = impala["launch_to_solve"]["median"], ppo["launch_to_solve"]["median"]
            t["ratio"] = a / b if math.isfinite(a) and math.isfinite(b) else None
            ok = (t["ratio"] is not None and t["ratio"] <= IMPALA_MAX_RATIO
                  and impala["n_solved"] == len(seeds)
                  and (t["cores_median"] or 0) >= IMPALA_MIN_CORES)
            t["verdict"] = "PASS" if ok else "MISS"
        out.append(t)
    tuned = rows.get("rlstruct/ppo_tuned")
    if tuned is not None:
        t = {"name": "rlstruct PPO --layout (freshly tuned) / rlstruct PPO",
             "threshold": f"<= {TUNED_MAX_RATIO}", "metric": "median launch->solve"}
        if None in (tuned.get("launch_to_solve"), (ppo or {}).get("launch_to_solve")):
            t["verdict"] = "n/a (needs both ppo_tuned and ppo)"
        else:
            a, b = tuned["launch_to_solve"]["median"], ppo["launch_to_solve"]["median"]
            t["ratio"] = a / b if math.isfinite(a) and math.isfinite(b) else None
            t["verdict"] = ("PASS" if t["ratio"] is not None and t["ratio"] <= TUNED_MAX_RATIO
                            else "MISS")
        out.append(t)
    out += continuous_targets(rows, seeds)
    for algo in ("reinforce", "dqn"):
        mine = rows.get(f"rlstruct/{algo}")
        if mine is None:
            continue
        t = {"name": f"rlstruct {algo.upper()} solves every seed",
             "threshold": f"{len(seeds)}/{len(seeds)} seeds (>= 3), each <= {SOLVE_WITHIN_S:g} s",
             "metric": "launch->solve"}
        if not mine["runs"]:
            t["verdict"] = "n/a (" + mine.get("status", "not run") + ")"
        else:
            within = [r for r in mine["runs"] if r.get("launch_to_solve") is not None
                      and r["launch_to_solve"] <= SOLVE_WITHIN_S]
            t["n_within"] = len(within)
            if len(seeds) < 3:
                t["verdict"] = (f"n/a (needs >= 3 seeds; {len(within)}/{len(mine['runs'])} "
                                f"within {SOLVE_WITHIN_S:g} s)")
            elif len(within) == len(mine["runs"]) == len(seeds):
                t["verdict"] = "PASS"
            else:
                t["verdict"] = "MISS"
        out.append(t)
    return out


def continuous_targets(rows: dict[str, dict[str, Any]], seeds: list[int]) -> list[dict[str, Any]]:
    """PPO solves Pendulum on every seed; on HalfCheetah at the frame budget, rlstruct's SAC and
    PPO reach at least SB3's return (median of the last 20 episodes) in at most its time
    (median launch->exit, start-up and teardown included for both)."""
    out: list[dict[str, Any]] = []
    mine = rows.get("rlstruct/ppo_pendulum")
    if mine is not None:
        t = {"name": "rlstruct PPO Pendulum-v1 solves every seed", "metric": "solved",
             "threshold": f"{len(seeds)}/{len(seeds)} seeds (>= 3), target "
                          f"{TASKS['pendulum'].target:g}"}
        t["verdict"] = ("n/a (" + mine.get("status", "not run") + ")" if not mine["runs"] else
                        "PASS" if mine["n_solved"] == len(seeds) >= 3 else
                        f"MISS ({mine['n_solved']}/{len(seeds)})")
        out.append(t)
    for algo in ("sac_halfcheetah", "ppo_halfcheetah"):
        mine, peer = rows.get(f"rlstruct/{algo}"), rows.get(peer_key(algo))
        if mine is None:
            continue
        t = {"name": f"rlstruct {_name(algo)} vs {_peer_name(algo)}",
             "metric": f"return at {TASKS['halfcheetah'].frames:,} frames, launch->exit",
             "threshold": "return >= SB3's and time <= SB3's (medians)"}
        mine_ret, peer_ret = _median(mine, "train_return"), _median(peer, "train_return")
        mine_s, peer_s = _median(mine, "launch_to_exit"), _median(peer, "launch_to_exit")
        t.update(return_mine=mine_ret, return_sb3=peer_ret, time_mine=mine_s, time_sb3=peer_s)
        if None in (mine_ret, peer_ret, mine_s, peer_s):
            t["verdict"] = "n/a (needs finished runs of both)"
        else:
            t["verdict"] = "PASS" if mine_ret >= peer_ret and mine_s <= peer_s else "MISS"
        out.append(t)
    return out


def _median(row: dict[str, Any] | None, key: str) -> float | None:
    """The median of ``key`` over the finished runs of a row (None if there is none)."""
    values = [r[key] for r in (row or {}).get("runs", [])
              if r.get("status") == "ok" and r.get(key) is not None
              and math.isfinite(r[key])]
    return statistics.median(values) if values else None


def print_table(rows: dict[str, dict[str, Any]], tgts: list[dict[str, Any]],
                load: dict[str, Any]) -> None:
    head = (f"{'algorithm':<16} {'implementation':<44} {'solved':>7}  "
            f"{'launch->solve s, median (min-max)':<36} {'algo-reported s':<28} "
            f"{'steps to solve (median)':>24} {'return':>9} {'exit s':>8}")
    for task_name, task in TASKS.items():
        keys = [k for algo in ALGOS if row_spec(algo)[1] == task_name
                for k in (f"rlstruct/{algo}", peer_key(algo) if algo in SB3_PEERS else "")]
        if not any(k in rows for k in keys):
            continue
        print(f"\n{task.env_id}, " + (
            f"time until the mean of the last {WINDOW} training episodes >= {task.target:g}"
            if task.target is not None else
            f"{task.frames:,} frames: the mean of the last {WINDOW} training episodes"))
        print(head)
        print("-" * len(head))
        for key in keys:
            row = rows.get(key)
            if row is None:
                continue
            name = row_spec(row["algo"])[0].upper()
            if not row["runs"]:
                print(f"{name:<16} {row['label']:<44} {row['status']}")
                continue
            solved = f"{row['n_solved']}/{row['n_runs']}"
            note = "" if row["status"] == "ok" else f"  [{row['status']}]"
            if row.get("cli_help_ok") is False:
                note += f"  [rlstruct train {row_spec(row['algo'])[0]} --help failed]"
            ret, exit_s = _median(row, "train_return"), _median(row, "launch_to_exit")
            print(f"{name:<16} {row['label']:<44} {solved:>7}  "
                  f"{_fmt_stats(row['launch_to_solve']):<36} "
                  f"{_fmt_stats(row['time_to_solve']):<28} "
                  f"{_fmt_stats(row['frames_to_solve'], steps=True):>24} "
                  f"{'-' if ret is None else f'{ret:.1f}':>9} "
                  f"{'-' if exit_s is None else f'{exit_s:.1f}':>8}{note}")
    print("\nTargets")
    for t in tgts:
        ratio = f"ratio {t['ratio']:.2f}  " if t.get("ratio") is not None else ""
        if t.get("ratio_upper_bound") is not None:
            ratio = f"ratio < {t['ratio_upper_bound']:.2f}  "
        extra = (f"  (algo-reported ratio {t['ratio_algo_reported']:.2f})"
                 if t.get("ratio_algo_reported") is not None else "")
        if t.get("cores_median") is not None:
            extra += f"  (cores busy, median {t['cores_median']:.2f})"
        if t.get("return_mine") is not None and t.get("return_sb3") is not None:
            extra += (f"  (return {t['return_mine']:.1f} vs {t['return_sb3']:.1f}, "
                      f"{t['time_mine']:.0f} s vs {t['time_sb3']:.0f} s)")
        print(f"  {t['name']:<42} {ratio}target {t['threshold']}: {t['verdict']}{extra}")
    print(f"\nload average (1 min) during the run: median {load['median']:.2f}, "
          f"min {load['min']:.2f}, max {load['max']:.2f} on {os.cpu_count()} cores")
