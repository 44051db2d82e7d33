"""A running session's learning curve, read from its run's ``progress.csv`` as the run writes it.

The run (:class:`~rlstruct.runs.progress_csv.ProgressCsv`) appends one flushed row per
iteration and rewrites the file atomically when a column appears; a reader may still catch a row
half written, so the text after the last newline is left for the next read. The curve is the
``frames`` column against the train return, ``train_return_mean<N>`` (nan until ``N`` episodes
ended). :class:`SessionCurve` finds the session's run folder (its one run directory, as the sweep
does) and re-reads the file only when its size changed.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "progress.csv"
    >>> _ = path.write_text("frames,train_return_mean20,lr\\n100,nan,0.1\\n200,12.5,0.1\\n300,1")
    >>> read_curve(path)
    [(100, nan), (200, 12.5)]
"""

from __future__ import annotations

import bisect
import csv
import io
import math
import re
from pathlib import Path

from rlstruct.tools.sessions import find_run_dir

__all__ = ["SessionCurve", "read_curve", "TRAIN_RETURN"]

#: The train return column of ``progress.csv`` (``train_return_mean20``).
TRAIN_RETURN = re.compile(r"^train_return_mean\d+$")


def read_curve(path: str | Path) -> list[tuple[int, float]]:
    """``(frames, train return)`` of each whole row of a ``progress.csv``, in file order.

    Args:
        path: the file.

    Returns:
        The rows' frames and train return (nan where the run had none yet, or the file has no
        train return column); ``[]`` when the file is missing, empty or has no ``frames``
        column. A last row without its newline (being written) is left out.
    """
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    text = text[:text.rfind("\n") + 1]
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None) or []
    if "frames" not in header:
        return []
    at = header.index("frames")
    column = next((i for i, name in enumerate(header) if TRAIN_RETURN.match(name)), None)
    points = []
    for row in rows:
        try:
            frames = int(float(row[at]))
        except (ValueError, IndexError):
            continue
        try:
            value = float(row[column]) if column is not None else math.nan
        except (ValueError, IndexError):
            value = math.nan
        points.append((frames, value))
    return points


class SessionCurve:
    """The learning curve of the session whose ``--runs-dir`` is ``folder``, as it grows.

    Args:
        folder: the session's folder (its run directory appears in it once the run starts).

    Attributes:
        points: ``(frames, train return)`` per row read so far (:func:`read_curve`).
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.points: list[tuple[int, float]] = []
        self._path: Path | None = None
        self._size = -1

    def update(self) -> None:
        """Reads the rows written since the last call (the whole file, when its size
        changed)."""
        if self._path is None:
            try:
                run_dir = find_run_dir(self.folder)
            except FileNotFoundError:  # not one session's folder: no curve
                return
            if run_dir is None:
                return
            self._path = run_dir / "progress.csv"
        try:
            size = self._path.stat().st_size
        except OSError:
            return
        if size != self._size:
            self._size, self.points = size, read_curve(self._path)

    @property
    def frames(self) -> int:
        """The frames of the last row read (0 before the first)."""
        return self.points[-1][0] if self.points else 0

    def value_at(self, frames: int) -> float:
        """The train return of the last row at or before ``frames`` that has one (nan: none).

        Example:
            >>> curve = SessionCurve("unused")
            >>> curve.points = [(100, 5.0), (200, math.nan), (300, 9.0)]
            >>> curve.value_at(250), curve.value_at(300), curve.value_at(50)
            (5.0, 9.0, nan)
        """
        i = bisect.bisect_right([f for f, _ in self.points], frames)
        for _, value in reversed(self.points[:i]):
            if math.isfinite(value):
                return value
        return math.nan
