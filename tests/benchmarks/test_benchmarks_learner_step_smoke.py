"""Smoke run of benchmarks/learner_step.py: every section runs and writes its figures. No
timing is asserted (the figures are the benchmark's output)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_learner_step_benchmark_runs_every_section(tmp_path: Path) -> None:
    out = tmp_path / "step.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learner_step.py"), "--seconds", "0.2",
         "--json", str(out)],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    assert set(data["step us"]) == {"torch.optim.Adam (fused)", "FlatAdam"}
    assert all(v > 0 for v in data["step us"].values())
    parts = data["FlatAdam step parts us"]
    assert {"backward", "update (FlatAdam)", "of appo_loss: the forward alone"} <= set(parts)
    assert data["actor and critic epochs of a segment"]["two threads ms/segment"] > 0
    assert data["activation us (256 x 64)"]["tanh, forward and backward"] > 0
    assert "torch.compile" not in data and "load average" in res.stdout
