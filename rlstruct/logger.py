"""One run directory per experiment: config, progress, episodes, checkpoints and a plot.

:class:`RunLogger` creates ``<root>/<algo>_<env>_<YYYYmmdd-HHMMSS>[-n]/`` and fills it with:

===================== ========================================================================
``config.json``       the config, algo, env, start time, python/torch versions, git commit
``progress.csv``      one row per :meth:`RunLogger.log`: frames, episodes, wall_time,
                      steps_per_s, train_return (window mean), then the given metrics
``episodes.csv``      one row per finished episode: frames_at_record, return, length
``checkpoints/``      ``latest.pt`` and ``best.pt`` (best score so far)
``returns.png``       written by :meth:`RunLogger.close` (needs matplotlib)
``events.out.*``      TensorBoard scalars, when ``tensorboard`` is installed
===================== ========================================================================

Every row is flushed as it is written, so an interrupted run keeps everything it logged; used as a
context manager the logger also closes (and plots) on ``KeyboardInterrupt``.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     with RunLogger("ppo", "CartPole-v1", {"lr": 3e-4}, root, progress=False) as run:
    ...         run.record_episodes([10.0, 20.0])
    ...         row = run.log(frames=256, loss=0.5)
    ...     print(row["episodes"], row["train_return"], row["loss"])
    2 15.0 0.5
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np
import torch

from rlstruct.cli import config_to_dict
from rlstruct.errors import ShapeError

__all__ = ["RunLogger", "plot_runs"]

_RESERVED = ("frames", "episodes", "wall_time", "steps_per_s", "train_return")
_EPISODE_FIELDS = ("frames_at_record", "return", "length")
_PROGRESS_INTERVAL_S = 0.25  # at most ~4 progress-line updates per second
_MOVING_AVERAGE = 100


class RunLogger:
    """Writes one run directory; see the module docstring for its contents.

    Args:
        algo: algorithm name (first part of the directory name).
        env: environment id; sanitised for the directory name (``ALE/Pong-v5`` -> ``ALE-Pong-v5``).
        config: the run's config: a dataclass instance, a mapping, a Namespace or ``None``.
        root: the folder holding run directories.
        tensorboard: also write TensorBoard scalars when ``tensorboard`` is importable.
        progress: rewrite one status line on stderr (only when stderr is a TTY).
        total_frames: the frame budget, shown in the progress line.
        window: how many last episodes ``train_return`` averages.

    Attributes:
        dir: the run directory (created at construction).
        best_score: the best checkpoint score so far (``None`` before the first).
        frames: the frame count of the last :meth:`log` call.
    """

    def __init__(
        self,
        algo: str,
        env: str,
        config: Any,
        root: str | Path = "runs",
        *,
        tensorboard: bool = True,
        progress: bool = True,
        total_frames: int | None = None,
        window: int = 100,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.algo, self.env, self.window, self.total_frames = algo, env, window, total_frames
        self.best_score: float | None = None
        self.frames = 0
        self._returns: list[float] = []
        self._rows: list[dict[str, Any]] = []
        self._header: list[str] = []
        self._closed = False
        self._start = time.monotonic()
        self._last_frames, self._last_time = 0, self._start
        self._last_eval = math.nan
        started = datetime.datetime.now().astimezone()
        self.dir = _make_run_dir(Path(root), f"{_sanitise(algo)}_{_sanitise(env)}", started)

        meta = {
            "algo": algo,
            "env": env,
            "start_time": started.isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "git_commit": git_commit(),
            "argv": list(sys.argv),
            "config": config_to_dict(config),
        }
        (self.dir / "config.json").write_text(json.dumps(meta, indent=2) + "\n")

        self._episodes_file: IO[str] = open(self.dir / "episodes.csv", "w", newline="")  # noqa: SIM115
        self._episodes_csv = csv.writer(self._episodes_file)
        self._episodes_csv.writerow(_EPISODE_FIELDS)
        self._episodes_file.flush()
        self._progress_file: IO[str] | None = None
        self._progress_csv: csv.DictWriter | None = None

        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # optional: no tensorboard, no events
                pass
            else:
                self._tb = SummaryWriter(log_dir=str(self.dir))
                self._tb.add_text("config", f"```\n{json.dumps(meta, indent=2)}\n```")

        stream = sys.stderr
        self._stream: IO[str] | None = stream if progress and _isatty(stream) else None
        self._line_len = 0
        self._last_render = -math.inf

    # ------------------------------------------------------------------ recording

    @property
    def episodes(self) -> int:
        """How many finished episodes were recorded."""
        return len(self._returns)

    def record_episodes(
        self,
        returns: torch.Tensor | Sequence[float],
        lengths: torch.Tensor | Sequence[int] | None = None,
        *,
        frames: int | None = None,
    ) -> None:
        """Record finished episodes (one ``episodes.csv`` row each, flushed).

        Args:
            returns: the episodes' returns, shape ``(N,)``, on any device (moved to the CPU).
            lengths: their lengths, shape ``(N,)``, or ``None`` (written empty).
            frames: the frame count to file them under; defaults to the last :meth:`log`'s.

        Raises:
            ShapeError: ``lengths`` does not have one entry per return.
        """
        self._check_open("record_episodes")
        values = _floats(returns)
        lens = [int(x) for x in _floats(lengths)] if lengths is not None else None
        if lens is not None and len(lens) != len(values):
            raise ShapeError(
                f"record_episodes: got {len(values)} returns but {len(lens)} lengths; "
                "give one length per return (or lengths=None)"
            )
        at = self.frames if frames is None else int(frames)
        for i, value in enumerate(values):
            self._episodes_csv.writerow([at, value, "" if lens is None else lens[i]])
        self._episodes_file.flush()
        self._returns.extend(values)

    def train_return(self, last: int | None = None) -> float:
        """Mean return of the last ``last`` episodes (default: ``window``); nan if none yet."""
        n = self.window if last is None else last
        if n < 1:
            raise ValueError(f"train_return: last must be >= 1, got {n}")
        recent = self._returns[-n:]
        return sum(recent) / len(recent) if recent else math.nan

    def log(self, frames: int, **metrics: float) -> dict[str, Any]:
        """Append one ``progress.csv`` row (flushed) and update TensorBoard and the progress line.

        Args:
            frames: total environment frames so far.
            **metrics: any scalars (floats, ints, one-element tensors), e.g. ``eval_return``,
                ``loss``, ``entropy``, ``lr``. A name first seen after the first row widens the
                header (the file is rewritten once with the union of the columns).

        Returns:
            The row: frames, episodes, wall_time (s since start), steps_per_s (frames per second
            since the previous row), train_return (window mean), then the metrics.

        Raises:
            ValueError: a metric reuses a reserved column name or is not a scalar.
        """
        self._check_open("log")
        now = time.monotonic()
        frames = int(frames)
        elapsed = now - self._last_time
        row: dict[str, Any] = {
            "frames": frames,
            "episodes": self.episodes,
            "wall_time": now - self._start,
            "steps_per_s": (frames - self._last_frames) / elapsed if elapsed > 0 else math.nan,
            "train_return": self.train_return(),
        }
        for name, value in metrics.items():
            if name in _RESERVED:
                raise ValueError(f"log: metric name {name!r} is reserved ({', '.join(_RESERVED)})")
            row[name] = _scalar(name, value)
        self.frames, self._last_frames, self._last_time = frames, frames, now
        if not math.isnan(row.get("eval_return", math.nan)):  # nan: no evaluation this row
            self._last_eval = row["eval_return"]
        self._write_row(row)
        if self._tb is not None:
            for name, value in row.items():
                if name != "frames" and isinstance(value, (int, float)):
                    self._tb.add_scalar(name, value, global_step=frames)
        if self._stream is not None and now - self._last_render >= _PROGRESS_INTERVAL_S:
            self._render(row, now)
        return row

    def checkpoint(self, state: dict[str, Any], score: float | None = None) -> None:
        """Save ``state`` to ``checkpoints/latest.pt``, and to ``best.pt`` when ``score`` is best.

        Writes go through a temporary file and an atomic rename, so an interrupt never leaves a
        truncated checkpoint. A ``None`` or nan score never counts as best.
        """
        self._check_open("checkpoint")
        folder = self.dir / "checkpoints"
        folder.mkdir(exist_ok=True)
        latest = folder / "latest.pt"
        tmp = folder / "latest.pt.tmp"
        torch.save(state, tmp)
        os.replace(tmp, latest)
        if score is None:
            return
        score = float(score)
        if math.isnan(score) or (self.best_score is not None and score <= self.best_score):
            return
        shutil.copyfile(latest, folder / "best.pt.tmp")
        os.replace(folder / "best.pt.tmp", folder / "best.pt")
        self.best_score = score

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Flush and close the files, write ``returns.png``, close TensorBoard (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._stream is not None and self._rows:
                self._render(self._rows[-1], time.monotonic())
            if self._stream is not None and self._line_len:
                self._stream.write("\n")
                self._stream.flush()
        finally:
            self._episodes_file.close()
            if self._progress_file is not None:
                self._progress_file.close()
            if self._tb is not None:
                self._tb.close()
            self._plot()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()  # on KeyboardInterrupt too; the exception then propagates

    # ------------------------------------------------------------------ internals

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise RuntimeError(f"RunLogger.{method} called after close() (run {self.dir})")

    def _write_row(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        new_keys = [k for k in row if k not in self._header]
        if self._progress_csv is None or new_keys:
            # First row, or a metric seen for the first time: (re)write with the union header.
            self._header += new_keys
            if self._progress_file is not None:
                self._progress_file.close()
            path = self.dir / "progress.csv"
            tmp = self.dir / "progress.csv.tmp"
            with open(tmp, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self._header, restval="")
                writer.writeheader()
                writer.writerows(self._rows)
            os.replace(tmp, path)
            self._progress_file = open(path, "a", newline="")  # noqa: SIM115
            self._progress_csv = csv.DictWriter(
                self._progress_file, fieldnames=self._header, restval=""
            )
        else:
            self._progress_csv.writerow(row)
        assert self._progress_file is not None
        self._progress_file.flush()

    def _render(self, row: dict[str, Any], now: float) -> None:
        assert self._stream is not None
        frames = row["frames"]
        parts = [f"{self.algo} {self.env}", f"{frames:,}"]
        if self.total_frames:
            parts[-1] += f"/{self.total_frames:,} frames ({100 * frames / self.total_frames:.0f}%)"
        else:
            parts[-1] += " frames"
        parts.append(f"{row['steps_per_s']:,.0f} steps/s")
        parts.append(f"train {row['train_return']:.2f}")
        if not math.isnan(self._last_eval):
            parts.append(f"eval {self._last_eval:.2f}")
        line = " | ".join(parts)
        pad = max(0, self._line_len - len(line))  # blank out the rest of a longer previous line
        self._stream.write("\r" + line + " " * pad)
        self._stream.flush()
        self._line_len = len(line)
        self._last_render = now

    def _plot(self) -> None:
        try:
            plot_runs([self.dir], self.dir / "returns.png")
        except ImportError:
            warnings.warn(
                "matplotlib is not installed: skipping returns.png "
                "(pip install 'rlstruct[plot]', then: python -m rlstruct plot RUN_DIR)",
                stacklevel=3,
            )
        except Exception as err:  # never let a plot hide the run's own outcome
            warnings.warn(f"could not write {self.dir / 'returns.png'}: {err!r}", stacklevel=3)


def git_commit(cwd: str | Path | None = None, timeout: float = 5.0) -> str:
    """The current git commit of ``cwd`` (default: the working directory).

    Returns:
        The full hash, with ``-dirty`` appended when ``git status --porcelain`` lists changes;
        ``"unknown"`` outside a repository, without git, or when git is too slow.
    """
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
            timeout=timeout, check=False,
        )
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        commit = head.stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=cwd, capture_output=True, text=True,
            timeout=timeout, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + "-dirty" if status.returncode == 0 and status.stdout.strip() else commit


def _sanitise(name: str) -> str:
    """A file-name-safe version of ``name`` (``ALE/Pong-v5`` -> ``ALE-Pong-v5``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "run"


def _make_run_dir(root: Path, stem: str, started: datetime.datetime) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    base = f"{stem}_{started.strftime('%Y%m%d-%H%M%S')}"
    for n in range(10_000):
        path = root / (base if n == 0 else f"{base}-{n}")
        try:
            path.mkdir()  # atomic: two runs started in the same second get distinct dirs
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free run directory name for {root / base}")


def _floats(values: torch.Tensor | Sequence[float] | float) -> list[float]:
    if isinstance(values, torch.Tensor):
        return values.detach().to("cpu", torch.float64).reshape(-1).tolist()
    if isinstance(values, (int, float)):
        return [float(values)]
    return [float(v) for v in values]


def _scalar(name: str, value: Any) -> int | float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"log: metric {name!r} has {value.numel()} elements, expected 1")
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"log: metric {name!r} must be a number, got {value!r}") from None


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


def plot_runs(run_dirs: Sequence[Path | str], out: Path | str) -> Path:
    """Plot episode returns against frames for one or more run directories into a PNG.

    Each run gets one colour: its 100-episode moving average (solid; from ``episodes.csv``, or
    ``progress.csv``'s ``train_return`` when no episode was recorded), its ``eval_return``
    (dashed, when logged) and, for a single run, the raw per-episode returns (faint). The legend
    names runs by directory name. Uses matplotlib's Agg canvas: no display, no pyplot state.

    Args:
        run_dirs: run directories written by :class:`RunLogger`.
        out: the PNG to write (parent folders are created).

    Returns:
        ``out`` as a ``Path``.

    Raises:
        FileNotFoundError: a run directory (or both of its csv files) does not exist.
        ImportError: matplotlib is not installed (``pip install 'rlstruct[plot]'``).
    """
    runs = [Path(d) for d in run_dirs]
    for run in runs:
        if not (run / "episodes.csv").is_file() and not (run / "progress.csv").is_file():
            raise FileNotFoundError(f"{run} is not a run directory (no episodes.csv/progress.csv)")
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            f"plotting needs matplotlib ({err}); install it with: pip install 'rlstruct[plot]'"
        ) from err
    fig = Figure(figsize=(9, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colours = matplotlib.colormaps["tab10"].colors
    for i, run in enumerate(runs):
        colour = colours[i % len(colours)]
        episodes = _read_csv(run / "episodes.csv")
        progress = _read_csv(run / "progress.csv")
        frames = np.array([_num(r.get("frames_at_record")) for r in episodes])
        returns = np.array([_num(r.get("return")) for r in episodes])
        if len(returns):
            if len(runs) == 1:
                ax.plot(frames, returns, color=colour, alpha=0.25, lw=0.8, label="episode return")
            ax.plot(frames, _moving_average(returns, _MOVING_AVERAGE), color=colour, lw=2,
                    label=f"{run.name} ({_MOVING_AVERAGE}-episode mean)")
        elif progress:
            ax.plot([_num(r.get("frames")) for r in progress],
                    [_num(r.get("train_return")) for r in progress], color=colour, lw=2,
                    label=f"{run.name} (train return)")
        evals = [(_num(r.get("frames")), _num(r.get("eval_return"))) for r in progress]
        evals = [(f, v) for f, v in evals if not math.isnan(v)]
        if evals:
            ax.plot(*zip(*evals), color=colour, ls="--", marker="o", ms=3,
                    label=f"{run.name} (eval)")
    ax.set_xlabel("frames")
    ax.set_ylabel("return")
    ax.set_title("episode return" if len(runs) == 1 else "episode return by run")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(loc="best", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no episodes recorded", ha="center", va="center",
                transform=ax.transAxes)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _moving_average(values: np.ndarray, n: int) -> np.ndarray:
    """Trailing mean over the last ``n`` values (fewer at the start)."""
    cumsum = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    start = np.maximum(idx - n, 0)
    return (cumsum[idx] - cumsum[start]) / (idx - start)
