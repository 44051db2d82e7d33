"""Helpers shared by the benchmark scripts: thread pinning, summaries, process-tree CPU and memory.

Nothing here imports torch at module level, so that a script can pin the thread counts (which
must happen before torch starts its pool) and then import this module, or the other way round.

* :func:`pin_threads` -- ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` (for processes started later)
  and ``torch.set_num_threads`` (this process), as BENCHMARKS.md asks.
* :func:`summarize` -- min / median / max of repeated samples.
* :func:`environment` -- versions, thread settings and machine facts for the JSON output.
* :class:`TreeMeter` -- CPU time (in cores) and peak RSS of a process and all its descendants
  over a measured window (psutil + ``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import psutil

__all__ = ["pin_threads", "summarize", "median_row", "environment", "TreeMeter", "Window", "MB"]

MB = 1024 * 1024


def pin_threads(n: int = 1) -> None:
    """Pins the thread pools: env vars (inherited by child processes) and torch in this process.

    Call it before torch is imported for ``OMP_NUM_THREADS`` to reach this process's pool too
    (``torch.set_num_threads`` is applied in any case).
    """
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    import torch

    torch.set_num_threads(n)


def summarize(samples: Iterable[float]) -> dict[str, float]:
    """``{"min", "median", "max", "n"}`` of the samples."""
    s = list(samples)
    if not s:
        raise ValueError("summarize() needs at least one sample")
    return {"min": min(s), "median": statistics.median(s), "max": max(s), "n": len(s)}


def median_row(runs: list[dict[str, float]]) -> dict[str, object]:
    """One side's figures over repeated runs: the median of each key the runs share, and the
    runs themselves (``runs``), so that the spread is in the output beside the median.

    Examples:
        >>> row = median_row([{"frames_per_s": 90.0}, {"frames_per_s": 120.0},
        ...                   {"frames_per_s": 100.0}])
        >>> row["frames_per_s"], len(row["runs"])
        (100.0, 3)
    """
    if not runs:
        raise ValueError("median_row() needs at least one run")
    keys = [k for k in runs[0] if all(isinstance(r.get(k), int | float) for r in runs)]
    return {**{k: statistics.median(r[k] for r in runs) for k in keys}, "runs": runs}


def environment(**extra: object) -> dict[str, object]:
    """What the results depend on: versions, thread settings, machine."""
    import torch

    try:
        load = os.getloadavg()
    except OSError:  # pragma: no cover - not on Linux
        load = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"),
        "cuda": torch.cuda.is_available(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "loadavg_at_start": load,
        **extra,
    }


# ------------------------------------------------------------------------- process-tree meter
def _cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def _reset_peak(pid: int) -> bool:
    """Resets the kernel's peak-RSS mark (VmHWM) of ``pid`` to its current RSS (Linux >= 4.0)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss(proc: psutil.Process) -> int:
    """VmHWM (peak RSS) of ``proc`` in bytes; its current RSS where /proc has no VmHWM."""
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return proc.memory_info().rss


@dataclass
class Window:
    """What :class:`TreeMeter` measured over one window."""

    wall_s: float
    cpu_s: float  # CPU seconds (user + system) of every process of the tree
    cores: float  # cpu_s / wall_s: how many cores the tree kept busy on average
    peak_rss_bytes: int  # sum over the tree of each process's peak RSS within the window
    n_procs: int
    peak_method: str  # "VmHWM" (reset at the window start) or "rss_at_end" (fallback)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class TreeMeter:
    """CPU use and peak memory of a process and all its descendants over a window.

    ``start()`` snapshots the CPU times of the tree and resets each process's peak-RSS mark;
    ``stop()`` returns a :class:`Window`. CPU seconds count the processes alive at ``start``
    (and, fully, any started inside the window). Peak RSS is the sum of every process's own
    peak (an upper bound of the tree's simultaneous peak; shared pages, such as a shared-memory
    buffer, count once per process that touched them, as ``ps`` counts them).

    Args:
        pid: the root process (default: this one).
    """

    def __init__(self, pid: int | None = None) -> None:
        self.root = psutil.Process(pid)
        self._cpu0: dict[int, float] = {}
        self._procs: dict[int, psutil.Process] = {}
        self._reset_ok = False
        self._t0 = 0.0

    def procs(self) -> list[psutil.Process]:
        """The root and every live descendant."""
        return [self.root, *self.root.children(recursive=True)]

    def start(self) -> None:
        procs = self.procs()
        self._procs = {p.pid: p for p in procs}
        self._reset_ok = all([_reset_peak(p.pid) for p in procs])
        self._cpu0 = {}
        for p in procs:
            with contextlib.suppress(psutil.Error):
                self._cpu0[p.pid] = _cpu_seconds(p)
        self._t0 = time.perf_counter()

    def stop(self) -> Window:
        wall = time.perf_counter() - self._t0
        cpu, peak, n = 0.0, 0, 0
        for p in self.procs():
            try:
                cpu += _cpu_seconds(p) - self._cpu0.get(p.pid, 0.0)
                peak += _peak_rss(p) if self._reset_ok else p.memory_info().rss
                n += 1
            except psutil.Error:  # exited meanwhile
                pass
        return Window(
            wall_s=wall, cpu_s=cpu, cores=cpu / wall if wall > 0 else 0.0,
            peak_rss_bytes=peak, n_procs=n,
            peak_method="VmHWM" if self._reset_ok else "rss_at_end",
        )

    def pss_bytes(self) -> int | None:
        """Proportional set size of the tree now (shared pages split between their users)."""
        total = 0
        try:
            for p in self.procs():
                total += p.memory_full_info().pss
        except (psutil.Error, AttributeError):
            return None
        return total
