"""Helpers shared by the tests of algos/reinforce.py and algos/dqn.py.

- :func:`run_algo`: runs ``python -m algos.<name> [args]`` from the repository root in a
  subprocess and returns the run directory it printed.
- :func:`check_run_dir`: asserts that a run directory holds parseable outputs.
- :func:`steps`: a hand-built TemporalDictTensor with the trajectory keys the losses read.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import torch

from rlstruct import TemporalDictTensor

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `import algos` also under a bare `pytest` (not `python -m`)
    sys.path.insert(0, str(REPO))


def run_algo(name: str, args: list[str], timeout: float = 120.0) -> tuple[Path, str]:
    """Runs ``python -m algos.<name> *args`` in the repository root.

    Returns:
        ``(run_dir, stdout)``; fails the test with the output if the exit code is not 0.
    """
    done = subprocess.run(
        [sys.executable, "-m", f"algos.{name}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"exit code {done.returncode}\n{done.stdout}\n{done.stderr}"
    found = re.search(r"^outputs in (.+)$", done.stdout, re.M)
    assert found, f"the run did not print its run directory:\n{done.stdout}"
    return Path(found.group(1)), done.stdout


def check_run_dir(run_dir: Path) -> list[dict[str, str]]:
    """Asserts that ``run_dir`` holds config.json, progress.csv (>= 1 row), returns.png and a
    loadable checkpoints/latest.pt; returns the progress rows."""
    meta = json.loads((run_dir / "config.json").read_text())
    assert "config" in meta and meta["config"]["seed"] == 0
    with open(run_dir / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and int(rows[-1]["frames"]) > 0
    assert (run_dir / "returns.png").stat().st_size > 0
    checkpoint = torch.load(run_dir / "checkpoints" / "latest.pt", map_location="cpu")
    assert checkpoint["model"] and checkpoint["frames"] > 0
    return rows


def steps(lengths: list[int], **tensors: torch.Tensor) -> TemporalDictTensor:
    """A TemporalDictTensor of ``tensors`` (each ``(B, T, ...)``) with ``lengths``; the short
    names ``reward``, ``terminated``, ``truncated``, ``done``, ``frame``, ``next_frame`` and
    ``action`` become the full trajectory keys."""
    full = {
        "reward": "_observation/reward",
        "terminated": "_observation/terminated",
        "truncated": "_observation/truncated",
        "done": "_observation/done",
        "frame": "observation/frame",
        "next_frame": "_observation/frame",
        "action": "action/action",
    }
    return TemporalDictTensor(
        {full.get(k, k): v for k, v in tensors.items()}, torch.tensor(lengths)
    )
