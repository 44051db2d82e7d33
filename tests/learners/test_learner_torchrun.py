"""rlstruct.learners.torchrun: ``torchrun --nproc-per-node 2 -m rlstruct.algos.ppo`` is one run
whose two
ranks learn on half the rows each; a rank that dies, raises or hangs is named by rank 0 within
its deadline, and no process is left behind."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlstruct.learners.group import free_port

ROOT = Path(__file__).resolve().parents[2]


def _run(cmds: list[tuple[list[str], dict[str, str]]], cwd: Path, timeout: float
         ) -> list[subprocess.CompletedProcess]:
    """Runs each command in its own session (process group) until all end; asserts that no
    process of theirs is left, then kills whatever is, so nothing outlives the test."""
    procs = [subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **env}, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True) for cmd, env in cmds]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
        left = [p.pid for p in procs if _group_alive(p.pid)]
        assert left == [], f"processes left in the groups of {left}"
        return [subprocess.CompletedProcess(p.args, p.returncode, out)
                for p, out in zip(procs, outs)]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_ppo_is_one_run_whose_two_ranks_learn_on_half_the_rows(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "rlstruct.algos.ppo", "--max-frames", "4096", "--eval-every", "0",
           "--n-processes", "1", "--n-envs", "4", "--runs-dir", str(tmp_path / "runs")]
    [done] = _run([(cmd, {"PYTHONPATH": str(ROOT)})], cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout
    [run_dir] = list((tmp_path / "runs").iterdir())  # rank 0 alone writes a run folder
    with open(run_dir / "progress.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["n_allreduce"] not in ("", "nan")]
    assert rows, "no progress row of a learned batch"
    for row in rows:
        assert float(row["rows_per_rank"]) == 2  # 4 trajectories per batch, 2 per rank
        assert float(row["n_allreduce"]) == 20  # 20 epochs of one minibatch, averaged each
        assert float(row["replica_spread"]) == 0.0  # rank 1's parameters equal rank 0's
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "max_frames" and summary["frames"] >= 4096
    assert (run_dir / "checkpoints" / "latest.pt").exists()
    # The run records how it was launched and its world size, not n_learners' default of 1.
    launch = {"launcher": "torchrun", "world_size": 2}
    assert summary["launch"] == launch
    assert json.loads((run_dir / "config.json").read_text())["launch"] == launch


def _world(fault: str, tmp_path: Path, timeout: float = 90) -> tuple[list, float]:
    port = free_port()
    script = str(ROOT / "tests" / "support" / "torchrun_fns.py")
    cmds = [([sys.executable, script, fault],
             {"PYTHONPATH": str(ROOT), "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}) for r in range(2)]
    start = time.monotonic()
    done = _run(cmds, cwd=tmp_path, timeout=timeout)
    return done, time.monotonic() - start


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_two_rank_world_learns_identical_replicas(tmp_path):
    (rank0, rank1), _ = _world("none", tmp_path)
    assert rank0.returncode == 0 and rank1.returncode == 0, rank0.stdout + rank1.stdout
    assert "OK 0.0 8.0" in rank0.stdout, rank0.stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("fault", "expected"), [
    ("die", r"ERROR LearnerError rank=1 .*rank 1 (\(pid \d+ on [^)]+\) )?died"),
    ("raise", r"ERROR LearnerError rank=1 .*rank 1 raised ValueError: a bad batch on rank 1"),
    ("hang", r"ERROR LearnerTimeoutError rank=\[1\] .*rank 1: learning batch 1"),
])
def test_a_failing_rank_is_named_by_rank_0_within_its_deadline(fault, expected, tmp_path):
    (rank0, rank1), took = _world(fault, tmp_path)
    assert re.search(expected, rank0.stdout), rank0.stdout + rank1.stdout
    assert rank0.returncode == 0, rank0.stdout  # rank 0 caught the error and closed
    assert rank1.returncode != 0  # the faulty rank did not pretend to succeed
    assert took < 45, took  # deadline 3 s + heartbeat check + orphan grace + start-up


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_torchrun_run_resumes_with_every_rank_on_the_checkpoint(tmp_path):
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", "-m", "rlstruct.algos.ppo", "--eval-every", "0", "--n-processes", "1",
            "--n-envs", "4", "--runs-dir", str(tmp_path / "runs")]
    env = {"PYTHONPATH": str(ROOT)}
    [first] = _run([([*base, "--max-frames", "1024"], env)], cwd=tmp_path, timeout=180)
    assert first.returncode == 0, first.stdout
    [run_dir] = list((tmp_path / "runs").iterdir())
    import torch

    steps = torch.load(run_dir / "checkpoints" / "latest.pt",
                       weights_only=False)["optimizer"]["state"][0]["step"]
    [second] = _run([([*base, "--max-frames", "2048", "--resume", str(run_dir)], env)],
                    cwd=tmp_path, timeout=180)
    assert second.returncode == 0, second.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumes"] == 1 and summary["frames"] >= 2048
    with open(run_dir / "progress.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["n_allreduce"] not in ("", "nan")
                and int(r["frames"]) > 1024]
    # Rank 1 loaded rank 0's optimizer state too: a fresh Adam there would part the replicas.
    assert rows and all(float(r["replica_spread"]) == 0.0 for r in rows)
    after = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)
    assert after["optimizer"]["state"][0]["step"] > steps  # Adam's count went on
