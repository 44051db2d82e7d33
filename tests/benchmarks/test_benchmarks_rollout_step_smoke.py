"""Smoke run of benchmarks/rollout_step.py: it runs, prints its rows and split, writes JSON.

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
def test_rollout_step_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "rollout_step.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "rollout_step.py"), "--quick", "--json",
         str(out)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    assert data["environment"]["torch_threads"] == 1
    assert [r["n_envs"] for r in data["rows"]] == [32, 32, 64, 32]  # the last: check_obs=False
    cost = data["check_obs_cost"]
    assert "us_per_step" in cost and "observation check" in res.stdout
    assert all(cost["env_step_alone_us"][k]["min"] > 0 for k in ("on", "off"))
    for r in data["rows"]:
        s = r["us_per_step"]
        assert s["n"] == data["reps"] and 0 < s["min"] <= s["median"] <= s["max"], r
        assert r["label"] in res.stdout
    split = data["split_us"]
    assert {"agent call", "env.step", "buffer write", "total"} <= set(split)
    assert all(split[k] > 0 for k in ("agent call", "env.step", "buffer write", "total"))
