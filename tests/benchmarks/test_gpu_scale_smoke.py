"""Smoke run of benchmarks/gpu_scale.py (``make gpu-scale``) on the CPU (``--allow-cpu``): every
step runs shortened and the report gives each step's figures beside the 2-core machine's; without
CUDA and without ``--allow-cpu`` it refuses. No timing is asserted (targets live in the report).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_scale.py"

pytestmark = pytest.mark.slow  # subprocess runs


def test_without_cuda_it_refuses_unless_allowed(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the refusal is for machines without one")
    res = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "r.md")],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 2 and "--allow-cpu" in res.stderr
    assert not (tmp_path / "r.md").exists()


@pytest.mark.timeout(400)
def test_the_cpu_smoke_run_reports_every_step_beside_the_two_core_figures(tmp_path: Path) -> None:
    pytest.importorskip("mujoco", reason="step 2 plays Hopper (the mujoco extra)")
    out = tmp_path / "scale.md"
    res = subprocess.run([sys.executable, str(SCRIPT), "--allow-cpu", "--out", str(out)],
                         capture_output=True, text=True, timeout=380, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    text = out.read_text()
    for step in ("PPO --preset atari on Pong, --layout auto",
                 "PPO --preset atari-fast on Pong to 18, --layout auto",
                 "SAC --preset mujoco on Hopper-v5, --layout auto",
                 "torch-native CartPole, SerialBatcher vs hand loop"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {step} | yes |"))
        assert row.count("|") >= 5 and "2-core" not in row  # figures, then the 2-core column
    assert '"steps_per_s": null' not in text and re.search(r'"layout": "\d+ x \d+, learner', text)
    assert '"serial_vs_hand"' in text and '"frames_per_s"' in text
    assert re.search(r'"wall_s_from_launch": \d', text) and '"target": 100.0' in text
