"""benchmarks/learning_curve.py as docs/guide-atari.md writes it (the command read from the page),
on a run trained here in place of the Pong run: it writes the figure."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # a training run and a subprocess


@pytest.mark.timeout(120)
def test_the_guides_learning_curve_command_writes_the_figure(tmp_path: Path) -> None:
    from rlstruct.algos import ppo
    from rlstruct.runs.layout import LayoutConfig

    text = " ".join((ROOT / "docs" / "guide-atari.md").read_text().split())
    (command,) = re.findall(r"`(python benchmarks/learning_curve\.py [^`]+)`", text)
    summary = ppo.main(ppo.Config(max_frames=2048, target_return=None, runs_dir=str(tmp_path),
                                  layout=LayoutConfig(n_processes=1, n_envs=8)))
    args = shlex.split(command)[2:]
    runs = args.index("--out")  # the run folders come first: placeholders such as RUN_DIR
    assert runs >= 1 and all(re.fullmatch(r"[A-Z_]+", a) for a in args[:runs]), args
    args[:runs] = [summary["run_dir"]] * runs
    out = tmp_path / "curve.png"
    args[args.index("--out") + 1] = str(out)
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learning_curve.py"), *args],
                         capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert out.stat().st_size > 10_000 and f"wrote {out}" in res.stdout
