"""Smoke run of benchmarks/throughput.py: it runs, prints its table and writes every row as JSON.

No timing is asserted here (BENCHMARKS.md: targets live in the benchmark output, never in tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROWS = {
    "raw", "gym_sync", "gym_async", "torchrl", "rl_serial", "rl_batcher",
    "rl_serial_nocheck", "rl_batcher_nocheck",  # rows 5 and 6 with check_obs=False
}
OPTIONAL = {"torchrl"}  # a peer that may be "not installed"


pytestmark = pytest.mark.slow  # worker processes or subprocesses throughout


@pytest.mark.timeout(180)
def test_throughput_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    assert data["environment"]["torch_threads"] == 1
    assert data["environment"]["OMP_NUM_THREADS"] == "1"
    rows = {r["key"]: r for r in data["rows"]}
    assert set(rows) == ROWS
    for key, r in rows.items():
        if key in OPTIONAL and r["status"] == "not installed":
            assert "steps_per_s" not in r
            continue
        assert r["status"] == "ok", (key, r["status"])
        s = r["steps_per_s"]
        assert s["n"] >= 3 and 0 < s["min"] <= s["median"] <= s["max"], (key, s)
        assert r["cpu_cores"]["median"] >= 0 and r["peak_rss_mb"] > 0, key
        assert r["runner_torch_threads"] == 1, key
        assert r["label"] in res.stdout  # the summary table names every row
    startup = data["startup"]
    assert startup["status"] == "ok" and startup["construct_s"]["median"] > 0
    assert startup["bytes_per_transition"] > 0
    assert {t["name"] for t in data["targets"]} == {
        "rl_serial / gym_sync",
        "rl_batcher / gym_sync",
        "rl_batcher / gym_async",
        "rl_batcher / torchrl",
    }
    for t in data["targets"]:
        assert t["verdict"] in ("PASS", "MISS") or t["verdict"].startswith("n/a"), t
    assert "PASS" in res.stdout or "MISS" in res.stdout
    costs = {c["name"]: c for c in data["check_costs"]}  # the observation check, on vs off
    assert set(costs) == {"rl_serial / rl_serial_nocheck", "rl_batcher / rl_batcher_nocheck"}
    for c in costs.values():
        assert c["ratio"] > 0 and c["paired_min"] <= c["paired_max"], c
        assert c["verdict"] in ("negligible", "above the bar"), c
    assert "observation check cost" in res.stdout
