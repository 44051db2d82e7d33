"""Smoke run of benchmarks/learning.py: it runs one rlstruct PPO seed and writes the row as JSON.

No timing is asserted here (BENCHMARKS.md: targets live in the benchmark output, never in tests);
``--quick`` only checks the plumbing (subprocess per run, summary parsing, table, JSON).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.slow  # worker processes or subprocesses throughout


@pytest.mark.timeout(300)
def test_learning_benchmark_quick(tmp_path: Path) -> None:
    if not (ROOT / "rlstruct" / "algos" / "ppo.py").exists():
        pytest.skip("rlstruct/algos/ppo.py does not exist yet")
    out = tmp_path / "learning.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "--quick", "--algos", "ppo",
         "--no-peers", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    rows = {r["key"]: r for r in data["rows"]}
    assert set(rows) == {"rlstruct/ppo"}  # --no-peers: no SB3 row
    row = rows["rlstruct/ppo"]
    assert len(row["runs"]) == 1  # --quick: one seed
    run = row["runs"][0]
    # The runner reached rlstruct.algos.ppo.main() and read its summary (an error here is a
    # plumbing bug
    # of the benchmark or a broken rlstruct/algos/ppo.py: the traceback says which).
    assert row["status"] == "ok", (run.get("error"), run.get("traceback"))
    assert run["seed"] == 0 and run["launch_to_exit"] > 0 and run["frames"] > 0
    assert isinstance(run["solved"], bool)
    assert (run["launch_to_solve"] is None) == (not run["solved"])
    assert row["label"] in res.stdout  # the summary table names the row
    assert data["loadavg_1m"]["n_samples"] >= 1
    assert [t["name"] for t in data["targets"]] == ["rlstruct PPO / SB3 PPO"]
    assert data["targets"][0]["verdict"].startswith(("PASS", "MISS", "n/a"))
