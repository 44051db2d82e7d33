"""The progress line a run shows on stderr: :class:`ProgressLine`.

On a terminal the line is rewritten in place (at most about four times a second); otherwise
(log files, ``nohup``, CI) a plain line is written every ``interval`` seconds.

The line shows the frames (of the frame budget), the wall time, the speed, the training return,
the last evaluation, the cores the run keeps busy, the machine's load average (``load``: the
processes that run or wait for a core, over the last minute; above the core count, the run
competes for the machine), and an ETA: when the frame budget is reached at this session's mean
speed, or the time budget runs out, whichever comes first. :meth:`ProgressLine.warn` puts a
warning on a line of its own (a run starved of cores, :mod:`rlstruct.runs.contention`).

Example:
    >>> import io
    >>> line = ProgressLine("ppo CartPole-v1", "train_return_mean20", total_frames=10_000,
    ...                     time_budget=600, stream=io.StringIO())
    >>> row = {"frames": 1000, "wall_time": 10.0, "steps_per_s": 100.0,
    ...        "train_return_mean20": 21.5, "cores_busy": 1.5, "load_avg": 2.5}
    >>> line.show({**row, "frames": 0, "wall_time": 0.0}, float("nan"), now=0.0, force=True)
    >>> line.show(row, float("nan"), now=10.0, force=True)
    >>> line.stream.getvalue().splitlines()[-1].split(" | ")[-4:]
    ['train_return_mean20 21.50', '1.5 cores', 'load 2.5', 'ETA 1m30s']
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

__all__ = ["ProgressLine"]

_TTY_INTERVAL_S = 0.25  # at most ~4 progress-line updates per second on a terminal


class ProgressLine:
    """Shows a run's progress rows on a stream (see the module notes).

    Args:
        title: what the line starts with (``"ppo CartPole-v1"``).
        train_column: the training-return column of the rows (``train_return_mean20``).
        total_frames: the frame budget, shown as a percentage; None: frames only.
        time_budget: the time budget in seconds (the run's ``wall_time`` counts against it);
            None: none. The ETA is the sooner end of the two budgets.
        interval: seconds between two plain lines when the stream is no terminal.
        stream: where to write (default: ``sys.stderr``).
    """

    def __init__(self, title: str, train_column: str, total_frames: int | None = None,
                 interval: float = 5.0, stream: IO[str] | None = None,
                 time_budget: float | None = None) -> None:
        self.title, self.train_column, self.total_frames = title, train_column, total_frames
        self.time_budget = time_budget
        self._first: tuple[float, float] | None = None  # (frames, wall_time) of the first row
        self.stream: IO[str] = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream)
        self.interval = _TTY_INTERVAL_S if self.tty else interval
        self._line_len = 0
        self._last_render = time.monotonic() if not self.tty else -math.inf

    def show(self, row: Mapping[str, Any], last_eval: float, now: float,
             force: bool = False) -> None:
        """Shows ``row`` (a progress row) if ``interval`` has passed since the last line (or
        ``force``); ``last_eval``: the last finished evaluation's return (nan: none yet)."""
        if self._first is None:
            self._first = (row["frames"], row["wall_time"])
        if not force and now - self._last_render < self.interval:
            return
        frames = row["frames"]
        parts = [self.title, f"{frames:,}"]
        if self.total_frames:
            parts[-1] += f"/{self.total_frames:,} frames ({100 * frames / self.total_frames:.0f}%)"
        else:
            parts[-1] += " frames"
        parts.append(f"{row['wall_time']:.0f} s")
        parts.append(f"{row['steps_per_s']:,.0f} steps/s")
        parts.append(f"{self.train_column} {row[self.train_column]:.2f}")
        if not math.isnan(last_eval):
            parts.append(f"last eval {last_eval:.2f}")
        if "cores_busy" in row and not math.isnan(row["cores_busy"]):
            parts.append(f"{row['cores_busy']:.1f} cores")
        load = row.get("load_avg", math.nan)
        if not math.isnan(load):
            parts.append(f"load {load:.1f}")
        eta = self.eta(frames, row["wall_time"])
        if eta is not None:
            parts.append(f"ETA {_duration(eta)}")
        line = " | ".join(parts)
        if self.tty:  # rewrite in place; blank out the rest of a longer previous line
            pad = max(0, self._line_len - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._line_len = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._last_render = now

    def warn(self, text: str) -> None:
        """Writes ``text`` as a line of its own (on a terminal, the line being rewritten ends
        first, and the next row starts a new one)."""
        if self._line_len:
            self.stream.write("\n")
            self._line_len = 0
        self.stream.write(text + "\n")
        self.stream.flush()

    def eta(self, frames: float, wall_time: float) -> float | None:
        """Seconds until the run ends at ``frames`` and ``wall_time``: the frame budget at this
        session's mean speed since its first row, or the time budget, whichever comes first;
        None without a budget, or before the speed is known."""
        ends = []
        if self.time_budget:
            ends.append(max(0.0, self.time_budget - wall_time))
        if self.total_frames and self._first is not None:
            frames0, wall0 = self._first
            if frames > frames0 and wall_time > wall0:
                speed = (frames - frames0) / (wall_time - wall0)
                ends.append(max(0.0, self.total_frames - frames) / speed)
        return min(ends) if ends else None

    def close(self, last_row: Mapping[str, Any] | None, last_eval: float) -> None:
        """On a terminal, shows the last row, then ends the line."""
        if self.tty and last_row is not None:
            self.show(last_row, last_eval, time.monotonic(), force=True)
        if self._line_len:
            self.stream.write("\n")
            self.stream.flush()


def _duration(seconds: float) -> str:
    """``95`` -> ``1m35s``, ``4000`` -> ``1h06m``, ``42`` -> ``42s``."""
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False
