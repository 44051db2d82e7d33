"""Smoke run of benchmarks/pipeline.py: it runs and writes both sections as JSON.

No timing is asserted here: the targets live in the benchmark's output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_pipeline_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "pipeline.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pipeline.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=150, cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(out.read_text())
    assert result["update"]["update_s"]["median"] > 0
    assert set(result["pipeline"]["rows"]) == {
        "sync", "pipelined", "sync_cpu_learner", "pipelined_cpu_learner"
    }
    assert "pipelined / sync" in res.stdout
