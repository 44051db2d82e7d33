"""Smoke run of benchmarks/atari.py --quick: the compute limit, rlstruct's preset and (when
installed) stable-baselines3 each run, and the table with the ratios is printed and written.

No timing is asserted here (BENCHMARKS.md: targets live in the benchmark output, never in tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # subprocess runs of a CNN on Pong


@pytest.mark.timeout(400)
def test_atari_benchmark_prints_both_sides_and_the_limit(tmp_path: Path) -> None:
    pytest.importorskip("ale_py", reason="needs the atari extra: pip install rlstruct[atari]")
    pytest.importorskip("cv2", reason="needs the atari extra: pip install rlstruct[atari]")
    out = tmp_path / "atari.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "atari.py"), "--quick",
                          "--json", str(out)], capture_output=True, text=True, timeout=380,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "compute limit on" in res.stdout and "x limit" in res.stdout
    data = json.loads(out.read_text())
    assert data["limit"]["limit_fp32"] > 0 and data["limit"]["env_ms"] > 0
    assert data["limit"]["train_bf16_channels_last_ms"] > 0
    preset = data["median"]["rlstruct --preset atari"]
    assert preset["steps_per_s"] > 0 and 0 < preset["cores_busy"] <= data["limit"]["cores"] + 0.5
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        assert "stable-baselines3: not installed" in res.stdout
    else:
        assert data["median"]["sb3"]["steps_per_s"] > 0
