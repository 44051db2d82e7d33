"""rlstruct.runs.plotting and ``python -m rlstruct plot``: what the curves show, and folders of
runs."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from rlstruct.__main__ import main as cli_main
from rlstruct.runs.logger import RunLogger
from rlstruct.runs.plotting import find_runs, is_run_dir, plot_runs, run_curves, select_runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


def write_run(root: Path, n: int, offset: float = 0.0, eval_every: int = 5) -> Path:
    """A run of ``n`` rows, one episode each; an evaluation finishes every ``eval_every`` rows."""
    with RunLogger("ppo", "CartPole-v1", None, root, progress=False, window=4,
                   tensorboard=False) as run:
        for i in range(n):
            run.record_episodes([offset + i], [i + 1], frames=(i + 1) * 10)
            evaluated = i % eval_every == eval_every - 1
            run.log(frames=(i + 1) * 10, eval_return=offset + 100 * i if evaluated else math.nan)
    return run.dir


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_the_curves_are_what_progress_csv_and_episodes_csv_say(tmp_path):
    curves = run_curves(write_run(tmp_path, 12))
    assert set(curves) == {"train_return_mean4", "eval_return", "episode_return"}
    # The stop test's number at every row: the mean of the last 4 episodes.
    assert curves["train_return_mean4"][:3] == [(10.0, 0.0), (20.0, 0.5), (30.0, 1.0)]
    assert curves["train_return_mean4"][-1] == (120.0, (8 + 9 + 10 + 11) / 4)
    # One point per evaluation, at the row where it finished: never repeated on other rows.
    assert curves["eval_return"] == [(50.0, 400.0), (100.0, 900.0)]
    assert curves["episode_return"][:2] == [(10.0, 0.0), (20.0, 1.0)]


def test_runs_written_before_the_column_was_named_still_plot(tmp_path):
    run_dir = tmp_path / "handmade"
    run_dir.mkdir()
    (run_dir / "progress.csv").write_text("frames,train_return\n10,1.0\n20,nan\n30,\n")
    assert run_curves(run_dir)["train_return"] == [(10.0, 1.0)]
    assert is_png(plot_runs([run_dir], run_dir / "returns.png"))


def test_a_folder_of_runs_is_compared_on_one_figure(tmp_path):
    runs = tmp_path / "runs"
    dirs = [write_run(runs, 12, offset) for offset in (0.0, 50.0)]
    (runs / "notes").mkdir()  # not a run: skipped
    assert find_runs([runs]) == sorted(dirs)
    assert find_runs([dirs[1], runs]) == [dirs[1], *sorted(dirs)]
    out = plot_runs([runs], tmp_path / "plots" / "cmp.png")
    assert out == tmp_path / "plots" / "cmp.png" and is_png(out)
    with pytest.raises(FileNotFoundError, match="nor a folder of run directories"):
        find_runs([runs / "notes"])
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        plot_runs([tmp_path / "nope"], tmp_path / "x.png")


def test_an_empty_run_still_makes_a_figure(tmp_path):
    with RunLogger("dqn", "CartPole-v1", None, tmp_path, progress=False) as empty:
        pass
    assert is_run_dir(empty.dir) and is_png(empty.dir / "returns.png")


def test_plot_command_in_process(tmp_path, capsys):
    runs = tmp_path / "runs"
    a, b = write_run(runs, 6), write_run(runs, 6, 10.0)
    (a / "returns.png").unlink()
    assert cli_main(["plot", str(a)]) == 0 and is_png(a / "returns.png")
    assert cli_main(["plot", str(runs)]) == 0 and is_png(runs / "compare.png")
    assert cli_main(["plot", str(a), str(b)]) == 0 and is_png(tmp_path / "compare.png")
    assert cli_main(["plot", str(runs), "-o", "out/p.png"]) == 0
    assert is_png(tmp_path / "out" / "p.png")
    assert capsys.readouterr().out.splitlines()[-1] == "out/p.png"  # the file it wrote
    with pytest.raises(SystemExit) as info:
        cli_main(["plot", str(tmp_path / "missing")])
    assert info.value.code == 2 and "not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli_main(["plot", str(tmp_path / "empty")]) == 1
    assert "nor a folder of run directories" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli_main([])
    assert info.value.code == 2


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_python_m_rlstruct_plot_runs_folder(tmp_path):
    runs = tmp_path / "runs"
    for offset in (0.0, 10.0):
        write_run(runs, 6, offset)
    done = subprocess.run([sys.executable, "-m", "rlstruct", "plot", "runs/"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert is_png(runs / "compare.png") and "compare.png" in done.stdout


def test_runs_without_episodes_are_skipped_and_failures_labelled(tmp_path):
    runs = tmp_path / "runs"
    good = [write_run(runs, 6, offset) for offset in (0.0, 10.0)]
    failed = write_run(runs, 6, 20.0)
    (failed / "summary.json").write_text('{"status": "failed", "frames": 60}')
    solved = write_run(runs, 6, 30.0)
    (solved / "summary.json").write_text('{"status": "solved"}')
    # Runs that died before an episode finished: an empty episodes.csv, or only config.json
    # and a summary (status failed), or a summary.json that is not JSON.
    with RunLogger("ppo", "CartPole-v1", None, runs, progress=False) as early:
        pass
    (early.dir / "summary.json").write_text('{"status": "failed"}')
    bare = runs / "bare"
    bare.mkdir()
    (bare / "config.json").write_text('{"config": {}}')
    (bare / "summary.json").write_text("{not json")
    selection = select_runs([runs])
    assert [r.path for r in selection.drawn] == sorted([*good, failed, solved])
    assert sorted(r.path for r in selection.skipped) == sorted([early.dir, bare])
    assert selection.title == "4 runs (1 failed; 2 skipped: no episodes)"
    labels = {r.path: selection.label(r) for r in selection.drawn}
    assert labels[failed] == f"{failed.name} (failed)" and labels[solved] == solved.name
    assert is_png(plot_runs([runs], tmp_path / "cmp.png"))
    # One run: its own name (and status) is the title, even with nothing to draw.
    assert select_runs([early.dir]).title == f"{early.dir.name} (failed)"
    assert is_png(plot_runs([early.dir], tmp_path / "one.png"))


def test_the_title_counts_what_was_drawn(tmp_path):
    runs = tmp_path / "runs"
    for offset in (0.0, 10.0, 20.0):
        write_run(runs, 4, offset)
    assert select_runs([runs]).title == "3 runs"
    interrupted = write_run(runs, 4, 5.0)
    (interrupted / "summary.json").write_text('{"status": "interrupted"}')
    assert select_runs([runs]).title == "4 runs (1 interrupted)"


def test_a_comparison_gives_each_env_its_axes_and_keeps_legends_off_the_data(tmp_path):
    """Issue 27: compare.png put every env on one axis, and its legend covered the data."""
    for env in ("CartPole-v1", "CartPole-v1", "Pendulum-v1"):
        with RunLogger("ppo", env, {"env_id": env}, tmp_path / "runs", progress=False,
                       tensorboard=False) as run:
            for i in range(5):
                run.record_episodes([float(i)], [i + 1], frames=(i + 1) * 10)
                run.log(frames=(i + 1) * 10, eval_return=math.nan)
    plot_runs([tmp_path / "runs"], tmp_path / "compare.png")
    from rlstruct.runs.plotting import finish_figure, runs_figure

    fig, single = runs_figure([tmp_path / "runs"])
    assert not single and len(fig.axes) == 2  # one axes per env
    assert [ax.get_ylabel() for ax in fig.axes] == ["return (CartPole-v1)", "return (Pendulum-v1)"]
    assert [len(ax.lines) for ax in fig.axes] == [2, 1]
    finish_figure(fig, tmp_path / "again.png", "nothing", outside=True)
    fig.canvas.draw()
    for ax in fig.axes:  # each legend stands right of its axes, over no data
        legend = ax.get_legend().get_window_extent()
        assert legend.x0 >= ax.get_window_extent().x1
    assert (tmp_path / "compare.png").stat().st_size > 0
