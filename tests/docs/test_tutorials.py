"""Every tutorial and the README's examples run to completion (each in a few seconds on a CPU):
the twenty lines, the training loop with ``Run`` and the three lines of ``load_policy``."""

from __future__ import annotations

import json
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


def readme_block(containing: str) -> str:
    """The README's one Python code block that contains ``containing``."""
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(),
                                     re.S) if containing in b]
    return code


@pytest.mark.timeout(150)
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


@pytest.mark.timeout(150)
def test_readme_training_loop_runs_with_a_small_budget(tmp_path):
    """The README's own training loop with ``Run``, as written, imported as a module (its
    ``__main__`` part left out) and its ``main`` called with a budget of 2,048 frames: the run
    stops on the frame budget, and its folder holds the config, progress rows (at most one a
    second) and a checkpoint."""
    code = readme_block("run.segments(batcher)")
    for call in ("Run(", "run.training_batcher(", "run.publish(", "run.end_iteration("):
        assert call in code, f"the README's loop no longer calls {call}...)"
    (tmp_path / "readme_loop.py").write_text(code)
    runs = tmp_path / "runs"
    check = (
        "import json, pathlib, readme_loop\n"
        "from rlstruct.runs.run import RunConfig\n"
        f"cfg = RunConfig(max_frames=2048, target_return=None, runs_dir={str(runs)!r})\n"
        "summary = readme_loop.main(cfg)\n"
        "run_dir = pathlib.Path(summary['run_dir'])\n"
        "rows = (run_dir / 'progress.csv').read_text().splitlines()[1:]\n"
        "print(json.dumps({'stopped_by': summary['stopped_by'], 'frames': summary['frames'],\n"
        "                  'rows': len(rows), 'config': (run_dir / 'config.json').is_file(),\n"
        "                  'checkpoint': (run_dir / 'checkpoints' / 'latest.pt').is_file()}))\n"
    )
    done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["stopped_by"] == "max_frames" and result["frames"] >= 2048, result
    assert result["rows"] >= 2 and result["config"] and result["checkpoint"], result
