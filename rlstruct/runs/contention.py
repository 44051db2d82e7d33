"""A run that stalls because other jobs take its cores: :class:`ContentionWatch` reads the
progress rows of the resource monitor and says so, once.

The rule. A layout asks for some cores: the learner's torch threads (``--n-threads``; one
core when the learner is on a GPU) and one per worker process (``asked_cores``). A progress
row *stalls* when both hold:

- the machine is oversubscribed: its load average (``load_avg``: every process that runs or
  waits for a core, over the last minute) exceeds its cores;
- the run gets far less CPU than it asks for: ``cores_busy`` (the CPU seconds of the run's
  process tree per wall second) is below ``busy_ratio`` (one half) of the cores it asks for,
  or of the machine's cores when it asks for more.

The watch warns when the rows have stalled without a break for ``min_span_s`` seconds of the
run (30) and at least ``min_rows`` rows (3), leaving out the run's first ``skip_s`` seconds
(10: workers starting). On a quiet machine the load stays at or below the cores and nothing
fires; a run that asks for more cores than the machine has keeps them busy and does not fire
either: the rule needs other work *and* a run starved by it.

Example:
    >>> watch = ContentionWatch(asked=3, cores=2, n_threads=2)
    >>> rows = [{"wall_time": t, "cores_busy": 0.3, "load_avg": 4.0} for t in range(0, 60, 5)]
    >>> [t for t, row in zip(range(0, 60, 5), rows) if watch.update(row)]
    [40]
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["ContentionWatch", "asked_cores"]


def asked_cores(layout: Any, n_threads: int, learner_on_cpu: bool = True,
                cores: int | None = None) -> int | None:
    """The cores a run's layout asks of this machine: the learner's threads and the batcher's
    local worker processes (one thread each).

    Args:
        layout: the run's :class:`~rlstruct.runs.layout.LayoutConfig`.
        n_threads: the learner's torch threads (``RunConfig.n_threads``).
        learner_on_cpu: the learner computes on the CPU (False: a GPU; its process then asks
            one core).
        cores: the machine's cores (for ``n_processes=0``, one worker per core; default
            ``os.cpu_count()``).

    Returns:
        The cores asked for, or None where this machine's CPU share cannot be judged (workers
        that are Ray actors, which may run elsewhere).
    """
    if layout.backend != "local":
        return None
    cores = cores or os.cpu_count() or 1
    workers = 0
    if layout.batcher_device == "cpu" and (layout.n_processes != 1 or layout.pipeline > 1):
        workers = layout.n_processes or cores
    learner = max(1, n_threads) if learner_on_cpu else 1
    return learner * max(1, layout.n_learners) + workers


class ContentionWatch:
    """Watches a run's progress rows for a stall under contention (see the module notes).

    Args:
        asked: the cores the run asks for (:func:`asked_cores`); None: never warns.
        cores: the machine's cores (default ``os.cpu_count()``).
        n_threads: the learner's torch threads, named in the remedy.
        busy_ratio: a row stalls when ``cores_busy`` is below this share of the cores asked.
        min_span_s: seconds of run time the stall must last before the warning.
        min_rows: rows the stall must last before the warning.
        skip_s: seconds at the start of the session whose rows are not judged.
    """

    def __init__(self, asked: int | None, cores: int | None = None, n_threads: int = 1, *,
                 busy_ratio: float = 0.5, min_span_s: float = 30.0, min_rows: int = 3,
                 skip_s: float = 10.0) -> None:
        self.asked, self.cores = asked, cores or os.cpu_count() or 1
        self.n_threads, self.busy_ratio = n_threads, busy_ratio
        self.min_span_s, self.min_rows, self.skip_s = min_span_s, min_rows, skip_s
        self.warned = False
        self._first_wall: float | None = None
        self._stall: list[Mapping[str, Any]] = []  # the rows of the current stall

    def stalls(self, row: Mapping[str, Any]) -> bool:
        """Whether one row shows the run starved on an oversubscribed machine."""
        busy = row.get("cores_busy", math.nan)
        load = row.get("load_avg", math.nan)
        if self.asked is None or math.isnan(busy) or math.isnan(load):
            return False
        return load > self.cores and busy < self.busy_ratio * min(self.asked, self.cores)

    def update(self, row: Mapping[str, Any]) -> str | None:
        """Judges the next progress row; returns the warning the first time the stall has
        lasted long enough (None otherwise, and always after that)."""
        if self.warned:
            return None
        wall = float(row.get("wall_time", 0.0))
        if self._first_wall is None:
            self._first_wall = wall
        if wall - self._first_wall < self.skip_s or not self.stalls(row):
            self._stall.clear()
            return None
        self._stall.append(row)
        span = wall - float(self._stall[0]["wall_time"])
        if len(self._stall) < self.min_rows or span < self.min_span_s:
            return None
        self.warned = True
        return self.message(span)

    def message(self, span: float) -> str:
        """The warning of a stall of ``span`` seconds: the cause and the remedies."""
        busy = sum(r["cores_busy"] for r in self._stall) / len(self._stall)
        load = sum(r["load_avg"] for r in self._stall) / len(self._stall)
        remedies = ["`rlstruct tune --algo ...` on this machine under this load, then "
                    "--layout tune.json"]
        if self.n_threads > 1:
            remedies.insert(0, f"--n-threads 1 (now {self.n_threads})")
        return (f"rlstruct: warning: for {span:.0f} s this run kept {busy:.1f} cores busy of "
                f"the {self.asked} its layout asks for, while the machine's load average was "
                f"{load:.1f} on {self.cores} cores: other jobs take the cores, and threads "
                f"and workers that wait for each other stall. Try " + ", or ".join(remedies)
                + ".")
