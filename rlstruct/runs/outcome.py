"""What a run's ``summary.json`` says, and the line a run prints at its end (for
:class:`~rlstruct.runs.run.Run`)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlstruct.runs.logger import RunLogger

__all__ = ["STATUS", "RunRecord", "run_summary", "write_summary", "describe"]

#: ``summary["status"]`` for each ``stopped_by``; an exception other than Ctrl-C is ``failed``.
STATUS = {"target_return": "solved", "max_frames": "budget", "time_budget": "budget",
          "interrupted": "interrupted", "loop_end": "ended"}


@dataclass(frozen=True)
class RunRecord:
    """What a run on its way out knows of itself, for :func:`run_summary`
    (:meth:`Run.record_of <rlstruct.runs.run.Run.record_of>` makes it).

    Attributes:
        algo: the algorithm's name.
        run_dir: the run folder.
        stopped_by: how the run stopped (None: it did not).
        solved_at: ``(frames, seconds)`` when the stop test found it solved, else None.
        frames: environment frames recorded; ``iterations``: iterations ended.
        episodes: finished training episodes.
        train_column: ``train_return_mean<N>``; ``train_return``: its value.
        eval_return: the last finished evaluation's mean return (nan: none).
        wall_time: seconds since the run started (resumed runs: since the first start).
        resumes: how many times the run was resumed.
        launch: how the run was launched.
        checkpoint: the frames and iteration ``checkpoints/latest.pt`` holds (None: none).
        ray_nodes: the nodes of the training batcher's Ray actors (empty: not Ray).
        stop: the stop signal's message (``"Terminated: signal SIGTERM"``), or None.
        after_signal: an error that followed the stop signal, or None.
        cause: a failure found after a signal (a torchrun rank died), or None.
        checkpoint_error: why the final checkpoint could not be written, or None.
    """

    algo: str
    run_dir: str
    stopped_by: str | None
    solved_at: tuple[int, float] | None
    frames: int
    iterations: int
    episodes: int
    train_column: str
    train_return: float
    eval_return: float
    wall_time: float
    resumes: int
    launch: dict[str, Any]
    checkpoint: dict[str, int] | None
    ray_nodes: tuple[Any, ...] = ()
    stop: str | None = None
    after_signal: str | None = None
    cause: str | None = None
    checkpoint_error: str | None = None


def run_summary(run: RunRecord, finish: bool, exc: BaseException | None) -> dict[str, Any]:
    """The summary of a run on its way out.

    Args:
        run: what the run knows of itself.
        finish: the run ended as it should (a stop test, the loop's end, a signal).
        exc: the exception it ended with, if any.

    Returns:
        The counters and returns, ``status`` (``failed`` for an exception other than a signal,
        and for a signal caused by a torchrun rank's death, then named in ``error``),
        ``error``, and ``checkpoint``: the frames and iteration ``checkpoints/latest.pt``
        holds (``checkpoint_error`` when the final one could not be written).
    """
    # Solved is how this run stopped: the line it prints (describe) and summary.json agree.
    solved = run.solved_at if run.stopped_by == "target_return" else None
    summary: dict[str, Any] = {
        "algo": run.algo,
        "run_dir": run.run_dir,
        "stopped_by": run.stopped_by,
        "solved": solved is not None,
        "frames": run.frames,
        "iterations": run.iterations,
        "episodes": run.episodes,
        run.train_column: run.train_return,
        "eval_return": run.eval_return,
        "wall_time": run.wall_time,
        "frames_to_solve": None if solved is None else solved[0],
        "time_to_solve": None if solved is None else solved[1],
        "resumes": run.resumes,
        "launch": run.launch,
        "checkpoint": run.checkpoint,
    }
    if run.ray_nodes:  # RayBatcher: each actor's node
        summary["ray_nodes"] = len(set(run.ray_nodes) - {None})
    summary["status"] = STATUS.get(run.stopped_by or "", "ended") if finish else "failed"
    if run.after_signal is not None:  # what went wrong in the stop, for the record
        summary["error"] = f"{run.stop} (then {run.after_signal})"
    elif exc is not None:
        summary["error"] = f"{type(exc).__name__}: {exc}"
    elif run.stopped_by == "interrupted" and run.stop is not None:
        summary["error"] = run.stop
    if run.cause is not None:  # the signal was the consequence of a rank's death
        summary["status"], summary["error"] = "failed", run.cause
    if run.checkpoint_error is not None:
        summary["checkpoint_error"] = run.checkpoint_error
    return summary


def write_summary(logger: RunLogger, summary: Mapping[str, Any]) -> None:
    """Writes ``summary.json`` with ``logger``; a failed write (a full disk) is a warning, which
    never hides the run's own outcome; none where the run folder was removed (the run's
    :class:`~rlstruct.errors.RunFolderError` says so)."""
    if not logger.folder.path.is_dir():
        return
    try:
        logger.write_summary(summary)
    except OSError as err:  # e.g. a full disk: never hide the run's own outcome
        warnings.warn(f"could not write {logger.folder.summary_file}: {err}", stacklevel=3)


def describe(algo: str, s: dict[str, Any], column: str) -> str:
    """The run's last line: how it stopped, after how many frames, seconds and iterations, and
    its returns."""
    how = "solved" if s["solved"] else f"stopped by {s['stopped_by']}"
    when = s["time_to_solve"] if s["solved"] else s["wall_time"]
    return (
        f"{algo}: {how} after {s['frames']:,} frames, {when:.1f} s, {s['iterations']} iterations;"
        f" {column} {s[column]:.2f}, last eval_return {s['eval_return']:.2f}"
    )
