"""One run directory per experiment: config, progress, episodes, checkpoints and a plot.

:class:`RunLogger` creates ``<root>/<algo>_<env>_<YYYYmmdd-HHMMSS>[-n]/`` and fills it with:

===================== ========================================================================
``config.json``       the whole config (nested dataclasses too), algo, env, start time,
                      versions, argv, git commit, ``sessions`` (each one's argv and budgets)
``progress.csv``      one row per :meth:`RunLogger.log`: frames, episodes, wall_time,
                      steps_per_s, ``train_return_mean<N>`` (the mean return of the last ``N``
                      finished episodes, ``N = window``), then the given metrics
``episodes.csv``      one row per finished episode: frames_at_record, return, length
``checkpoints/``      ``latest.pt`` and ``best.pt`` (best score so far), written by the
                      :class:`~rlstruct.runs.checkpoint.CheckpointWriter` of
                      :attr:`RunLogger.checkpoints`
``summary.json``      the outcome, written by :meth:`RunLogger.write_summary` (``Run`` writes
                      it on every exit, ``status`` ``failed`` included)
``returns.png``       written by :meth:`RunLogger.close` (needs matplotlib; see
                      :mod:`rlstruct.runs.plotting`)
``resources.png``     cores, memory and GPU use per iteration, when the rows hold them
``events.out.*``      TensorBoard scalars, when ``tensorboard`` is installed
``wandb.json``        the id of the run's wandb run, with ``tracking`` (``--wandb``: every row,
                      config.json and the plots go to wandb too; :mod:`rlstruct.runs.tracking`)
===================== ========================================================================

A metric that has no value on a row is written ``nan`` there (an ``eval_return`` only on the
rows where an evaluation finished), never repeated from an earlier row.

Every row is flushed as it is written, so an interrupted run keeps everything it logged; used as a
context manager the logger also closes (and plots) on ``KeyboardInterrupt``. Its memory does not
grow with the run: it keeps the last row and the last returns (:data:`RETURNS_KEPT`), and reads
``progress.csv`` back when a new column widens the header. Progress shows on
stderr (:class:`~rlstruct.runs.progress.ProgressLine`): a line rewritten in place on a terminal,
a plain line every ``progress_interval`` seconds otherwise (log files, ``nohup``, CI). Every
path is the :class:`~rlstruct.runs.folder.RunFolder`'s.

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

import collections
import csv
import datetime
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

import torch

from rlstruct.errors import ConfigError, ShapeError
from rlstruct.runs.checkpoint import CheckpointWriter
from rlstruct.runs.folder import RunFolder
from rlstruct.runs.json_safe import json_safe
from rlstruct.runs.progress import ProgressLine
from rlstruct.runs.progress_csv import ProgressCsv
from rlstruct.runs.tracking import TrackingOptions, WandbTracker

__all__ = ["RunLogger", "git_commit", "safe_name"]

_EPISODE_FIELDS = ("frames_at_record", "return", "length")
#: How many of the last episode returns the logger keeps (at least its ``window``): the most
#: :meth:`RunLogger.train_return` can average.
RETURNS_KEPT = 1000
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
        total_frames: the frame budget, shown in the progress line (with an ETA).
        time_budget: the time budget in seconds, every session together: the progress line's
            ETA is the sooner of the two.
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
        session: this session's entry of config.json's ``sessions`` list (None: no list).
        tracking: the wandb run to mirror the folder into
            (:class:`~rlstruct.runs.tracking.WandbTracker`: every row, config.json's content,
            the plots); None: no wandb. A wandb error is a warning, never the run's.

    Attributes:
        folder: the :class:`~rlstruct.runs.folder.RunFolder` (created at construction);
            ``dir``: its path.
        checkpoints: the :class:`~rlstruct.runs.checkpoint.CheckpointWriter` of its
            ``checkpoints/`` (:meth:`checkpoint` writes through it).
        train_column: ``"train_return_mean<window>"``.
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
        time_budget: float | None = None,
        window: int = 20,
        progress_interval: float = 5.0,
        code_dir: str | Path | None = None,
        resume_dir: str | Path | None = None,
        resume_frames: int = 0,
        resume_wall_time: float = 0.0,
        best_score: float | None = None,
        launch: Mapping[str, Any] | None = None,
        session: Mapping[str, Any] | None = None,
        tracking: TrackingOptions | None = None,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.algo, self.env, self.window = algo, env, window
        self.train_column = f"train_return_mean{window}"
        self._launch, self._session = launch, session
        self.frames = 0
        self._returns: collections.deque[float] = collections.deque(
            maxlen=max(window, RETURNS_KEPT))
        self._n_episodes = 0
        self._closed = False
        self._start = time.monotonic()
        self._last_frames, self._last_time = 0, self._start
        self._last_eval = math.nan
        started = datetime.datetime.now().astimezone()
        if resume_dir is not None:
            self.folder = RunFolder(Path(resume_dir))
            self._csv = ProgressCsv(self.folder.progress_file)
            meta = self._resume(int(resume_frames), started)
            self._start -= resume_wall_time
        else:
            self.folder = RunFolder.create(root, f"{safe_name(algo)}_{safe_name(env)}", started)
            meta = self._new_meta(config, started, code_dir)
            self._csv = ProgressCsv(self.folder.progress_file)
        self.dir = self.folder.path
        self.checkpoints = CheckpointWriter(self.folder, best_score)
        self._episodes_file: IO[str] = open(self.folder.episodes_file, "a", newline="")  # noqa: SIM115
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
        self._tracker = (WandbTracker(tracking, self.dir, meta) if tracking is not None
                         else None)
        self._progress = (ProgressLine(f"{algo} {env}", self.train_column, total_frames,
                                       progress_interval, time_budget=time_budget)
                          if progress else None)

    def _new_meta(self, config: Any, started: datetime.datetime,
                  code_dir: str | Path | None) -> dict[str, Any]:
        """Writes a fresh folder's ``config.json`` and the header of ``episodes.csv``."""
        config_dict = {} if config is None else json_safe(config)
        if not isinstance(config_dict, dict):
            raise TypeError(f"RunLogger needs a config that is a dataclass instance, a mapping "
                            f"or None, got {type(config)}")
        meta = {
            "algo": self.algo,
            "env": self.env,
            "start_time": started.isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "git_commit": git_commit(code_dir if code_dir is not None else _PACKAGE_DIR),
            "argv": list(sys.argv),
            **({"launch": dict(self._launch)} if self._launch else {}),
            **({"sessions": [dict(self._session)]} if self._session else {}),
            "config": config_dict,
        }
        self.folder.config_file.write_text(json.dumps(meta, indent=2) + "\n")
        with open(self.folder.episodes_file, "w", newline="") as f:
            csv.writer(f).writerow(_EPISODE_FIELDS)
        return meta

    # ------------------------------------------------------------------ recording

    @property
    def episodes(self) -> int:
        """How many finished episodes were recorded."""
        return self._n_episodes

    @property
    def n_rows(self) -> int:
        """How many ``progress.csv`` rows were written."""
        return self._csv.n_rows

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def best_score(self) -> float | None:
        """The best checkpoint score so far (``None`` before the first)."""
        return self.checkpoints.best_score

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
        self._n_episodes += len(values)

    def train_return(self, last: int | None = None) -> float:
        """Mean return of the last ``last`` episodes (default: ``window``; at most the
        ``max(window, RETURNS_KEPT)`` the logger keeps); nan if none yet."""
        n = self.window if last is None else last
        if n < 1:
            raise ValueError(f"train_return: last must be >= 1, got {n}")
        kept = len(self._returns)
        recent = [self._returns[i] for i in range(max(0, kept - n), kept)]
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
        if self._tracker is not None:
            self._tracker.log(row)
        if self._progress is not None:
            self._progress.show(row, self._last_eval, now)
        return row

    def warn(self, text: str) -> None:
        """Shows a warning line in the progress output (stderr without a progress line)."""
        if self._progress is not None:
            self._progress.warn(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def checkpoint(self, state: dict[str, Any], score: float | None = None) -> None:
        """Save ``state`` to ``checkpoints/latest.pt``, and to ``best.pt`` when ``score`` is best
        (:meth:`CheckpointWriter.save <rlstruct.runs.checkpoint.CheckpointWriter.save>`).

        Raises:
            CheckpointError: a write failed (the file and the cause are named; the previous
                checkpoint is kept).
        """
        self._check_open("checkpoint")
        self.checkpoints.save(state, score)

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        """Writes ``summary.json`` (atomically); returns its path."""
        path = self.folder.summary_file
        tmp = path.with_name(path.name + ".tmp")
        # NaN and infinities are JSON null (no evaluation ran, no return yet), not strings.
        tmp.write_text(json.dumps(json_safe(dict(summary), nonfinite=None), indent=2) + "\n")
        os.replace(tmp, path)
        return path

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Flush and close the files, write ``returns.png``, close TensorBoard, send the plots
        to wandb and finish its run (bounded: :meth:`WandbTracker.finish
        <rlstruct.runs.tracking.WandbTracker.finish>`) (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._progress is not None:
                self._progress.close(self._csv.last_row, self._last_eval)
        finally:
            self._episodes_file.close()
            self._csv.close()
            if self._tb is not None:
                self._tb.close()
            try:
                self._plot()
            finally:
                if self._tracker is not None:
                    self._tracker.log_images([self.folder.returns_plot,
                                              self.folder.resources_plot], self.frames)
                    self._tracker.finish()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()  # on KeyboardInterrupt too; the exception then propagates

    # ------------------------------------------------------------------ internals

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise RuntimeError(f"RunLogger.{method} called after close() (run {self.dir})")

    def _write_row(self, row: dict[str, Any]) -> None:
        self._csv.write(row)

    def _resume(self, frames: int, started: datetime.datetime) -> dict[str, Any]:
        """Takes up the run folder ``self.folder`` at ``frames`` (see ``resume_dir``)."""
        folder = self.folder
        try:
            meta = json.loads(folder.config_file.read_text())
            with open(folder.episodes_file, newline="") as f:
                episodes = [r for r in csv.DictReader(f) if int(r["frames_at_record"]) <= frames]
            self._csv.resume(frames)
        except (OSError, ValueError, KeyError) as err:
            raise ConfigError(f"cannot resume {folder.path}: {type(err).__name__}: {err}") from err
        tmp = folder.episodes_file.with_name(folder.episodes_file.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=_EPISODE_FIELDS)
            writer.writeheader()
            writer.writerows(episodes)
        os.replace(tmp, folder.episodes_file)
        self._returns.extend(float(r["return"]) for r in episodes)
        self._n_episodes = len(episodes)
        self.frames = self._last_frames = frames
        meta.setdefault("resumes", []).append({
            "time": started.isoformat(timespec="seconds"), "frames": frames,
            "argv": list(sys.argv), **({"launch": dict(self._launch)} if self._launch else {}),
        })
        if self._session:  # (a folder older than the list: from this session on)
            meta.setdefault("sessions", []).append(dict(self._session))
        folder.config_file.write_text(json.dumps(meta, indent=2) + "\n")
        return meta

    def _plot(self) -> None:
        from rlstruct.runs.plotting import plot_runs

        if not self.folder.path.is_dir():
            return  # the folder was removed: RunFolderError says so
        try:
            plot_runs([self.dir], self.folder.returns_plot)
            if "cores_busy" in self._csv.header:
                from rlstruct.runs.monitor import resources_figure

                resources_figure(self.folder.progress_file, self.folder.resources_plot)
        except ImportError:
            warnings.warn(
                "matplotlib is not installed: skipping returns.png "
                "(pip install -e '.[plot]' in a clone, then: rlstruct plot RUN_DIR)",
                stacklevel=3,
            )
        except Exception as err:  # noqa: BLE001 - a plot never hides the run's own outcome
            warnings.warn(f"could not write {self.folder.returns_plot}: {err!r}", stacklevel=3)


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


def safe_name(name: str) -> str:
    """A file-name-safe version of ``name`` (``ALE/Pong-v5`` -> ``ALE-Pong-v5``), for the run
    folder's name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "run"


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
