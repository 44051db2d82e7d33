"""A run's ``progress.csv`` as it is written: :class:`ProgressCsv`.

Rows are appended and flushed one by one. A column first seen after the first row widens the
header: the file is rewritten once with the union of the columns (earlier rows get ``nan``
there), reading its rows back from the disk. Nothing but the last row is kept in memory, so a
run of millions of iterations holds as much as a run of ten (issue 38).

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "progress.csv"
    >>> csv_file = ProgressCsv(path)
    >>> csv_file.write({"frames": 10, "loss": 0.5})
    >>> csv_file.write({"frames": 20, "loss": 0.25, "eval_return": 9.0})
    >>> csv_file.close()
    >>> print(path.read_text().replace("\\r", ""), end="")
    frames,loss,eval_return
    10,0.5,nan
    20,0.25,9.0
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import IO, Any

__all__ = ["ProgressCsv"]


class ProgressCsv:
    """Appends rows to a ``progress.csv``, widening its header when a new column appears.

    Args:
        path: the file (created at the first row, or taken up by :meth:`resume`).

    Attributes:
        header: the columns, in order of first appearance.
        last_row: the last row written (or kept by :meth:`resume`); None before.
        n_rows: how many rows the file holds.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.header: list[str] = []
        self.last_row: dict[str, Any] | None = None
        self.n_rows = 0
        self._file: IO[str] | None = None
        self._writer: csv.DictWriter | None = None

    def resume(self, frames: int) -> None:
        """Takes up an existing file: keeps its rows up to ``frames`` (those written after the
        checkpoint being resumed are dropped) and appends from there.

        Raises:
            OSError: the file cannot be read or rewritten.
            KeyError, ValueError: a row without a readable ``frames``.
        """
        if not self.path.is_file():
            return
        with open(self.path, newline="") as f:
            reader = csv.DictReader(f)
            self.header = list(reader.fieldnames or [])
            for row in reader:
                if int(row["frames"]) <= frames:
                    self.last_row = {k: _number(v) for k, v in row.items()}
                    self.n_rows += 1
        self._rewrite(None, keep_up_to=frames)

    def write(self, row: dict[str, Any]) -> None:
        """Appends ``row`` (flushed); a new column rewrites the file under the wider header."""
        new_keys = [k for k in row if k not in self.header]
        if self._writer is None or new_keys:
            self.header += new_keys
            self._rewrite(row)
        else:
            self._writer.writerow(row)
        assert self._file is not None
        self._file.flush()
        self.last_row, self.n_rows = row, self.n_rows + 1

    def close(self) -> None:
        """Closes the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = self._writer = None

    def _rewrite(self, row: dict[str, Any] | None, keep_up_to: float = math.inf) -> None:
        """Rewrites the file (atomically) under the current header: its rows up to
        ``keep_up_to`` frames, read back from the disk, then ``row``; then appends from there."""
        self.close()
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.header, restval="nan")
            writer.writeheader()
            if self.path.is_file():
                with open(self.path, newline="") as old:
                    writer.writerows(r for r in csv.DictReader(old)
                                     if int(r["frames"]) <= keep_up_to)
            if row is not None:
                writer.writerow(row)
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", newline="")  # noqa: SIM115
        self._writer = csv.DictWriter(self._file, fieldnames=self.header, restval="nan")


def _number(text: str) -> Any:
    """A CSV cell as an int, a float, or the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
