"""Smoke runs of the scripts of benchmarks/: each runs as a user runs it (``--quick`` where it has
one), exits 0 and writes its JSON, whose shape is checked here. One table, one parametrised test.

No timing is asserted here (BENCHMARKS.md: targets live in the benchmark output, never in tests):
the checks read the structure, the rows, the verdict words and the printed table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

def _containers(data: dict[str, Any], stdout: str) -> None:
    ops = {"index", "slice", "cat", "clone", "to(cpu)", "tdt.index", "temporal_index",
           "to_transitions"}
    rows = {r["op"]: r for r in data["rows"]}
    if data["environment"]["cuda"]:
        ops.add("to(cuda)")
    assert set(rows) == ops
    assert data["environment"]["torch_threads"] == 1
    for op, r in rows.items():
        for impl in ("rlstruct", "dict"):
            t = r[impl]
            assert t["reps"] >= 3 and 0 < t["min_us"] <= t["median_us"] <= t["max_us"], (op, impl)
        if r["tensordict_status"] == "not installed":
            assert r["tensordict"] is None and r["ratio_vs_tensordict"] is None
        else:
            assert r["tensordict"]["median_us"] > 0 and r["ratio_vs_tensordict"] > 0
        assert r["verdict"] in ("PASS", "MISS")
        assert op in stdout  # the summary table names every op
    assert "ops meet the targets" in stdout


def _throughput(data: dict[str, Any], stdout: str) -> None:
    expected = {"raw", "gym_sync", "gym_async", "torchrl", "rl_serial", "rl_batcher",
                "rl_serial_nocheck", "rl_batcher_nocheck"}  # rows 5 and 6 with check_obs=False
    optional = {"torchrl"}  # a peer that may be "not installed"
    assert data["environment"]["torch_threads"] == 1
    assert data["environment"]["OMP_NUM_THREADS"] == "1"
    rows = {r["key"]: r for r in data["rows"]}
    assert set(rows) == expected
    for key, r in rows.items():
        if key in optional and r["status"] == "not installed":
            assert "steps_per_s" not in r
            continue
        assert r["status"] == "ok", (key, r["status"])
        s = r["steps_per_s"]
        assert s["n"] >= 3 and 0 < s["min"] <= s["median"] <= s["max"], (key, s)
        assert r["cpu_cores"]["median"] >= 0 and r["peak_rss_mb"] > 0, key
        assert r["runner_torch_threads"] == 1, key
        assert r["label"] in stdout  # the summary table names every row
    startup = data["startup"]
    assert startup["status"] == "ok" and startup["construct_s"]["median"] > 0
    assert startup["bytes_per_transition"] > 0
    assert {t["name"] for t in data["targets"]} == {
        "rl_serial / gym_sync", "rl_batcher / gym_sync", "rl_batcher / gym_async",
        "rl_batcher / torchrl"}
    for t in data["targets"]:
        assert t["verdict"] in ("PASS", "MISS") or t["verdict"].startswith("n/a"), t
    assert "PASS" in stdout or "MISS" in stdout
    costs = {c["name"]: c for c in data["check_costs"]}  # the observation check, on vs off
    assert set(costs) == {"rl_serial / rl_serial_nocheck", "rl_batcher / rl_batcher_nocheck"}
    for c in costs.values():
        assert c["ratio"] > 0 and c["paired_min"] <= c["paired_max"], c
        assert c["verdict"] in ("negligible", "above the bar"), c
    assert "observation check cost" in stdout


def _learning(data: dict[str, Any], stdout: str) -> None:
    rows = {r["key"]: r for r in data["rows"]}
    assert set(rows) == {"rlstruct/ppo"}  # --no-peers: no SB3 row
    row = rows["rlstruct/ppo"]
    assert len(row["runs"]) == 1  # --quick: one seed
    run = row["runs"][0]
    # The runner reached rlstruct.algos.ppo.main() and read its summary (an error here is a
    # plumbing bug of the benchmark or a broken rlstruct/algos/ppo.py: the traceback says which).
    assert row["status"] == "ok", (run.get("error"), run.get("traceback"))
    assert run["seed"] == 0 and run["launch_to_exit"] > 0 and run["frames"] > 0
    assert isinstance(run["solved"], bool)
    assert (run["launch_to_solve"] is None) == (not run["solved"])
    assert row["label"] in stdout  # the summary table names the row
    assert data["loadavg_1m"]["n_samples"] >= 1
    assert [t["name"] for t in data["targets"]] == ["rlstruct PPO / SB3 PPO"]
    assert data["targets"][0]["verdict"].startswith(("PASS", "MISS", "n/a"))


def _rollout_step(data: dict[str, Any], stdout: str) -> None:
    assert data["environment"]["torch_threads"] == 1
    assert [r["n_envs"] for r in data["rows"]] == [32, 32, 64, 32]  # the last: check_obs=False
    cost = data["check_obs_cost"]
    assert "us_per_step" in cost and "observation check" in stdout
    assert all(cost["env_step_alone_us"][k]["min"] > 0 for k in ("on", "off"))
    for r in data["rows"]:
        s = r["us_per_step"]
        assert s["n"] == data["reps"] and 0 < s["min"] <= s["median"] <= s["max"], r
        assert r["label"] in stdout
    split = data["split_us"]
    assert {"agent call", "env.step", "buffer write", "total"} <= set(split)
    assert all(split[k] > 0 for k in ("agent call", "env.step", "buffer write", "total"))


def _pipeline(data: dict[str, Any], stdout: str) -> None:
    assert data["update"]["update_s"]["median"] > 0
    assert set(data["pipeline"]["rows"]) == {
        "sync", "pipelined", "sync_cpu_learner", "pipelined_cpu_learner"}
    assert "pipelined / sync" in stdout


def _local_learner(data: dict[str, Any], stdout: str) -> None:
    assert "group / direct" in stdout
    assert set(data["ms"]) == {"direct", "group"} and all(v > 0 for v in data["ms"].values())
    assert len(data["paired"]) == 2


def _learner_scaling(data: dict[str, Any], stdout: str) -> None:
    assert [g["ranks"] for g in data["group"]] == [1, 2] == [d["ranks"] for d in data["ddp"]]
    assert [d["ranks"] for d in data["ddp_ce"]] == [1, 2]  # the cross-entropy loop
    assert all(g["samples_per_s"] > 0 and g["rank_learn_ms"] > 0 for g in data["group"])
    assert data["group"][0]["allreduce_ms"] == 0 < data["group"][1]["allreduce_ms"]
    assert data["group_ratio_2v1"] > 0 and "load average" in stdout


def _tune_vs_grid(data: dict[str, Any], stdout: str) -> None:
    assert data["learner"] is True and data["batch_size"] == 512
    assert data["n_candidates"] == 3  # Serial 32 envs T=16; 2x8 T=32, sync and pipelined
    assert data["verdict"] in ("PASS", "MISS") and "PPO's learn step" in stdout


def _atari(data: dict[str, Any], stdout: str) -> None:
    assert "compute limit on" in stdout and "x limit" in stdout
    assert data["limit"]["limit_fp32"] > 0 and data["limit"]["env_ms"] > 0
    assert data["limit"]["train_bf16_channels_last_ms"] > 0
    preset = data["median"]["rlstruct --preset atari"]
    assert preset["steps_per_s"] > 0 and 0 < preset["cores_busy"] <= data["limit"]["cores"] + 0.5
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        assert "stable-baselines3: not installed" in stdout
    else:
        assert data["median"]["sb3"]["steps_per_s"] > 0


def _frame_buffer(data: dict[str, Any], stdout: str) -> None:
    assert data["transitions"] == 20_000 and data["n_frames"] >= data["transitions"]
    assert data["bytes_per_transition"] < data["plain_bytes_per_transition"] / 4  # frames once
    assert data["sample32_median_ms"] > 0 and data["adds_per_s"] > 0
    assert [t["name"] for t in data["targets"]] == ["resident GB per 1M transitions",
                                                    "sample(32) ms"]
    for target in data["targets"]:
        assert target["verdict"] in ("PASS", "MISS") and target["name"] in stdout


def _memory_task(data: dict[str, Any], stdout: str) -> None:
    rows = data["rows"]
    assert data["env_id"] == "rlstruct/CartPoleNoVel-v1" and data["target"] == 475.0
    assert [(r["algo"], r["variant"]) for r in rows] == [("ppo", "recurrent"),
                                                         ("ppo", "feed-forward")]
    for r in rows:
        assert r["status"] == "ok" and r["frames"] >= data["max_steps"] and r["wall_s"] > 0, r
        assert r["best_mean"] is None or 0 < r["best_mean"] < 475  # 2k steps solve nothing
        assert ("--model mlp-gru" in r["command"]) == (r["variant"] == "recurrent")
        assert f"{r['variant']:<13} seed 0: not solved" in stdout


def _atari_peers(data: dict[str, Any], stdout: str) -> None:
    assert list(data["rows"]) == ["dqn"] and "x SB3" in stdout
    mine = data["rows"]["dqn"]["rlstruct"]
    assert mine["frames_per_s"] > 0 and mine["rows"] >= 2  # rows after learning started
    assert 0 < mine["cores_busy"] <= (os.cpu_count() or 1) + 0.5
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        assert "stable-baselines3: not installed" in stdout and data["rows"]["dqn"]["sb3"] is None
    else:
        assert data["rows"]["dqn"]["sb3"]["frames_per_s"] > 0 and data["rows"]["dqn"]["ratio"] > 0


def _sac_peers(data: dict[str, Any], stdout: str) -> None:
    assert "x limit" in stdout and "compute limit" in stdout
    mine, limit = data["rows"]["rlstruct"], data["limit"]
    assert mine["frames_per_s"] > 0 and mine["rows"] >= 2  # rows after learning started
    assert 0 < mine["cores_busy"] <= (os.cpu_count() or 1) + 0.5
    assert mine["updates"] > 0 and limit["matmul_ms"] > 0
    assert mine["of_limit"] == pytest.approx(mine["frames_per_s"] / limit["limit_frames_per_s"])
    if data["rows"]["sb3"] is None:
        assert "stable-baselines3: not run" in stdout and data["ratio"] is None
    else:
        assert data["rows"]["sb3"]["frames_per_s"] > 0 and data["ratio"] > 0


def _sac_update(data: dict[str, Any], stdout: str) -> None:
    assert list(data["threads"]) == ["2"] and "profile of the eager step" in stdout
    one = data["threads"]["2"]
    assert "compile" not in one  # --quick: eager only
    assert one["eager"]["ms"] > 0 and one["limit"]["matmul_ms"] > 0
    assert one["eager"]["of_limit"] == pytest.approx(one["limit"]["matmul_ms"]
                                                     / one["eager"]["ms"])
    assert one["concurrent"]["ms"] > 0 and one["concurrent_over_eager"] == pytest.approx(
        one["concurrent"]["ms"] / one["eager"]["ms"])
    assert "concurrent / eager" in stdout
    ops = {row["op"] for row in data["profile"]}
    assert ops & {"aten::bmm", "aten::baddbmm", "aten::mm", "aten::addmm"}, ops
    assert all(0 < row["share"] <= 1 and row["calls"] > 0 for row in data["profile"])


@dataclass(frozen=True)
class Smoke:
    """One script's smoke run: its arguments (``--json FILE`` is added), its deadline, the
    modules it needs (skipped without them) and the check of its JSON and output."""

    script: str
    args: tuple[str, ...]
    timeout_s: int
    check: Callable[[dict[str, Any], str], None]
    needs: tuple[str, ...] = ()


SMOKES = {
    "containers": Smoke("containers.py", ("--quick",), 120, _containers),
    "throughput": Smoke("throughput.py", ("--quick",), 150, _throughput),
    "learning": Smoke("learning.py", ("--quick", "--algos", "ppo", "--no-peers"), 240, _learning),
    "rollout_step": Smoke("rollout_step.py", ("--quick",), 90, _rollout_step),
    "pipeline": Smoke("pipeline.py", ("--quick",), 150, _pipeline),
    "local_learner": Smoke("local_learner.py", ("--reps", "2"), 100, _local_learner),
    "learner_scaling": Smoke("learner_scaling.py", ("--quick",), 240, _learner_scaling),
    "tune_vs_grid": Smoke("tune_vs_grid.py", ("--quick", "--learner", "--batch-size", "512"),
                          220, _tune_vs_grid),
    "atari": Smoke("atari.py", ("--quick",), 380, _atari, needs=("ale_py", "cv2")),
    "frame_buffer": Smoke("frame_buffer.py", ("--quick",), 120, _frame_buffer),
    "atari_peers": Smoke("atari_peers.py", ("--quick", "--algos", "dqn"), 300, _atari_peers,
                         needs=("ale_py", "cv2")),
    "memory_task": Smoke("memory_task.py", ("--quick",), 240, _memory_task),
    "sac_peers": Smoke("sac_peers.py", ("--quick",), 240, _sac_peers, needs=("mujoco",)),
    "sac_update": Smoke("sac_update.py", ("--quick",), 120, _sac_update),
}


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=(pytest.mark.slow, pytest.mark.timeout(smoke.timeout_s + 30)))
    for name, smoke in sorted(SMOKES.items())])
def test_benchmark_quick_run(name: str, tmp_path: Path) -> None:
    smoke = SMOKES[name]
    for module in smoke.needs:
        pytest.importorskip(module, reason=f"{smoke.script} needs {module} (an extra)")
    out = tmp_path / f"{name}.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / smoke.script), *smoke.args,
                          "--json", str(out)],
                         capture_output=True, text=True, timeout=smoke.timeout_s, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    smoke.check(json.loads(out.read_text()), res.stdout)


def test_every_benchmark_script_is_smoke_run_or_covered_elsewhere() -> None:
    """A new script of benchmarks/ gets a row here (or is named with the test that covers it)."""
    elsewhere = {"gpu_check.py": "tests/benchmarks/test_gpu_check_smoke.py",
                 "gpu_scale.py": "tests/benchmarks/test_gpu_scale_smoke.py",
                 "learning_curve.py": "tests/benchmarks/test_learning_curve_command.py",
                 "torch_envs.py": "tests/envs/test_envs_torch.py",
                 "ray_backend.py": "tests/batchers/test_ray.py (on the test cluster)",
                 "envpool_atari.py": "tests/envs/test_envs_envpool.py",
                 "soak_memory.py": "tests/benchmarks/test_soak_memory.py (an hour by default)"}
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_")}
    covered = {s.script for s in SMOKES.values()} | set(elsewhere)
    assert scripts == covered, (scripts - covered, covered - scripts)
    for script, test in elsewhere.items():  # the covering test names the script
        assert script in (ROOT / test.split(" ")[0]).read_text(), (script, test)


@pytest.mark.slow
def test_throughput_runs_the_pipeline_section_as_a_child_program() -> None:
    """throughput.py does not import pipeline.py (which imports it): it runs it as a child and
    bounds it in time; a child past its deadline is reported, not waited for."""
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import throughput; "
            "print(throughput.run_pipeline_section(timeout_s=0.01)); "
            "print('imported pipeline:', 'pipeline' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=100, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "error: pipeline.py ran past 0 s" in res.stdout
    assert "imported pipeline: False" in res.stdout


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_gpu_check_without_cuda_exits_2_and_says_why(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out",
                          str(tmp_path / "r.md")], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert res.returncode == 2 and "no CUDA device" in res.stderr
    assert not (tmp_path / "r.md").exists()
