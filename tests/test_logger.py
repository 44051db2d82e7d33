"""rlstruct.logger: the run directory, its files, checkpoints, plots and the plot CLI."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import rlstruct.logger as logger_module
from rlstruct.__main__ import main as cli_main
from rlstruct.cli import arg
from rlstruct.errors import ShapeError
from rlstruct.logger import RunLogger, git_commit, plot_runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Cfg:
    """A tiny config."""

    lr: float = arg(3e-4, "learning rate")
    hidden: tuple[int, ...] = arg((64, 64), "sizes")
    root: Path = arg(Path("runs"), "root")


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _outside_any_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in tmp_path and keep git from finding a repository above it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))


def make(tmp_path: Path, **kw: Any) -> RunLogger:
    kw.setdefault("progress", False)
    return RunLogger("ppo", "ALE/Pong-v5", Cfg(), tmp_path / "runs", **kw)


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


# ------------------------------------------------------------------ directory and config.json


def test_run_directory_name(tmp_path: Path) -> None:
    with make(tmp_path) as run:
        assert run.dir.parent == tmp_path / "runs" and run.dir.is_dir()
        assert re.fullmatch(r"ppo_ALE-Pong-v5_\d{8}-\d{6}", run.dir.name)


def test_same_second_gets_a_suffix(tmp_path: Path) -> None:
    import datetime

    when = datetime.datetime(2024, 5, 6, 7, 8, 9)
    names = [logger_module._make_run_dir(tmp_path, "a2c_env", when).name for _ in range(3)]
    assert names == ["a2c_env_20240506-070809", "a2c_env_20240506-070809-1",
                     "a2c_env_20240506-070809-2"]
    runs = [make(tmp_path) for _ in range(3)]
    assert len({r.dir for r in runs}) == 3
    for r in runs:
        r.close()


def test_sanitise() -> None:
    assert logger_module._sanitise("ALE/Pong-v5") == "ALE-Pong-v5"
    assert logger_module._sanitise("my env: v1!") == "my-env-v1"
    assert logger_module._sanitise("//") == "run"


def test_config_json(tmp_path: Path) -> None:
    with make(tmp_path) as run:
        meta = json.loads((run.dir / "config.json").read_text())
    assert meta["algo"] == "ppo" and meta["env"] == "ALE/Pong-v5"
    assert meta["config"] == {"lr": 3e-4, "hidden": [64, 64], "root": "runs"}
    assert meta["python"] == platform.python_version() and meta["torch"] == torch.__version__
    assert meta["git_commit"] == "unknown"  # tmp_path is no repository
    assert meta["start_time"][:4].isdigit()


def test_config_may_be_a_dict_or_none(tmp_path: Path) -> None:
    with RunLogger("dqn", "CartPole-v1", {"eps": 0.1}, tmp_path, progress=False) as run:
        assert json.loads((run.dir / "config.json").read_text())["config"] == {"eps": 0.1}
    with RunLogger("dqn", "CartPole-v1", None, tmp_path, progress=False) as run:
        assert json.loads((run.dir / "config.json").read_text())["config"] == {}


def fake_git(
    monkeypatch: pytest.MonkeyPatch, head: tuple[int, str], status: str = ""
) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append({"cmd": cmd, **kw})
        if cmd[1] == "rev-parse":
            return subprocess.CompletedProcess(cmd, head[0], head[1], "")
        return subprocess.CompletedProcess(cmd, 0, status, "")

    monkeypatch.setattr(logger_module.subprocess, "run", run)
    return calls


def test_git_commit_clean_and_dirty(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_git(monkeypatch, (0, "abc123\n"))
    assert git_commit() == "abc123"
    assert calls[0]["cmd"] == ["git", "rev-parse", "HEAD"] and calls[0]["timeout"] <= 10
    assert calls[1]["cmd"] == ["git", "status", "--porcelain"] and calls[0]["cwd"] is None
    fake_git(monkeypatch, (0, "abc123\n"), status=" M rlstruct/logger.py\n")
    assert git_commit() == "abc123-dirty"


def test_git_commit_unknown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_git(monkeypatch, (128, ""))
    assert git_commit() == "unknown"

    def missing(cmd: list[str], **kw: Any) -> None:
        raise FileNotFoundError("git")

    def slow(cmd: list[str], **kw: Any) -> None:
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    for broken in (missing, slow):
        monkeypatch.setattr(logger_module.subprocess, "run", broken)
        assert git_commit() == "unknown"
    fake_git(monkeypatch, (0, "feed\n"), status="?? new.py\n")
    with make(tmp_path) as run:
        assert json.loads((run.dir / "config.json").read_text())["git_commit"] == "feed-dirty"


# ------------------------------------------------------------------ episodes and train_return


def test_record_episodes_and_train_return(tmp_path: Path) -> None:
    with make(tmp_path, window=3) as run:
        assert math.isnan(run.train_return())
        run.record_episodes(torch.tensor([1.0, 2.0], requires_grad=True) * 1, [5, 6])
        run.log(frames=100)
        run.record_episodes([3.0, 4.0])
        run.record_episodes(torch.tensor(10.0), frames=150)  # 0-d tensor, explicit frames
        run.record_episodes(np.array([], dtype=np.float32))  # nothing finished
        assert run.episodes == 5
        assert run.train_return() == pytest.approx((3 + 4 + 10) / 3)  # window=3
        assert run.train_return(last=5) == pytest.approx(4.0)
        assert run.train_return(last=100) == pytest.approx(4.0)
        with pytest.raises(ValueError, match="last must be >= 1"):
            run.train_return(last=0)
        _, rows = read_csv(run.dir / "episodes.csv")  # readable while the run goes on
    assert [(r["frames_at_record"], float(r["return"]), r["length"]) for r in rows] == [
        ("0", 1.0, "5"), ("0", 2.0, "6"), ("100", 3.0, ""), ("100", 4.0, ""), ("150", 10.0, "")
    ]


def test_lengths_must_match_returns(tmp_path: Path) -> None:
    with make(tmp_path) as run, pytest.raises(ShapeError, match="2 returns but 1 lengths"):
        run.record_episodes([1.0, 2.0], lengths=[3])


def test_window_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="window"):
        make(tmp_path, window=0)


# ------------------------------------------------------------------ progress.csv


def test_log_rows(tmp_path: Path) -> None:
    with make(tmp_path) as run:
        run.record_episodes([1.0, 3.0])
        first = run.log(frames=1000, loss=torch.tensor(0.25), entropy=1.5, updates=2, done=True)
        time.sleep(0.02)
        second = run.log(frames=3000, loss=0.125, entropy=1.0, updates=4, done=False)
        header, rows = read_csv(run.dir / "progress.csv")  # flushed before close
    assert list(first) == ["frames", "episodes", "wall_time", "steps_per_s", "train_return",
                           "loss", "entropy", "updates", "done"]
    assert header == list(first)
    assert first["loss"] == 0.25 and isinstance(first["loss"], float) and first["done"] == 1
    assert first["episodes"] == 2 and first["train_return"] == 2.0
    dt = second["wall_time"] - first["wall_time"]
    assert dt > 0 and second["steps_per_s"] == pytest.approx(2000 / dt, rel=1e-6)
    assert first["steps_per_s"] == pytest.approx(1000 / first["wall_time"], rel=1e-6)
    assert [int(r["frames"]) for r in rows] == [1000, 3000]
    assert [float(r["loss"]) for r in rows] == [0.25, 0.125]
    assert float(rows[1]["steps_per_s"]) == pytest.approx(second["steps_per_s"])


def test_new_metric_rewrites_header_with_union(tmp_path: Path) -> None:
    with make(tmp_path) as run:
        run.log(frames=10, loss=1.0)
        run.log(frames=20, loss=0.5, eval_return=7.0)
        run.log(frames=30, loss=0.25)
        header_open, _ = read_csv(run.dir / "progress.csv")
    header, rows = read_csv(run.dir / "progress.csv")
    assert header == header_open
    assert header[-2:] == ["loss", "eval_return"]
    assert [r["eval_return"] for r in rows] == ["", "7.0", ""]
    assert [r["loss"] for r in rows] == ["1.0", "0.5", "0.25"]
    assert not (run.dir / "progress.csv.tmp").exists()


@pytest.mark.parametrize(
    ("metrics", "message"),
    [({"episodes": 1.0}, "reserved"), ({"train_return": 1.0}, "reserved"),
     ({"loss": torch.ones(2)}, "2 elements"), ({"loss": "high"}, "must be a number")],
)
def test_bad_metrics(tmp_path: Path, metrics: dict[str, Any], message: str) -> None:
    with make(tmp_path) as run, pytest.raises(ValueError, match=message):
        run.log(frames=1, **metrics)


# ------------------------------------------------------------------ checkpoints


def test_checkpoint_latest_and_best_only_on_improvement(tmp_path: Path) -> None:
    def saved(name: str) -> int:
        return torch.load(run.dir / "checkpoints" / name)["step"]

    with make(tmp_path) as run:
        run.checkpoint({"step": 0, "w": torch.ones(2)}, score=math.nan)
        assert torch.equal(torch.load(run.dir / "checkpoints" / "latest.pt")["w"], torch.ones(2))
        assert saved("latest.pt") == 0 and not (run.dir / "checkpoints" / "best.pt").exists()
        run.checkpoint({"step": 1}, score=1.0)
        assert saved("best.pt") == 1 and run.best_score == 1.0
        run.checkpoint({"step": 2}, score=0.5)
        run.checkpoint({"step": 3}, score=1.0)  # a tie is no improvement
        run.checkpoint({"step": 4})
        run.checkpoint({"step": 5}, score=math.nan)
        assert saved("latest.pt") == 5 and saved("best.pt") == 1
        run.checkpoint({"step": 6}, score=torch.tensor(2.0))  # type: ignore[arg-type]
        assert saved("best.pt") == 6 and run.best_score == 2.0
    assert sorted(p.name for p in (run.dir / "checkpoints").iterdir()) == ["best.pt", "latest.pt"]


# ------------------------------------------------------------------ close and interrupts


def test_close_writes_everything_and_is_idempotent(tmp_path: Path) -> None:
    run = make(tmp_path)
    run.record_episodes(torch.arange(150, dtype=torch.float32), torch.full((150,), 10))
    run.log(frames=1500, eval_return=100.0)
    run.close()
    run.close()
    for name in ("config.json", "progress.csv", "episodes.csv"):
        assert (run.dir / name).is_file()
    assert is_png(run.dir / "returns.png")
    with pytest.raises(RuntimeError, match="after close"):
        run.log(frames=1)
    with pytest.raises(RuntimeError, match="after close"):
        run.record_episodes([1.0])
    with pytest.raises(RuntimeError, match="after close"):
        run.checkpoint({})


def test_keyboard_interrupt_keeps_all_files(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), make(tmp_path) as run:
        run.record_episodes([1.0, 2.0], [3, 4])
        run.log(frames=64, loss=0.1)
        run.checkpoint({"step": 1}, score=1.5)
        raise KeyboardInterrupt
    assert run._closed
    assert json.loads((run.dir / "config.json").read_text())["algo"] == "ppo"
    assert len(read_csv(run.dir / "progress.csv")[1]) == 1
    assert len(read_csv(run.dir / "episodes.csv")[1]) == 2
    assert torch.load(run.dir / "checkpoints" / "best.pt") == {"step": 1}
    assert is_png(run.dir / "returns.png")


def test_other_exceptions_propagate_after_closing(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), make(tmp_path) as run:
        1 / 0  # noqa: B018
    assert run._closed and is_png(run.dir / "returns.png")


def test_without_matplotlib_warns_and_skips_the_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    run = make(tmp_path)
    run.log(frames=1)
    with pytest.warns(UserWarning, match="matplotlib is not installed"):
        run.close()
    assert not (run.dir / "returns.png").exists() and (run.dir / "progress.csv").is_file()
    with pytest.raises(ImportError, match="rlstruct\\[plot\\]"):
        plot_runs([run.dir], tmp_path / "x.png")


def test_without_tensorboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with make(tmp_path) as run:
        run.log(frames=1, loss=1.0)
    assert not list(run.dir.glob("events.out.tfevents*"))


def test_tensorboard_disabled(tmp_path: Path) -> None:
    with make(tmp_path, tensorboard=False) as run:
        run.log(frames=1, loss=1.0)
    assert not list(run.dir.glob("events.out.tfevents*"))


def test_tensorboard_events(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    with make(tmp_path) as run:
        run.log(frames=1, loss=1.0)
    assert list(run.dir.glob("events.out.tfevents*"))


# ------------------------------------------------------------------ progress line


def test_progress_line_on_a_tty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    run = make(tmp_path, progress=True, total_frames=10_000)
    run.record_episodes([5.0])
    run.log(frames=2500)
    first = tty.getvalue()
    assert first.startswith("\r") and "\n" not in first
    assert "2,500/10,000 frames (25%)" in first and "steps/s" in first and "train 5.00" in first
    for i in range(50):  # throttled: none of these renders (well under 0.25 s)
        run.log(frames=2600 + i, eval_return=7.0 if i < 49 else math.nan)  # nan: not evaluated
    assert tty.getvalue() == first
    run.close()
    out = tty.getvalue()
    assert out.count("\r") == 2 and out.endswith("\n") and "eval 7.00" in out
    run.close()
    assert tty.getvalue() == out


def test_progress_line_is_rewritten_after_the_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    with make(tmp_path, progress=True) as run:
        run.log(frames=1)
        time.sleep(0.3)
        run.log(frames=2)
        assert tty.getvalue().count("\r") == 2 and "frames" in tty.getvalue()


@pytest.mark.parametrize("progress", [True, False])
def test_no_progress_line_off_a_tty_or_when_disabled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, progress: bool
) -> None:
    stream = FakeTTY() if not progress else io.StringIO()  # a TTY only when disabled
    monkeypatch.setattr(sys, "stderr", stream)
    with make(tmp_path, progress=progress) as run:
        run.record_episodes([1.0])
        run.log(frames=10)
    assert stream.getvalue() == ""


# ------------------------------------------------------------------ plots


def fill(run: RunLogger, n: int, offset: float = 0.0) -> None:
    for i in range(n):
        run.record_episodes([offset + i], [i + 1])
        run.log(frames=(i + 1) * 10, eval_return=offset + 2 * i if i % 5 == 0 else math.nan)


def test_plot_runs_several(tmp_path: Path) -> None:
    runs = []
    for offset in (0.0, 50.0):
        with make(tmp_path) as run:
            fill(run, 30, offset)
        runs.append(run.dir)
    with make(tmp_path) as empty:
        pass
    out = plot_runs([*runs, empty.dir], tmp_path / "plots" / "cmp.png")
    assert out == tmp_path / "plots" / "cmp.png" and is_png(out)
    assert is_png(empty.dir / "returns.png")  # "no episodes recorded" still makes a figure
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        plot_runs([tmp_path / "nope"], tmp_path / "x.png")


def test_plot_falls_back_to_train_return(tmp_path: Path) -> None:
    run_dir = tmp_path / "handmade"
    run_dir.mkdir()
    (run_dir / "progress.csv").write_text("frames,train_return\n10,1.0\n20,nan\n30,\n")
    assert is_png(plot_runs([run_dir], run_dir / "returns.png"))


def test_moving_average_known_answer() -> None:
    got = logger_module._moving_average(np.array([1.0, 2.0, 3.0, 4.0]), 2)
    np.testing.assert_allclose(got, [1.0, 1.5, 2.5, 3.5])
    assert len(logger_module._moving_average(np.array([]), 100)) == 0


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "rlstruct", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_plot_cli_subprocess(tmp_path: Path) -> None:
    """``python -m rlstruct plot`` end to end (two launches: each imports torch, ~2 s)."""
    dirs = []
    for offset in (0.0, 10.0):
        with make(tmp_path) as run:
            fill(run, 12, offset)
        (run.dir / "returns.png").unlink()
        dirs.append(run.dir)

    single = run_cli("plot", str(dirs[0]), cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    assert is_png(dirs[0] / "returns.png") and str(dirs[0] / "returns.png") in single.stdout

    several = run_cli("plot", *map(str, dirs), cwd=tmp_path)
    assert several.returncode == 0, several.stderr
    assert is_png(tmp_path / "compare.png")



def test_cli_main_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main([])
    assert info.value.code == 2
    with make(tmp_path) as run:
        fill(run, 3)
    assert cli_main(["plot", str(run.dir), str(run.dir), "-o", "out/p.png"]) == 0
    assert is_png(tmp_path / "out" / "p.png")
    with pytest.raises(SystemExit) as info:
        cli_main(["plot", str(tmp_path / "missing")])
    assert info.value.code == 2 and "not a directory" in capsys.readouterr().err
    (tmp_path / "not_a_run").mkdir()
    assert cli_main(["plot", str(tmp_path / "not_a_run")]) == 1
    assert "not a run directory" in capsys.readouterr().err
