"""Smoke run of benchmarks/learner_scaling.py: it runs 1 and 2 ranks (group and bare DDP) and
writes its figures. No timing is asserted (targets live in the benchmark output)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_learner_scaling_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learner_scaling.py"), "--quick",
         "--json", str(out)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    assert [g["ranks"] for g in data["group"]] == [1, 2] == [d["ranks"] for d in data["ddp"]]
    assert [d["ranks"] for d in data["ddp_ce"]] == [1, 2]  # the cross-entropy loop
    assert all(g["samples_per_s"] > 0 and g["rank_learn_ms"] > 0 for g in data["group"])
    assert data["group"][0]["allreduce_ms"] == 0 < data["group"][1]["allreduce_ms"]
    assert data["group_ratio_2v1"] > 0 and "load average" in res.stdout
