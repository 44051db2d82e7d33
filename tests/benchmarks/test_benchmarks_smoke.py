"""Smoke run of benchmarks/containers.py: it runs, prints its table and writes one JSON row per op.

No timing is asserted here (BENCHMARKS.md: targets live in the benchmark output, never in tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPS = {"index", "slice", "cat", "clone", "to(cpu)", "tdt.index", "temporal_index", "to_transitions"}


pytestmark = pytest.mark.slow  # worker processes or subprocesses throughout


def test_containers_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "containers.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "containers.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    rows = {r["op"]: r for r in data["rows"]}
    expected = set(OPS)
    if data["environment"]["cuda"]:
        expected.add("to(cuda)")
    assert set(rows) == expected
    assert data["environment"]["torch_threads"] == 1
    for op, r in rows.items():
        for impl in ("rlstruct", "dict"):
            t = r[impl]
            assert t["reps"] >= 3 and 0 < t["min_us"] <= t["median_us"] <= t["max_us"], (op, impl)
        if r["tensordict_status"] == "not installed":
            assert r["tensordict"] is None and r["ratio_vs_tensordict"] is None
        else:
            assert r["tensordict"]["median_us"] > 0 and r["ratio_vs_tensordict"] > 0
        assert r["verdict"] in ("PASS", "MISS")
        assert op in res.stdout  # the summary table names every op
    assert "ops meet the targets" in res.stdout
