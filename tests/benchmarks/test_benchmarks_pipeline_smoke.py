"""Smoke run of benchmarks/pipeline.py: it runs and writes both sections as JSON.

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


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_throughput_runs_the_pipeline_section_as_a_child_program() -> None:
    """throughput.py no longer imports pipeline.py (which imports it): it runs it as a child
    and bounds it in time; a child past its deadline is reported, not waited for."""
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import throughput; "
            "print(throughput.run_pipeline_section(timeout_s=0.01)); "
            "print('imported pipeline:', 'pipeline' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=100, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "error: pipeline.py ran past 0 s" in res.stdout
    assert "imported pipeline: False" in res.stdout
