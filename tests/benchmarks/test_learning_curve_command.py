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


@pytest.mark.slow  # a training run and a subprocess
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


def _fake_run(folder: Path, returns: list[float]) -> Path:
    folder.mkdir()
    rows = ["frames,wall_time,train_return_mean20"]
    rows += [f"{1000 * (i + 1)},{2.0 * (i + 1)},{r}" for i, r in enumerate(returns)]
    (folder / "progress.csv").write_text("\n".join(rows) + "\n")
    return folder


@pytest.mark.timeout(60)
def test_one_label_per_run_names_the_curves_and_a_miscount_is_refused(tmp_path: Path) -> None:
    runs = [str(_fake_run(tmp_path / f"run{i}", [-21.0, -5.0 + i, 10.0 + i])) for i in range(2)]
    script = str(ROOT / "benchmarks" / "learning_curve.py")
    out = tmp_path / "seeds.png"
    ok = subprocess.run([sys.executable, script, *runs, "--out", str(out), "--label", "seed 0",
                         "--label", "seed 1"], capture_output=True, text=True, timeout=50)
    assert ok.returncode == 0, ok.stderr
    assert out.stat().st_size > 10_000
    bad = subprocess.run([sys.executable, script, *runs, "--out", str(tmp_path / "x.png"),
                          "--label", "seed 0"], capture_output=True, text=True, timeout=50)
    assert bad.returncode == 2 and "--label given 1 times for 2 runs" in bad.stderr, bad.stderr
    assert not (tmp_path / "x.png").exists()
