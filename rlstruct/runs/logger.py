"""One run directory per experiment: config, progress, episodes, checkpoints and a plot.

:class:`RunLogger` creates ``<root>/<algo>_<env>_<YYYYmmdd-HHMMSS>[-n]/`` and fills it with:

===================== ========================================================================
``config.json``       the whole config (nested dataclasses too), algo, env, start time,
                      python/torch versions, argv, and the git commit of the code that ran
``progress.csv``      one row per :meth:`RunLogger.log`: frames, episodes, wall_time,
                      steps_per_s, ``train_return_mean<N>`` (the mean return of the last ``N``
                      finished episodes, ``N = window``), then the given metrics
``episodes.csv``      one row per finished episode: frames_at_record, return, length
``checkpoints/``      ``latest.pt`` and ``best.pt`` (best score so far)
``summary.json``      the outcome, written by :meth:`RunLogger.write_summary` (``Run`` writes
                      it on every exit, ``status`` ``failed`` included)
``returns.png``       written by :meth:`RunLogger.close` (needs matplotlib; see
                      :mod:`rlstruct.runs.plotting`)
``resources.png``     cores, memory and GPU use per iteration, when the rows hold them
``events.out.*``      TensorBoard scalars, when ``tensorboard`` is installed
===================== ========================================================================

A metric that has no value on a row is written ``nan`` there (an ``eval_return`` only on the
rows where an evaluation finished), never repeated from an earlier row.

Every row is flushed as it is written, so an interrupted run keeps everything it logged; used as a
context manager the logger also closes (and plots) on ``KeyboardInterrupt``. Progress shows on
stderr: a line rewritten in place on a terminal, a plain line every ``progress_interval``
seconds otherwise (log files, ``nohup``, CI).

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     with RunLogger("ppo", "CartPole-v1", {"lr": 3e-4}, root, progress=False) as run:
    ...         run.record_episodes([10.0, 20.0])
    ...         row = run.log(frames=256, loss=0.5)
    ...     print(row["episodes"], row["train_return_mean20"], row["loss"])
    2 15.0 0.5
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import enum
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from rlstruct.errors import ConfigError, ShapeError
from rlstruct.runs.checkpoint import copy_checkpoint, save_checkpoint

__all__ = ["RunLogger", "config_to_dict", "git_commit"]

_EPISODE_FIELDS = ("frames_at_record", "return", "length")
_TTY_INTERVAL_S = 0.25  # at most ~4 progress-line updates per second on a terminal
_PACKAGE_DIR = Path(__file__).resolve().parent


class RunLogger:
    """Writes one run directory; see the module docstring for its contents.

    Args:
        algo: algorithm name (first part of the directory name).
        env: environment id; sanitised for the directory name (``ALE/Pong-v5`` -> ``ALE-Pong-v5``).
        config: the run's config: a dataclass instance, a mapping or ``None``.
        root: the folder holding run directories.
        tensorboard: also write TensorBoard scalars when ``tensorboard`` is importable.
        progress: show progress on stderr (see the module docstring).
        total_frames: the frame budget, shown in the progress line.
        window: how many last episodes the train return averages; it names the column
            ``train_return_mean<window>``.
        progress_interval: seconds between two plain progress lines when stderr is no terminal.
        code_dir: a folder of the code that runs (the algorithm's); config.json records the git
            commit of the repository that tracks it. Default: the rlstruct package.
        resume_dir: continue this run directory instead of creating one: the rows of
            ``progress.csv`` and ``episodes.csv`` up to ``resume_frames`` are kept (later ones,
            written after the checkpoint being resumed, are dropped), new rows are appended,
            ``wall_time`` goes on from ``resume_wall_time`` and config.json's ``resumes`` list
            records the resume.
        resume_frames: the frame count of the checkpoint being resumed.
        resume_wall_time: the run's wall time at that checkpoint.
        best_score: the best checkpoint score so far (resume).
        launch: how the run was launched (``{"launcher": "torchrun", "world_size": 2}``),
            recorded in ``config.json`` (a resume records its own in its ``resumes`` entry).

    Attributes:
        dir: the run directory (created at construction).
        train_column: ``"train_return_mean<window>"``.
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
        window: int = 20,
        progress_interval: float = 5.0,
        code_dir: str | Path | None = None,
        resume_dir: str | Path | None = None,
        resume_frames: int = 0,
        resume_wall_time: float = 0.0,
        best_score: float | None = None,
        launch: Mapping[str, Any] | None = None,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.algo, self.env, self.window, self.total_frames = algo, env, window, total_frames
        self.train_column = f"train_return_mean{window}"
        self.best_score = best_score
        self._launch = launch
        self.frames = 0
        self._returns: list[float] = []
        self._rows: list[dict[str, Any]] = []
        self._header: list[str] = []
        self._closed = False
        self._start = time.monotonic()
        self._last_frames, self._last_time = 0, self._start
        self._last_eval = math.nan
        started = datetime.datetime.now().astimezone()
        self._progress_file: IO[str] | None = None
        self._progress_csv: csv.DictWriter | None = None
        if resume_dir is not None:
            self.dir = Path(resume_dir)
            meta = self._resume(int(resume_frames), started)
            self._start -= resume_wall_time
        else:
            self.dir = _make_run_dir(Path(root), f"{_sanitise(algo)}_{_sanitise(env)}", started)
            meta = {
                "algo": algo,
                "env": env,
                "start_time": started.isoformat(timespec="seconds"),
                "python": platform.python_version(),
                "torch": torch.__version__,
                "git_commit": git_commit(code_dir if code_dir is not None else _PACKAGE_DIR),
                "argv": list(sys.argv),
                **({"launch": dict(launch)} if launch else {}),
                "config": config_to_dict(config),
            }
            (self.dir / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
            with open(self.dir / "episodes.csv", "w", newline="") as f:
                csv.writer(f).writerow(_EPISODE_FIELDS)
        self._episodes_file: IO[str] = open(self.dir / "episodes.csv", "a", newline="")  # noqa: SIM115
        self._episodes_csv = csv.writer(self._episodes_file)

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
        self._stream: IO[str] | None = stream if progress else None
        self._tty = _isatty(stream)
        self._interval = _TTY_INTERVAL_S if self._tty else progress_interval
        self._line_len = 0
        self._last_render = time.monotonic() if not self._tty else -math.inf

    # ------------------------------------------------------------------ recording

    @property
    def episodes(self) -> int:
        """How many finished episodes were recorded."""
        return len(self._returns)

    @property
    def n_rows(self) -> int:
        """How many ``progress.csv`` rows were written."""
        return len(self._rows)

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
                ``loss``, ``entropy``, ``lr``; nan means "no value on this row". A name first
                seen after the first row widens the header (the file is rewritten once with the
                union of the columns; earlier rows get nan there).

        Returns:
            The row: frames, episodes, wall_time (s since start), steps_per_s (frames per second
            since the previous row), ``train_return_mean<window>``, then the metrics.

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
            self.train_column: self.train_return(),
        }
        reserved = tuple(row)
        for name, value in metrics.items():
            if name in reserved:
                raise ValueError(f"log: metric name {name!r} is reserved ({', '.join(reserved)})")
            row[name] = _scalar(name, value)
        self.frames, self._last_frames, self._last_time = frames, frames, now
        if not math.isnan(row.get("eval_return", math.nan)):
            self._last_eval = row["eval_return"]
        self._write_row(row)
        if self._tb is not None:
            for name, value in row.items():
                if name != "frames" and isinstance(value, (int, float)) and not math.isnan(value):
                    self._tb.add_scalar(name, value, global_step=frames)
        if self._stream is not None and now - self._last_render >= self._interval:
            self._render(row, now)
        return row

    def checkpoint(self, state: dict[str, Any], score: float | None = None) -> None:
        """Save ``state`` to ``checkpoints/latest.pt``, and to ``best.pt`` when ``score`` is best.

        Writes go through a temporary file and an atomic rename
        (:func:`~rlstruct.runs.checkpoint.save_checkpoint`), so an interrupt or a full disk never
        leaves a truncated checkpoint nor a ``.tmp``. A ``None`` or nan score never counts as
        best.

        Raises:
            CheckpointError: a write failed (the file and the cause are named; the previous
                checkpoint is kept).
        """
        self._check_open("checkpoint")
        folder = self.dir / "checkpoints"
        folder.mkdir(exist_ok=True)
        latest = folder / "latest.pt"
        save_checkpoint(state, latest)
        if score is None:
            return
        score = float(score)
        if math.isnan(score) or (self.best_score is not None and score <= self.best_score):
            return
        copy_checkpoint(latest, folder / "best.pt")
        self.best_score = score

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        """Writes ``summary.json`` (atomically); returns its path."""
        path = self.dir / "summary.json"
        tmp = self.dir / "summary.json.tmp"
        # NaN and infinities are JSON null (no evaluation ran, no return yet), not strings.
        tmp.write_text(json.dumps(_jsonable(dict(summary), nonfinite=None), indent=2) + "\n")
        os.replace(tmp, path)
        return path

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Flush and close the files, write ``returns.png``, close TensorBoard (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._stream is not None and self._tty and self._rows:
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

    def __exit__(self, *exc_info: object) -> None:
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
            self._rewrite_progress()
        else:
            self._progress_csv.writerow(row)
        assert self._progress_file is not None
        self._progress_file.flush()

    def _rewrite_progress(self) -> None:
        """Writes every row under the current header (atomically), then appends from there."""
        if self._progress_file is not None:
            self._progress_file.close()
        path, tmp = self.dir / "progress.csv", self.dir / "progress.csv.tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self._header, restval="nan")
            writer.writeheader()
            writer.writerows(self._rows)
        os.replace(tmp, path)
        self._progress_file = open(path, "a", newline="")  # noqa: SIM115
        self._progress_csv = csv.DictWriter(
            self._progress_file, fieldnames=self._header, restval="nan"
        )

    def _resume(self, frames: int, started: datetime.datetime) -> dict[str, Any]:
        """Takes up the run directory ``self.dir`` at ``frames`` (see ``resume_dir``)."""
        try:
            meta = json.loads((self.dir / "config.json").read_text())
            with open(self.dir / "episodes.csv", newline="") as f:
                episodes = [r for r in csv.DictReader(f) if int(r["frames_at_record"]) <= frames]
            progress: list[dict[str, Any]] = []
            if (self.dir / "progress.csv").is_file():
                with open(self.dir / "progress.csv", newline="") as f:
                    reader = csv.DictReader(f)
                    progress = [{k: _number(v) for k, v in r.items()} for r in reader
                                if int(r["frames"]) <= frames]
                    self._header = list(reader.fieldnames or [])
        except (OSError, ValueError, KeyError) as err:
            raise ConfigError(f"cannot resume {self.dir}: {type(err).__name__}: {err}") from err
        tmp = self.dir / "episodes.csv.tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=_EPISODE_FIELDS)
            writer.writeheader()
            writer.writerows(episodes)
        os.replace(tmp, self.dir / "episodes.csv")
        self._returns = [float(r["return"]) for r in episodes]
        if progress:
            self._rows = progress
            self._rewrite_progress()
        self.frames = self._last_frames = frames
        meta.setdefault("resumes", []).append({
            "time": started.isoformat(timespec="seconds"), "frames": frames,
            "argv": list(sys.argv), **({"launch": dict(self._launch)} if self._launch else {}),
        })
        (self.dir / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
        return meta

    def _render(self, row: dict[str, Any], now: float) -> None:
        assert self._stream is not None
        frames = row["frames"]
        parts = [f"{self.algo} {self.env}", f"{frames:,}"]
        if self.total_frames:
            parts[-1] += f"/{self.total_frames:,} frames ({100 * frames / self.total_frames:.0f}%)"
        else:
            parts[-1] += " frames"
        parts.append(f"{row['wall_time']:.0f} s")
        parts.append(f"{row['steps_per_s']:,.0f} steps/s")
        parts.append(f"{self.train_column} {row[self.train_column]:.2f}")
        if not math.isnan(self._last_eval):
            parts.append(f"last eval {self._last_eval:.2f}")
        if "cores_busy" in row and not math.isnan(row["cores_busy"]):
            parts.append(f"{row['cores_busy']:.1f} cores")
        line = " | ".join(parts)
        if self._tty:  # rewrite in place; blank out the rest of a longer previous line
            pad = max(0, self._line_len - len(line))
            self._stream.write("\r" + line + " " * pad)
            self._line_len = len(line)
        else:
            self._stream.write(line + "\n")
        self._stream.flush()
        self._last_render = now

    def _plot(self) -> None:
        from rlstruct.runs.plotting import plot_runs

        try:
            plot_runs([self.dir], self.dir / "returns.png")
            if "cores_busy" in self._header:
                from rlstruct.runs.monitor import resources_figure

                resources_figure(self.dir / "progress.csv", self.dir / "resources.png")
        except ImportError:
            warnings.warn(
                "matplotlib is not installed: skipping returns.png "
                "(pip install 'rlstruct[plot]', then: rlstruct plot RUN_DIR)",
                stacklevel=3,
            )
        except Exception as err:  # never let a plot hide the run's own outcome
            warnings.warn(f"could not write {self.dir / 'returns.png'}: {err!r}", stacklevel=3)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Turn a config (a dataclass, nested ones included, a mapping or ``None``) into a JSON-safe
    dict: what ``config.json`` records.

    Tuples become lists; paths, devices, dtypes and types become strings; enums their value;
    non-finite floats the strings ``"nan"``, ``"inf"``, ``"-inf"``; tensors and numpy values
    plain numbers or lists; anything else its ``repr``.

    Example:
        >>> from dataclasses import dataclass, field
        >>> @dataclass
        ... class Layout:
        ...     device: str = "cpu"
        >>> @dataclass
        ... class Config:
        ...     hidden: tuple[int, ...] = (64, 64)
        ...     layout: Layout = field(default_factory=Layout)
        >>> config_to_dict(Config())
        {'hidden': [64, 64], 'layout': {'device': 'cpu'}}

    Raises:
        TypeError: ``cfg`` is none of the accepted kinds.
    """
    if cfg is None:
        return {}
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: _jsonable(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, Mapping):
        return {str(k): _jsonable(v) for k, v in cfg.items()}
    raise TypeError(f"config_to_dict needs a dataclass instance or a mapping, got {type(cfg)}")


def git_commit(path: str | Path, timeout: float = 5.0) -> str:
    """The git commit of the code at ``path`` (a file or a folder).

    The commit is the one of the repository that TRACKS ``path``: a copy installed into a
    virtual environment inside a checkout (an ignored folder) is not mistaken for the checkout.

    Returns:
        The full hash, with ``-dirty`` appended when ``git status --porcelain`` lists changes;
        ``"unknown"`` when ``path`` is not tracked by a repository, without git, or when git is
        too slow.
    """
    path = Path(path).resolve()
    folder = path if path.is_dir() else path.parent

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True,
                              timeout=timeout, check=False)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        tracked = git("ls-files", "--error-unmatch", "--", str(path))
        if tracked.returncode != 0:
            return "unknown"
        status = git("status", "--porcelain")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = head.stdout.strip()
    return commit + "-dirty" if status.returncode == 0 and status.stdout.strip() else commit


def _jsonable(value: Any, nonfinite: Any = str) -> Any:
    """``value`` in JSON's types; a non-finite float becomes ``nonfinite(value)`` (a callable)
    or the ``nonfinite`` value itself."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return nonfinite(value) if callable(nonfinite) else nonfinite
    if isinstance(value, enum.Enum):
        return _jsonable(value.value, nonfinite)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_to_dict(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, nonfinite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, nonfinite) for v in value]
    if isinstance(value, (set, frozenset)):
        return [_jsonable(v, nonfinite) for v in sorted(value, key=repr)]
    if isinstance(value, torch.Tensor):
        return _jsonable(value.detach().cpu().tolist(), nonfinite)
    if isinstance(value, (np.generic, np.ndarray)):
        return _jsonable(value.tolist(), nonfinite)
    if isinstance(value, (Path, torch.device, torch.dtype)):
        return str(value)
    if isinstance(value, type) or callable(value):
        module = getattr(value, "__module__", None)
        name = getattr(value, "__qualname__", None)
        if name is not None:
            return f"{module}.{name}" if module else name
    return repr(value)


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


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


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
