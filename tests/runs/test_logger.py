"""rlstruct.runs.logger: the run directory, its files, checkpoints, progress lines, config.json and
the git commit it records (plots: tests/runs/test_plotting.py)."""

from __future__ import annotations

import csv
import enum
import io
import json
import math
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import rlstruct.runs.logger as logger_module
from rlstruct.errors import ShapeError
from rlstruct.runs.config import config_to_dict
from rlstruct.runs.folder import RunFolder
from rlstruct.runs.logger import RunLogger, git_commit, safe_name
from rlstruct.runs.plotting import plot_runs
from rlstruct.runs.progress import ProgressLine

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Cfg:
    """A tiny config."""

    lr: float = 3e-4
    hidden: tuple[int, ...] = (64, 64)
    root: Path = Path("runs")


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
    names = [RunFolder.create(tmp_path, "a2c_env", when).name for _ in range(3)]
    assert names == ["a2c_env_20240506-070809", "a2c_env_20240506-070809-1",
                     "a2c_env_20240506-070809-2"]
    runs = [make(tmp_path) for _ in range(3)]
    assert len({r.dir for r in runs}) == 3
    for r in runs:
        r.close()


def test_sanitise() -> None:
    assert safe_name("ALE/Pong-v5") == "ALE-Pong-v5"
    assert safe_name("my env: v1!") == "my-env-v1"
    assert safe_name("//") == "run"


def test_config_json(tmp_path: Path) -> None:
    with make(tmp_path) as run:
        meta = json.loads((run.dir / "config.json").read_text())
    assert meta["algo"] == "ppo" and meta["env"] == "ALE/Pong-v5"
    assert meta["config"] == {"lr": 3e-4, "hidden": [64, 64], "root": "runs"}
    assert meta["python"] == platform.python_version() and meta["torch"] == torch.__version__
    # The commit of the code that runs (here rlstruct's own), not of the cwd (no repository).
    assert meta["git_commit"] == git_commit(Path(logger_module.__file__).parent)
    assert meta["start_time"][:4].isdigit()


def test_config_may_be_a_dict_or_none(tmp_path: Path) -> None:
    with RunLogger("dqn", "CartPole-v1", {"eps": 0.1}, tmp_path, progress=False) as run:
        assert json.loads((run.dir / "config.json").read_text())["config"] == {"eps": 0.1}
    with RunLogger("dqn", "CartPole-v1", None, tmp_path, progress=False) as run:
        assert json.loads((run.dir / "config.json").read_text())["config"] == {}


def fake_git(
    monkeypatch: pytest.MonkeyPatch, head: tuple[int, str], status: str = "", tracked: int = 0
) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append({"cmd": cmd, **kw})
        if cmd[1] == "rev-parse":
            return subprocess.CompletedProcess(cmd, head[0], head[1], "")
        if cmd[1] == "ls-files":
            return subprocess.CompletedProcess(cmd, tracked, "", "")
        return subprocess.CompletedProcess(cmd, 0, status, "")

    monkeypatch.setattr(logger_module.subprocess, "run", run)
    return calls


def test_git_commit_clean_and_dirty(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = fake_git(monkeypatch, (0, "abc123\n"))
    assert git_commit(tmp_path) == "abc123"
    assert [c["cmd"][1] for c in calls] == ["rev-parse", "ls-files", "status"]
    assert all(c["cwd"] == tmp_path.resolve() and c["timeout"] <= 10 for c in calls)
    fake_git(monkeypatch, (0, "abc123\n"), status=" M rlstruct/runs/logger.py\n")
    assert git_commit(tmp_path) == "abc123-dirty"


def test_git_commit_unknown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_git(monkeypatch, (128, ""))
    assert git_commit(tmp_path) == "unknown"
    fake_git(monkeypatch, (0, "abc123\n"), tracked=1)  # in a checkout, but not tracked by it
    assert git_commit(tmp_path) == "unknown"

    def missing(cmd: list[str], **kw: Any) -> None:
        raise FileNotFoundError("git")

    def slow(cmd: list[str], **kw: Any) -> None:
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    for broken in (missing, slow):
        monkeypatch.setattr(logger_module.subprocess, "run", broken)
        assert git_commit(tmp_path) == "unknown"


def test_config_json_records_the_commit_of_the_code_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = fake_git(monkeypatch, (0, "feed\n"), status="?? new.py\n")
    code = tmp_path / "code"
    code.mkdir()
    with make(tmp_path, code_dir=code) as run:
        assert json.loads((run.dir / "config.json").read_text())["git_commit"] == "feed-dirty"
    assert calls[0]["cwd"] == code.resolve()  # not the working directory
    calls = fake_git(monkeypatch, (0, "feed\n"))
    with make(tmp_path) as run:  # default: the rlstruct package
        pass
    assert calls[0]["cwd"] == Path(logger_module.__file__).resolve().parent


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_git_commit_of_a_real_checkout_ignores_untracked_copies(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / ".venv" / "site").mkdir(parents=True)
    (repo / "pkg" / "code.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text(".venv/\n")
    git(repo, "init", "-q")
    git(repo, "add", "pkg", ".gitignore")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    head = git(repo, "rev-parse", "HEAD")
    assert git_commit(repo / "pkg") == head
    assert git_commit(repo / "pkg" / "code.py") == head
    assert git_commit(repo / ".venv" / "site") == "unknown"  # an installed copy: not this code
    (repo / "pkg" / "code.py").write_text("x = 2\n")
    assert git_commit(repo / "pkg") == head + "-dirty"
    assert git_commit(tmp_path) == "unknown"  # no repository


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
        assert run.train_column == "train_return_mean3"
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
    assert list(first) == ["frames", "episodes", "wall_time", "steps_per_s",
                           "train_return_mean20", "loss", "entropy", "updates", "done"]
    assert header == list(first) and run.n_rows == 2
    assert first["loss"] == 0.25 and isinstance(first["loss"], float) and first["done"] == 1
    assert first["episodes"] == 2 and first["train_return_mean20"] == 2.0
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
    assert [r["eval_return"] for r in rows] == ["nan", "7.0", "nan"]  # never repeated
    assert [r["loss"] for r in rows] == ["1.0", "0.5", "0.25"]
    assert not (run.dir / "progress.csv.tmp").exists()


def test_the_logger_keeps_no_row_in_memory(tmp_path: Path) -> None:
    """Issue 38: a learner's memory grew by ~1.1 KB an iteration; RunLogger kept every row and
    every return. After a warm-up, 2000 more rows (and episodes) leave under 200 KB allocated
    (2000 rows kept would be several MB), and the file still gets every row."""
    import tracemalloc

    with make(tmp_path, tensorboard=False) as run:
        def iteration(i: int) -> None:
            run.record_episodes([float(i)], [10])
            run.log(frames=10 * i, loss=0.5, entropy=0.1, cores_busy=1.0, load_avg=2.0)

        for i in range(200):
            iteration(i)
        tracemalloc.start()
        try:
            for i in range(200, 2200):
                iteration(i)
            kept, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert run.n_rows == 2200 and run.episodes == 2200
        assert run.train_return() == pytest.approx(sum(range(2180, 2200)) / 20)
        run.log(frames=30_000, eval_return=7.0)  # a new column: the file is read back
    assert kept < 200_000, f"{kept} bytes kept over 2000 iterations"
    header, rows = read_csv(run.dir / "progress.csv")
    assert len(rows) == 2201 and header[-1] == "eval_return"
    assert rows[0]["eval_return"] == "nan" and rows[-1]["eval_return"] == "7.0"
    assert [int(r["frames"]) for r in rows[:3]] == [0, 10, 20]


@pytest.mark.parametrize(
    ("metrics", "message"),
    [({"episodes": 1.0}, "reserved"), ({"train_return_mean20": 1.0}, "reserved"),
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
    assert run.closed
    assert json.loads((run.dir / "config.json").read_text())["algo"] == "ppo"
    assert len(read_csv(run.dir / "progress.csv")[1]) == 1
    assert len(read_csv(run.dir / "episodes.csv")[1]) == 2
    assert torch.load(run.dir / "checkpoints" / "best.pt") == {"step": 1}
    assert is_png(run.dir / "returns.png")


def test_other_exceptions_propagate_after_closing(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), make(tmp_path) as run:
        1 / 0  # noqa: B018
    assert run.closed and is_png(run.dir / "returns.png")


def test_without_matplotlib_warns_and_skips_the_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    run = make(tmp_path)
    run.log(frames=1)
    with pytest.warns(UserWarning, match="matplotlib is not installed"):
        run.close()
    assert not (run.dir / "returns.png").exists() and (run.dir / "progress.csv").is_file()
    with pytest.raises(ImportError, match=r"pip install -e '\.\[plot\]'"):
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
    assert "2,500/10,000 frames (25%)" in first and "steps/s" in first
    assert "train_return_mean20 5.00" in first
    for i in range(50):  # throttled: none of these renders (well under 0.25 s)
        run.log(frames=2600 + i, eval_return=7.0 if i < 49 else math.nan)  # nan: not evaluated
    assert tty.getvalue() == first
    run.close()
    out = tty.getvalue()
    assert out.count("\r") == 2 and out.endswith("\n") and "last eval 7.00" in out
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


def test_plain_progress_lines_off_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logs, nohup and CI see a plain line every progress_interval seconds."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    with make(tmp_path, progress=True, progress_interval=0.2) as run:
        run.record_episodes([1.0])
        run.log(frames=10)  # too early: the interval counts from the start
        assert stream.getvalue() == ""
        time.sleep(0.25)
        run.log(frames=20, eval_return=3.0)
        run.log(frames=30)  # too early again
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "\r" not in stream.getvalue()
    assert lines[0].startswith("ppo ALE/Pong-v5 | 20 frames") and "last eval 3.00" in lines[0]


def test_the_progress_line_shows_the_load_and_an_eta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38: the load average beside the cores, and an ETA against the frame budget (this
    session's speed) or the time budget, whichever ends first."""
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    with make(tmp_path, progress=True, total_frames=10_000, time_budget=3600.0) as run:
        run.log(frames=0, cores_busy=1.5, load_avg=2.5)
        time.sleep(0.3)  # the terminal's line is rewritten at most every 0.25 s
        run.log(frames=5000, cores_busy=1.5, load_avg=2.5)
        shown = tty.getvalue().rsplit("\r", 1)[-1]
    assert "1.5 cores | load 2.5 | ETA " in shown, shown
    assert re.search(r"ETA \d+(s|m\d\ds|h\d\dm)$", shown.strip()), shown
    line = ProgressLine("ppo", "r", total_frames=10_000, time_budget=3600.0,
                        stream=io.StringIO())
    line.show({"frames": 1000, "wall_time": 100.0, "steps_per_s": 0.0, "r": 0.0}, math.nan, 0.0)
    assert line.eta(6000, 200.0) == pytest.approx(80.0)  # 4000 frames more at 50 frames/s
    assert line.eta(6000, 3590.0) == pytest.approx(10.0)  # the time budget ends first
    assert ProgressLine("x", "r").eta(10, 1.0) is None  # no budget, no ETA


def test_no_progress_when_disabled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for stream in (FakeTTY(), io.StringIO()):
        monkeypatch.setattr(sys, "stderr", stream)
        with make(tmp_path, progress=False, progress_interval=0.0) as run:
            run.record_episodes([1.0])
            run.log(frames=10)
        assert stream.getvalue() == ""


# ------------------------------------------------------------------ config_to_dict


class Colour(enum.Enum):
    RED = "red"


@dataclass
class Inner:
    device: str = "cpu"


@dataclass
class Outer:
    hidden: tuple[int, ...] = (64, 64)
    inner: Inner = field(default_factory=Inner)
    colour: Colour = Colour.RED
    path: Path = Path("runs")
    ratio: float = math.inf
    tags: frozenset[str] = frozenset({"b", "a"})


def test_config_to_dict_is_json_safe_and_keeps_nested_configs() -> None:
    d = config_to_dict(Outer())
    assert d == {"hidden": [64, 64], "inner": {"device": "cpu"}, "colour": "red",
                 "path": "runs", "ratio": "inf", "tags": ["a", "b"]}
    assert json.loads(json.dumps(d)) == d
    other = config_to_dict({"t": torch.tensor([1, 2]), "n": np.float32(0.5), "dt": torch.float32,
                            "dev": torch.device("cpu"), "fn": math.sqrt, "nan": math.nan})
    assert other == {"t": [1, 2], "n": 0.5, "dt": "torch.float32", "dev": "cpu",
                     "fn": "math.sqrt", "nan": "nan"}
    assert config_to_dict(None) == {}
    with pytest.raises(TypeError, match="dataclass instance or a mapping"):
        config_to_dict(Outer)


def test_summary_json_holds_nan_and_infinities_as_null(tmp_path):
    """Issue 27: summary.json stored NaN as the string "nan"; JSON readers get null."""
    with RunLogger("ppo", "CartPole-v1", {"lr": 1.0}, tmp_path, progress=False) as lg:
        path = lg.write_summary({"eval_return": math.nan, "best": math.inf,
                                 "returns": [1.0, -math.inf], "frames": 3})
    text = path.read_text()
    assert '"nan"' not in text and '"inf"' not in text
    assert json.loads(text) == {"eval_return": None, "best": None, "returns": [1.0, None],
                                "frames": 3}
