"""Smoke run of benchmarks/gpu_check.py on the CPU (--allow-cpu): the steps that need no extra run,
the report names each (the refusal without CUDA: tests/benchmarks/test_benchmark_smokes.py).

No timing is asserted here (BENCHMARKS.md: targets live in the benchmark output, never in tests).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"

pytestmark = pytest.mark.slow  # subprocess runs


@pytest.mark.timeout(300)
def test_the_cpu_smoke_run_writes_a_report_of_each_step(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    res = subprocess.run([sys.executable, str(SCRIPT), "--allow-cpu", "--only", "4", "5",
                          "--out", str(out)], capture_output=True, text=True, timeout=280,
                         cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    text = out.read_text()
    for step in ("SerialBatcher on cuda", "learner on cuda:0, CPU batcher"):
        assert f"| {step} | yes |" in text
    assert "gpu-marked tests" not in text and "65k" not in text  # --only left them out


@pytest.mark.timeout(300)
def test_step_1_keeps_pytest_s_whole_output_beside_the_report(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    res = subprocess.run([sys.executable, str(SCRIPT), "--allow-cpu", "--only", "1",
                          "--out", str(out)], capture_output=True, text=True, timeout=280,
                         cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    log = (tmp_path / "report.tests.log").read_text()
    assert "short test summary info" in log and "needs a CUDA device" in log  # -rs: skip reasons
    text = out.read_text()
    assert "| gpu-marked tests | yes |" in text and "short test summary info" not in text
