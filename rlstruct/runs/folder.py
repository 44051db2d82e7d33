"""A run folder: every path of a run, defined once, and the one reader that plotting and
sweeps share.

:class:`RunFolder` names each file of a run (``config.json``, ``progress.csv``,
``episodes.csv``, ``checkpoints/`` with ``latest.pt``, ``best.pt`` and the resume files such as
``buffer.pt``, ``summary.json``, the plots); the writers (:class:`~rlstruct.runs.logger.RunLogger`,
:class:`~rlstruct.runs.checkpoint.CheckpointWriter`) and the readers (``--resume``,
``rlstruct evaluate``, :func:`rlstruct.load_policy`) take their paths from it.
:meth:`RunFolder.create` makes a fresh run folder and :meth:`RunFolder.make_checkpoints` its
``checkpoints/`` folder, each once.

Read back (:func:`read_run`), ``summary.json``'s ``status`` says how the run ended (``failed``,
``interrupted``, ``solved`` or ``budget``). Any file may be missing (a run that failed at
start-up, a run still going, a folder written before ``summary.json`` existed); the reader then
gives empty rows, ``{}`` and ``status`` None.

Example:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "progress.csv").write_text("frames,train_return_mean20\\n10,1.5\\n20,\\n")
    >>> run = read_run(folder)
    >>> run.train_column, run.series(run.train_column), run.status
    ('train_return_mean20', [(10.0, 1.5)], None)
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlstruct.errors import RunFileError, RunFolderError

__all__ = ["RunFolder", "read_run", "read_rows", "to_float", "is_run_dir", "find_runs",
           "CHECKPOINTS", "CHECKPOINT_NAMES", "RUN_FILES"]

_TRAIN_COLUMN = re.compile(r"^train_return_mean\d+$")

#: The folder of a run's checkpoints, inside the run folder.
CHECKPOINTS = "checkpoints"
#: The checkpoints a run writes: the last one, and the one of the best training return.
CHECKPOINT_NAMES = ("latest", "best")


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The rows of a CSV file as dicts; ``[]`` when the file is missing.

    Raises:
        RunFileError: the file is not UTF-8 text, or cannot be read (both named).
    """
    path = Path(path)
    if not path.is_file():
        return []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except UnicodeDecodeError as err:
        raise RunFileError(f"{path} is not a CSV file of UTF-8 text ({err}); rlstruct writes "
                           "it as UTF-8: was it written or changed by another program?") from err
    except (OSError, csv.Error) as err:
        raise RunFileError(f"cannot read {path}: {type(err).__name__}: {err}") from err


def to_float(text: str | None) -> float:
    """A CSV cell as a float; nan for an empty, missing or unreadable cell."""
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass
class RunFolder:
    """One run folder: its paths (for writers and readers alike) and, read back by
    :func:`read_run`, its contents.

    Attributes:
        path: the folder.
        progress: the rows of ``progress.csv`` (``[]`` when missing or not read).
        config: the ``"config"`` entry of ``config.json`` (``{}`` when missing or not read).
        summary: ``summary.json`` (``{}`` while the run goes on, or in older folders).
    """

    path: Path
    progress: list[dict[str, str]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    _made_checkpoints: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    @classmethod
    def create(cls, root: str | Path, stem: str, started: datetime.datetime) -> RunFolder:
        """Makes a fresh run folder ``<root>/<stem>_<YYYYmmdd-HHMMSS>[-n]`` (``root`` too).

        Raises:
            FileExistsError: no free name (10,000 runs started in the same second).
        """
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        base = f"{stem}_{started.strftime('%Y%m%d-%H%M%S')}"
        for n in range(10_000):
            path = root / (base if n == 0 else f"{base}-{n}")
            try:
                path.mkdir()  # atomic: two runs started in the same second get distinct dirs
            except FileExistsError:
                continue
            return cls(path)
        raise FileExistsError(f"no free run directory name for {root / base}")

    @property
    def name(self) -> str:
        """The folder's name."""
        return self.path.name

    @property
    def config_file(self) -> Path:
        """``config.json``: the config, versions, argv, git commit, resumes, sessions."""
        return self.path / "config.json"

    @property
    def progress_file(self) -> Path:
        """``progress.csv``: one row per iteration, at most one every ``progress_every_s``."""
        return self.path / "progress.csv"

    @property
    def episodes_file(self) -> Path:
        """``episodes.csv``: one row per finished episode."""
        return self.path / "episodes.csv"

    @property
    def summary_file(self) -> Path:
        """``summary.json``: the outcome."""
        return self.path / "summary.json"

    @property
    def returns_plot(self) -> Path:
        """``returns.png``: the training and evaluation returns."""
        return self.path / "returns.png"

    @property
    def resources_plot(self) -> Path:
        """``resources.png``: cores, memory and GPU use per iteration."""
        return self.path / "resources.png"

    @property
    def checkpoints(self) -> Path:
        """``checkpoints/``: the checkpoints and the resume files."""
        return self.path / CHECKPOINTS

    def checkpoint(self, name: str = "latest") -> Path:
        """``checkpoints/<name>.pt``: ``latest``, ``best`` or a resume file (``buffer``)."""
        return self.checkpoints / f"{name}.pt"

    def require(self, what: str) -> None:
        """Checks that the folder still exists before ``what`` is written to it.

        Raises:
            RunFolderError: the folder was removed (or moved) since the run created it.
        """
        if not self.path.is_dir():
            raise RunFolderError(
                f"the run folder {self.path} was removed while the run was going on, so the "
                f"run cannot write {what}; it stops here (a run keeps its folder until it ends: "
                "move or delete it afterwards)")

    def make_checkpoints(self) -> Path:
        """Creates ``checkpoints/`` (once per object) and returns it.

        Raises:
            RunFolderError: the run folder itself was removed.
        """
        self.require("checkpoints/")
        if not self._made_checkpoints:
            self.checkpoints.mkdir(exist_ok=True)
            self._made_checkpoints = True
        return self.checkpoints

    @property
    def status(self) -> str | None:
        """How the run ended (``summary.json``'s ``status``); None when it does not say."""
        status = self.summary.get("status")
        return str(status) if status else None

    @property
    def train_column(self) -> str:
        """The training-return column: ``train_return_mean<N>`` (``train_return`` in runs
        written before it was named)."""
        header = self.progress[0] if self.progress else {}
        return next((c for c in header if _TRAIN_COLUMN.match(c)), "train_return")

    def series(self, column: str, x: str = "frames") -> list[tuple[float, float]]:
        """``(x, value)`` of the progress rows where ``column`` (and the ``x`` column:
        ``frames``, or ``wall_time``) has a value."""
        points = [(to_float(r.get(x)), to_float(r.get(column))) for r in self.progress]
        return [(f, v) for f, v in points if not (math.isnan(f) or math.isnan(v))]

    def episode_points(self) -> list[tuple[float, float]]:
        """``(frames_at_record, return)`` of every finished episode (``episodes.csv``)."""
        points = [(to_float(r.get("frames_at_record")), to_float(r.get("return")))
                  for r in read_rows(self.episodes_file)]
        return [(f, v) for f, v in points if not (math.isnan(f) or math.isnan(v))]


def read_run(path: str | Path) -> RunFolder:
    """Reads ``progress.csv``, ``config.json``'s config and ``summary.json`` of a run folder
    (each may be missing; ``episodes.csv`` is read on demand by
    :meth:`RunFolder.episode_points`)."""
    folder = RunFolder(Path(path))
    config = _read_json(folder.config_file).get("config", {})
    folder.progress = read_rows(folder.progress_file)
    folder.config = config if isinstance(config, dict) else {}
    folder.summary = _read_json(folder.summary_file)
    return folder


#: The files of which any one makes a folder a run folder.
RUN_FILES: tuple[str, ...] = ("progress.csv", "episodes.csv", "config.json", "summary.json")


def is_run_dir(path: str | Path) -> bool:
    """True if ``path`` holds one of :data:`RUN_FILES` (a run that failed at start-up may hold
    only ``config.json``)."""
    path = Path(path)
    return any((path / name).is_file() for name in RUN_FILES)


#: How deep :func:`find_runs` looks for run folders below a path: a sweep's are three levels
#: down (``OUT/trial0/session0/<run>``).
FIND_DEPTH = 3


def _runs_below(folder: Path, depth: int) -> list[Path]:
    """The run folders below ``folder`` (not itself), ``depth`` levels at most, sorted by path;
    a run folder's own subfolders (``checkpoints/``) and hidden folders are not entered."""
    runs: list[Path] = []
    try:
        children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:  # unreadable: nothing found there
        return runs
    for child in children:
        if is_run_dir(child):
            runs.append(child)
        elif depth > 1:
            runs += _runs_below(child, depth - 1)
    return runs


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """The run directories named by ``paths``: each path is a run directory, or a folder whose
    run directories, up to :data:`FIND_DEPTH` levels down (a folder of runs such as ``runs/``,
    or a sweep's ``--out`` folder, its sessions' runs in ``trial<t>/session<s>/``), are taken,
    sorted by path.

    Raises:
        FileNotFoundError: a path does not exist, or is neither a run directory nor a folder
            holding one.
    """
    runs: list[Path] = []
    for path in map(Path, paths):
        if is_run_dir(path):
            runs.append(path)
            continue
        inside = _runs_below(path, FIND_DEPTH) if path.is_dir() else []
        if not inside:
            raise FileNotFoundError(
                f"{path} is not a run directory (none of {', '.join(RUN_FILES)}) nor a folder "
                f"of run directories (looked {FIND_DEPTH} levels down)"
            )
        runs.extend(inside)
    return runs
