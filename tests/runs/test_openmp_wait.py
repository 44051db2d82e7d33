"""Idle OpenMP threads sleep in rlstruct's processes (rlstruct/parallel/openmp.py).

GNU OpenMP (torch's, on Linux) prints its settings when ``OMP_DISPLAY_ENV=VERBOSE``, once per
process, when it loads: ``GOMP_SPINCOUNT`` is 0 under the passive wait policy, 300,000 by
default and 3e10 under ``OMP_WAIT_POLICY=ACTIVE``. Each test runs a program in a subprocess
whose environment has no wait policy unless the test gives one, and reads those lines.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SPIN = re.compile(r"GOMP_SPINCOUNT = '(\d+)'")


def _run(args: list[str], tmp_path: Path, policy: str | None = None,
         timeout: float = 120) -> tuple[list[int], str]:
    """``python ARGS`` with ``OMP_DISPLAY_ENV=VERBOSE``: every process's spin count, stdout."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    done = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = [int(c) for c in SPIN.findall(done.stderr)]
    if not counts:
        pytest.skip("torch's OpenMP here is not GNU OpenMP: no GOMP_SPINCOUNT to read")
    return counts, done.stdout


@pytest.mark.slow  # a training run with worker processes
def test_a_training_run_and_the_processes_its_workers_fork_from_wait_passively(tmp_path):
    counts, _ = _run(["-m", "rlstruct", "train", "ppo", "--n-processes", "2", "--max-frames",
                      "512", "--target-return", "None", "--eval-every", "0", "--runs-dir",
                      str(tmp_path / "runs")], tmp_path, timeout=240)
    # the command's process and the forkserver, whose OpenMP the workers inherit when forked
    assert len(counts) >= 2 and set(counts) == {0}, counts


def test_a_program_that_imports_rlstruct_first_waits_passively(tmp_path):
    counts, out = _run(["-c", "import os, rlstruct, torch; torch.ones(64, 64).sum(); "
                              "print(os.environ['OMP_WAIT_POLICY'])"], tmp_path)
    assert counts == [0] and out.split() == ["PASSIVE"]


def test_a_policy_the_user_set_is_kept(tmp_path):
    counts, out = _run(["-c", "import os, rlstruct, torch; print(os.environ['OMP_WAIT_POLICY'])"],
                       tmp_path, policy="ACTIVE")
    assert counts[0] > 300_000 and out.split() == ["ACTIVE"]


def test_a_program_that_imports_torch_first_keeps_the_policy_torch_started_with(tmp_path):
    """Too late for this process (its OpenMP read the environment when torch loaded); the
    processes it starts through rlstruct inherit the passive policy."""
    counts, out = _run(["-c", "import os, torch, rlstruct; print(os.environ['OMP_WAIT_POLICY'])"],
                       tmp_path)
    assert counts == [300_000] and out.split() == ["PASSIVE"]
