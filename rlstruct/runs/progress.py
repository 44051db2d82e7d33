"""The progress line a run shows on stderr: :class:`ProgressLine`.

On a terminal the line is rewritten in place (at most about four times a second); otherwise
(log files, ``nohup``, CI) a plain line is written every ``interval`` seconds.
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
        interval: seconds between two plain lines when the stream is no terminal.
        stream: where to write (default: ``sys.stderr``).
    """

    def __init__(self, title: str, train_column: str, total_frames: int | None = None,
                 interval: float = 5.0, stream: IO[str] | None = None) -> None:
        self.title, self.train_column, self.total_frames = title, train_column, total_frames
        self.stream: IO[str] = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream)
        self.interval = _TTY_INTERVAL_S if self.tty else interval
        self._line_len = 0
        self._last_render = time.monotonic() if not self.tty else -math.inf

    def show(self, row: Mapping[str, Any], last_eval: float, now: float,
             force: bool = False) -> None:
        """Shows ``row`` (a progress row) if ``interval`` has passed since the last line (or
        ``force``); ``last_eval``: the last finished evaluation's return (nan: none yet)."""
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
        line = " | ".join(parts)
        if self.tty:  # rewrite in place; blank out the rest of a longer previous line
            pad = max(0, self._line_len - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._line_len = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._last_render = now

    def close(self, last_row: Mapping[str, Any] | None, last_eval: float) -> None:
        """On a terminal, shows the last row, then ends the line."""
        if self.tty and last_row is not None:
            self.show(last_row, last_eval, time.monotonic(), force=True)
        if self._line_len:
            self.stream.write("\n")
            self.stream.flush()


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False
