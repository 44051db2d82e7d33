"""What a run's ``summary.json`` says, and the line a run prints at its end (for
:class:`~rlstruct.runs.run.Run`)."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["STATUS", "run_summary", "describe"]

#: ``summary["status"]`` for each ``stopped_by``; an exception other than Ctrl-C is ``failed``.
STATUS = {"target_return": "solved", "max_frames": "budget", "time_budget": "budget",
          "interrupted": "interrupted", "loop_end": "ended"}


def run_summary(run: Any, finish: bool, exc: BaseException | None) -> dict[str, Any]:
    """The summary of ``run`` (a :class:`~rlstruct.runs.run.Run` on its way out).

    Args:
        run: the run.
        finish: the run ended as it should (a stop test, the loop's end, a signal).
        exc: the exception it ended with, if any.

    Returns:
        The counters and returns, ``status`` (``failed`` for an exception other than a signal,
        and for a signal caused by a torchrun rank's death, then named in ``error``),
        ``error``, and ``checkpoint``: the frames and iteration ``checkpoints/latest.pt``
        holds (``checkpoint_error`` when the final one could not be written).
    """
    solved, logger = run._solved_at, run.logger
    summary: dict[str, Any] = {
        "algo": run.algo,
        "run_dir": str(logger.dir),
        "stopped_by": run.stopped_by,
        "solved": solved is not None,
        "frames": run.frames,
        "iterations": run.iteration,
        "episodes": logger.episodes,
        logger.train_column: logger.train_return(),
        "eval_return": run.eval_return,
        "wall_time": time.monotonic() - run.start,
        "frames_to_solve": None if solved is None else solved[0],
        "time_to_solve": None if solved is None else solved[1],
        "resumes": run.n_resumes,
        "launch": run.launch,
        "checkpoint": run._checkpointed,
    }
    nodes = getattr(run._training_batcher, "nodes", None)  # RayBatcher: each actor's node
    if nodes:
        summary["ray_nodes"] = len(set(nodes) - {None})
    summary["status"] = STATUS.get(run.stopped_by or "", "ended") if finish else "failed"
    if run._after_signal is not None:  # what went wrong in the stop, for the record
        summary["error"] = f"Terminated: {run.signals.stop_now()} (then {run._after_signal})"
    elif exc is not None:
        summary["error"] = f"{type(exc).__name__}: {exc}"
    elif run.stopped_by == "interrupted" and run.signals.requested:
        summary["error"] = f"Terminated: {run.signals.stop_now()}"
    if run._cause is not None:  # the signal was the consequence of a rank's death
        summary["status"], summary["error"] = "failed", run._cause
    if run._checkpoint_error is not None:
        summary["checkpoint_error"] = run._checkpoint_error
    return summary


def describe(algo: str, s: dict[str, Any], column: str) -> str:
    """The run's last line: how it stopped, after how many frames, seconds and iterations, and
    its returns."""
    how = "solved" if s["solved"] else f"stopped by {s['stopped_by']}"
    when = s["time_to_solve"] if s["solved"] else s["wall_time"]
    return (
        f"{algo}: {how} after {s['frames']:,} frames, {when:.1f} s, {s['iterations']} iterations;"
        f" {column} {s[column]:.2f}, last eval_return {s['eval_return']:.2f}"
    )
