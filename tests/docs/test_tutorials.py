"""Every tutorial and the README's example run to completion (each in a few seconds on a CPU)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((REPO / "tutorials").glob("[0-9][0-9]_*.py"))


pytestmark = pytest.mark.slow  # worker processes or subprocesses throughout


def run(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(path)], cwd=REPO, capture_output=True, text=True, timeout=120
    )


@pytest.mark.timeout(150)
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path):
    done = run(path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


@pytest.mark.timeout(150)
def readme_block(containing: str) -> str:
    """The README's one Python code block that contains ``containing``."""
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(),
                                     re.S) if containing in b]
    return code


def test_readme_example_runs(tmp_path):
    code = readme_block("SerialBatcher")
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    done = run(script)
    assert done.returncode == 0, done.stderr
    assert "torch.Size([8, 16])" in done.stdout
    assert "same batch: True" in done.stdout  # the README's claim, as written


@pytest.mark.timeout(150)
def test_readme_policy_lines_run_on_a_trained_run(tmp_path):
    """The README's three lines of rlstruct.load_policy, on a run trained here (its folder in
    place of the README's example folder) and an observation of CartPole."""
    from rlstruct.algos import ppo
    from rlstruct.runs.layout import LayoutConfig

    summary = ppo.main(ppo.Config(max_frames=512, target_return=None, runs_dir=str(tmp_path),
                                  layout=LayoutConfig(n_processes=1, n_envs=4)))
    code = readme_block("load_policy")
    example = re.search(r'load_policy\("([^"]+)"\)', code).group(1)
    script = tmp_path / "readme_policy.py"
    script.write_text('import gymnasium\nobs, _ = gymnasium.make("CartPole-v1").reset(seed=0)\n'
                      + code.replace(example, summary["run_dir"]) + "\nprint('action', action)\n")
    done = run(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] in (["action", "0"], ["action", "1"])
