"""Smoke run of benchmarks/tune_vs_grid.py under PPO's learner with a fixed batch.

No timing is asserted here: the targets live in the benchmark's output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tune_vs_grid_quick_under_the_learner(tmp_path: Path) -> None:
    out = tmp_path / "tune.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tune_vs_grid.py"), "--quick", "--learner",
         "--batch-size", "512", "--json", str(out)],
        capture_output=True, text=True, timeout=220, cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(out.read_text())
    assert result["learner"] is True and result["batch_size"] == 512
    assert result["n_candidates"] == 3  # Serial 32 envs T=16; 2x8 T=32, sync and pipelined
    assert result["verdict"] in ("PASS", "MISS") and "PPO's learn step" in res.stdout
