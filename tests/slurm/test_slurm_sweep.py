"""``rlstruct sweep --launcher slurm`` on the local Slurm (issue 29): a tiny CartPole sweep of two
sessions, one Slurm job each, through submitit."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

pytest.importorskip("submitit", reason="pip install -e '.[slurm]'")


@pytest.mark.timeout(300)
def test_a_sweep_of_two_sessions_runs_as_two_slurm_jobs(slurm, tmp_path):
    out = tmp_path / "sweep"
    done = subprocess.run(
        [sys.executable, "-m", "rlstruct", "sweep", "ppo", "--seeds", "0", "1",
         "--launcher", "slurm", "--slurm-time", "3", "--out", str(out), "--timeout", "240",
         "--", "--max-frames", "2000", "--time-budget", "60", "--n-processes", "1",
         "--eval-every", "0"],
        env=slurm.env, capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("is Slurm job") == 2
    with open(out / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["session"], r["status"], r["error"]) for r in rows] == [
        ("0", "budget", ""), ("1", "budget", "")]
    assert all(float(r["frames"]) >= 2000 for r in rows)
    log = (out / "trial0" / "session0" / "stdout.log").read_text()
    assert "CUDA_VISIBLE_DEVICES=''" in log  # CPU-only nodes: no GPU given, none touched
