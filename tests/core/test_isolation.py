"""The leak reaper of conftest.py: a test that leaves a process behind fails, alone."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_leaking_test_fails_and_the_next_one_passes(tmp_path):
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    shutil.copytree(REPO / "tests" / "support", tmp_path / "support")  # conftest's imports
    (tmp_path / "test_leak.py").write_text(
        textwrap.dedent(
            """
            import subprocess

            def test_leaks():
                subprocess.Popen(["sleep", "60"])

            def test_after_it():
                pass
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    out = done.stdout
    # Both tests pass; the leaking one also gets an error at teardown, the next one does not.
    assert "2 passed, 1 error" in out, out
    assert "ERROR at teardown of test_leaks" in out and "left processes behind" in out
    assert "test_after_it" not in out.split("short test summary")[-1]
