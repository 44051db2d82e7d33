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
def test_readme_example_runs(tmp_path):
    code = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)[0]
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    done = run(script)
    assert done.returncode == 0, done.stderr
    assert "torch.Size([8, 16])" in done.stdout
    assert "same batch: True" in done.stdout  # the README's claim, as written
