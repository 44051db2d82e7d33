"""Running an algorithm the way a user does, and checking the run directory it writes.

- :func:`run_algo`: ``python -m rlstruct.algos.<name> [args]`` in a subprocess started in a
  temporary folder (the installed package must be found from anywhere, not from the checkout);
  returns the run directory it printed and its stdout.
- :func:`check_run_dir`: asserts that a run directory holds parseable outputs that agree with
  each other (config.json, progress.csv, episodes.csv, returns.png, checkpoints/latest.pt).
"""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def run_algo(name: str, args: list[str], cwd: Path, timeout: float = 150.0) -> tuple[Path, str]:
    """Runs ``python -m rlstruct.algos.<name> *args`` in ``cwd``.

    Returns:
        ``(run_dir, stdout)``; fails the test with the output if the exit code is not 0.
    """
    done = subprocess.run(
        [sys.executable, "-m", f"rlstruct.algos.{name}", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"exit code {done.returncode}\n{done.stdout}\n{done.stderr}"
    found = re.search(r"^outputs in (.+)$", done.stdout, re.M)
    assert found, f"the run did not print its run directory:\n{done.stdout}"
    return (cwd / found.group(1)).resolve(), done.stdout


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def check_run_dir(run_dir: Path, window: int = 20) -> list[dict[str, str]]:
    """Asserts that ``run_dir`` holds config.json (the whole config, nested layout included),
    progress.csv (>= 1 row), episodes.csv, returns.png and a loadable checkpoints/latest.pt,
    and that progress.csv's last ``train_return_mean<window>`` is the mean of the last
    ``window`` returns of episodes.csv; returns the progress rows."""
    meta = json.loads((run_dir / "config.json").read_text())
    config = meta["config"]
    assert config["seed"] == 0 and config["target_window"] == window
    assert {"learner_device", "n_processes", "n_envs"} <= set(config["layout"])
    rows = read_rows(run_dir / "progress.csv")
    assert rows and int(rows[-1]["frames"]) > 0
    column = f"train_return_mean{window}"
    assert column in rows[-1] and "train_return" not in rows[-1]
    returns = [float(r["return"]) for r in read_rows(run_dir / "episodes.csv")]
    if returns:
        last = returns[-window:]
        assert float(rows[-1][column]) == pytest.approx(sum(last) / len(last))
    else:
        assert math.isnan(float(rows[-1][column]))
    assert (run_dir / "returns.png").stat().st_size > 0
    checkpoint = torch.load(run_dir / "checkpoints" / "latest.pt", map_location="cpu")
    assert checkpoint["model"] and checkpoint["frames"] == int(rows[-1]["frames"])
    assert checkpoint["config"] == config
    return rows


def evaluated_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The progress rows on which an evaluation finished (eval_return is not nan)."""
    return [r for r in rows if r.get("eval_return", "nan") not in ("", "nan")]

