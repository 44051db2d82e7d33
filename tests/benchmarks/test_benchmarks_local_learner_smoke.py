"""Smoke run of benchmarks/local_learner.py: both paths learn, the ratio is printed and written.

No timing is asserted here (BENCHMARKS.md: targets live in the benchmark output, never in tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # a subprocess


@pytest.mark.timeout(120)
def test_local_learner_benchmark_runs_both_paths(tmp_path: Path) -> None:
    out = tmp_path / "local_learner.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "local_learner.py"), "--reps",
                          "2", "--json", str(out)], capture_output=True, text=True, timeout=100,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "group / direct" in res.stdout
    data = json.loads(out.read_text())
    assert set(data["ms"]) == {"direct", "group"} and all(v > 0 for v in data["ms"].values())
    assert len(data["paired"]) == 2
