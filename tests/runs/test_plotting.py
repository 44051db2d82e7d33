"""rlstruct.runs.plotting and ``python -m rlstruct plot``: what the curves show, and folders of
runs."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlstruct.__main__ import main as cli_main
from rlstruct.errors import RunFileError
from rlstruct.runs.folder import read_rows
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


def _session(out: Path, trial: int, seed: int, lr: float) -> Path:
    """A sweep session's run folder, as ``rlstruct sweep`` lays it out: ``trialT/sessionS/RUN``
    (the run folders of a sweep's sessions may share their name)."""
    config = {"env_id": "CartPole-v1", "seed": seed, "lr": lr,
              "runs_dir": str(out / f"trial{trial}" / f"session{seed}")}
    with RunLogger("ppo", "CartPole-v1", config, config["runs_dir"], progress=False, window=2,
                   tensorboard=False) as run:
        for i in range(4):
            run.record_episodes([float(i + seed)], [i + 1], frames=(i + 1) * 10)
            run.log(frames=(i + 1) * 10)
    return run.dir


def test_a_sweep_folder_plots_every_session_each_labelled_apart(tmp_path, capsys):
    """Issue 38: `rlstruct plot SWEEP_DIR` refused the sweep's folder, and two sessions of a
    trial got the same legend entry (the seed was not in it)."""
    out = tmp_path / "sweep"
    runs = [_session(out, t, s, lr) for t, lr in ((0, 0.001), (1, 0.01)) for s in (0, 1)]
    (out / "trial0.png").write_bytes(b"")  # the sweep's own files beside the sessions
    assert find_runs([out]) == sorted(runs)
    assert cli_main(["plot", str(out)]) == 0 and is_png(out / "compare.png")
    labels = select_runs([out]).labels
    assert len(set(labels.values())) == 4, labels
    assert all(f"seed {s}" in labels[r] for r, s in zip(runs, (0, 1, 0, 1)))
    assert "lr=0.001" in labels[runs[0]] and "lr=0.01" in labels[runs[2]]
    if runs[0].name == runs[1].name:  # started in the same second: the path tells them apart
        assert labels[runs[0]].startswith(f"trial0/session0/{runs[0].name} ")
    capsys.readouterr()


def test_plots_against_the_wall_time(tmp_path):
    run = write_run(tmp_path, 6)
    curves = run_curves(run, x="wall_time")
    clock = [float(r["wall_time"]) for r in read_rows(run / "progress.csv")]
    assert [x for x, _ in curves["train_return_mean4"]] == clock
    assert all(clock[0] <= x <= clock[-1] for x, _ in curves["episode_return"])
    from rlstruct.runs.plotting import runs_figure

    fig, _ = runs_figure([run], x="wall_time")
    assert fig.axes[0].get_xlabel() == "wall time (s)"
    assert cli_main(["plot", str(run), "--x", "wall_time", "-o", "w.png"]) == 0
    assert is_png(tmp_path / "w.png")


def test_plot_errors_name_the_file_not_a_traceback(tmp_path, capsys):
    """Issue 38 (item 14): a progress.csv that is not UTF-8, and a plot that cannot be written
    (a read-only folder, a file where a folder should be), are typed errors naming the file."""
    run = write_run(tmp_path / "runs", 4)
    progress = run / "progress.csv"
    progress.write_bytes(progress.read_bytes() + "\n40,\xe9t\xe9\n".encode("latin-1"))
    with pytest.raises(RunFileError, match="not a CSV file of UTF-8 text"):
        plot_runs([run], tmp_path / "x.png")
    assert cli_main(["plot", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"rlstruct plot: error: {progress} is not a CSV file of UTF-8" in err, err
    assert "Traceback" not in err
    fine = write_run(tmp_path / "more", 4)
    (tmp_path / "afile").write_text("")
    assert cli_main(["plot", str(fine), "-o", str(tmp_path / "afile" / "p.png")]) == 1
    assert f"cannot write the plot {tmp_path / 'afile' / 'p.png'}" in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes into read-only folders
        fine.chmod(0o555)
        try:
            assert cli_main(["plot", str(fine)]) == 1
            assert f"cannot write the plot {fine / 'returns.png'}" in capsys.readouterr().err
        finally:
            fine.chmod(0o755)
