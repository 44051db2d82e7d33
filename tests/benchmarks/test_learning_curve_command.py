"""benchmarks/learning_curve.py as the docs write it (every command read from its page: the Pong
figure of docs/guide-atari.md, the seeds' figures of docs/results.md, SAC's Hopper figure of
docs/algorithms.md), on a run trained here in place of the long runs: it writes the figure; and
its ``--label`` option."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "learning_curve.py"
PAGES = ("guide-atari.md", "results.md", "algorithms.md")  # the pages whose figures it draws


def doc_commands(page: str) -> list[str]:
    """The ``python benchmarks/learning_curve.py ...`` spans of a docs page (lines joined)."""
    text = " ".join((ROOT / "docs" / page).read_text().split())
    return re.findall(r"`(python benchmarks/learning_curve\.py [^`]+)`", text)


@pytest.mark.slow  # a training run and a subprocess per command
@pytest.mark.timeout(180)
def test_the_docs_learning_curve_commands_write_their_figures(tmp_path: Path) -> None:
    from rlstruct.algos import ppo
    from rlstruct.runs.layout import LayoutConfig

    commands = {page: doc_commands(page) for page in PAGES}
    assert all(len(found) >= 1 for found in commands.values()), commands
    summary = ppo.main(ppo.Config(max_frames=2048, target_return=None, runs_dir=str(tmp_path),
                                  layout=LayoutConfig(n_processes=1, n_envs=8)))
    for k, (page, command) in enumerate((p, c) for p, found in commands.items() for c in found):
        args = shlex.split(command)[2:]
        # the run folders come first, before any option: placeholders such as RUN_DIR
        runs = next(i for i, a in enumerate(args) if a.startswith("--"))
        assert runs >= 1 and all(re.fullmatch(r"[A-Z_][A-Z0-9_]*", a) for a in args[:runs]), args
        args[:runs] = [summary["run_dir"]] * runs
        out = tmp_path / f"{page}-{k}.png"
        args[args.index("--out") + 1] = str(out)
        res = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                             text=True, timeout=100, cwd=ROOT)
        assert res.returncode == 0, f"{page}: {res.stderr}"
        assert out.stat().st_size > 10_000 and f"wrote {out}" in res.stdout, page


def _fake_run(folder: Path, returns: list[float]) -> Path:
    folder.mkdir()
    rows = ["frames,wall_time,train_return_mean20"]
    rows += [f"{1000 * (i + 1)},{2.0 * (i + 1)},{r}" for i, r in enumerate(returns)]
    (folder / "progress.csv").write_text("\n".join(rows) + "\n")
    return folder


@pytest.mark.timeout(60)
def test_one_label_per_run_names_the_curves_and_a_miscount_is_refused(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("learning_curve", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runs = [_fake_run(tmp_path / f"run{i}", [-21.0, -5.0 + i, 10.0 + i]) for i in range(2)]
    fig = module.draw(runs, ["seed 0", "seed 1"], [], "18@1500000", None)
    by_steps, by_time = (ax.get_legend().get_texts() for ax in fig.axes)
    assert [t.get_text() for t in by_time] == ["seed 0", "seed 1"]
    assert [t.get_text() for t in by_steps][:2] == ["seed 0 (train_return_mean20)",
                                                    "seed 1 (train_return_mean20)"]
    bad = subprocess.run([sys.executable, str(SCRIPT), *map(str, runs), "--out",
                          str(tmp_path / "x.png"), "--label", "seed 0"],
                         capture_output=True, text=True, timeout=50)
    assert bad.returncode == 2 and "--label given 1 times for 2 runs" in bad.stderr, bad.stderr
    assert not (tmp_path / "x.png").exists()
