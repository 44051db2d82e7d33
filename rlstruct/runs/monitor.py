"""Resource use per training iteration: time per phase, cores busy, memory, GPU use.

A :class:`ResourceMonitor` is sampled by the training loop itself, once per progress row
(:meth:`ResourceMonitor.sample`: each iteration, at most every ``progress_every_s``); it never
starts a thread. Each sample returns named columns for ``progress.csv`` covering the interval
since the previous sample:

- ``collect_s``, ``learn_s``: wall seconds spent inside ``with monitor.phase("collect")`` (the
  Run scaffold wraps ``batcher.get()``) and ``phase("learn")`` (the loop body); any other phase
  name ``x`` gives an ``x_s`` column.
- ``wait_s``: wall seconds of the timed phases during which the main process used no CPU (wall
  minus main-process CPU, per phase, >= 0): with worker processes most of ``collect_s`` is
  waiting for them; with a ``SerialBatcher`` collection is CPU work and ``wait_s`` stays near 0.
- ``cores_busy``: CPU seconds of the whole process tree (this process and every descendant:
  batcher workers, forkserver, evaluator) per wall second, averaged over the row's interval or
  the last ``window_s`` seconds (1 s), whichever is longer; 1.0 is one core fully busy. The
  tree's part never exceeds the machine's cores (``os.cpu_count()``).
- ``cores_main``, ``cores_workers``: the parts of ``cores_busy`` used by this process (all its
  threads) and by every other process of the tree; batcher workers that run outside the tree
  (Ray actors of another machine or cluster) count too, with the CPU time each reports with
  its segments (:meth:`ResourceMonitor.watch`).
- ``steps_per_cpu_s``: frames per CPU second of the tree (the efficiency of a layout).
- ``load_avg``: the machine's load average over the last minute (``os.getloadavg``: every
  process of the machine that runs or waits for a core; nan where the system does not tell).
  Above the core count, the run competes with other work for the machine; ``cores_busy`` well
  below the cores and a low load mean the layout leaves cores idle.
- ``rss_mb``: resident memory of the tree in MiB (pages shared by forked workers are counted
  once per process, so this over-counts).
- ``gpu<k>_util``, ``gpu<k>_mem_mb``: utilisation (%) and used memory (MiB) of GPU ``k`` (the
  CUDA index under ``CUDA_VISIBLE_DEVICES``), whole-device figures; only when nvidia-ml-py
  (``pynvml``) imports and NVML starts: without a GPU the columns are absent, never zeros.

Example:
    >>> monitor = ResourceMonitor(gpu=False)
    >>> with monitor.phase("collect"):
    ...     pass
    >>> row = monitor.sample(frames=0)
    >>> sorted(k for k in row if k.endswith("_s"))
    ['collect_s', 'learn_s', 'steps_per_cpu_s', 'wait_s']
    >>> 0 <= row["cores_busy"] <= os.cpu_count()
    True
    >>> monitor.close()

CPU accounting: the tree's cumulative CPU time is the sum, over live processes, of their own
user + system time and the time of the children they reaped (``children_user``,
``children_system``); a worker that exits and is joined moves its time into its parent's
counter, so nothing is lost or counted twice. A process that appears between samples counts
with all its CPU time. The process list is re-read every ``rescan_s`` seconds, and at once when a
known process has gone; in between only the cached ``psutil.Process`` objects are read (two small
``/proc`` files each). The kernel counts the CPU time of other processes in clock ticks (10 ms):
over an iteration of 2 ms, one tick of each of three processes would read as 15 cores busy, and
the next iterations as 0. The CPU columns are therefore rates over a trailing window of at
least ``window_s`` seconds (the readings of the last samples are kept for it), and this
process's own CPU time is read exactly (``time.process_time``).
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import psutil

from rlstruct.runs.folder import RunFolder, read_rows

__all__ = ["ResourceMonitor", "ExternalCpu", "resources_figure", "resource_curves", "smooth",
           "load_average"]


class ExternalCpu(Protocol):
    """What reports the CPU time of workers a process-tree meter cannot see."""

    def external_cpu_seconds(self) -> float:
        """CPU seconds used so far outside this process tree; never decreases."""
        ...

_MIB = 1024 * 1024


class ResourceMonitor:
    """Samples the resource use of this process tree, once per iteration, in the caller's thread.

    Args:
        pid: the root of the tree (default: this process).
        gpu: ``None`` (default): report GPUs when ``pynvml`` imports and NVML starts; ``False``:
            never (no NVML call); ``True``: the same as ``None``, but raise if NVML is missing.
        rescan_s: re-read the list of descendants at most this often (seconds); a process that
            has gone triggers a re-read at once.
        phases: phase columns always present (0.0 when unused), in this order.
        window_s: the CPU columns are averaged over at least this many seconds (the trailing
            window of the last samples; 0: each row's own interval).

    Raises:
        RuntimeError: ``gpu=True`` and NVML could not be started.
    """

    def __init__(
        self,
        pid: int | None = None,
        gpu: bool | None = None,
        rescan_s: float = 1.0,
        phases: Sequence[str] = ("collect", "learn"),
        window_s: float = 1.0,
    ) -> None:
        self._root = psutil.Process(pid)
        self._external: list[ExternalCpu] = []
        self._root_pid = self._root.pid
        self.rescan_s = float(rescan_s)
        self._procs: dict[int, psutil.Process] = {}
        self._scanned_at = -math.inf
        self._phase_names = list(phases)
        self._phase_wall: dict[str, float] = dict.fromkeys(phases, 0.0)
        self._wait = 0.0
        # Open phases, outermost first: [name, wall start, main-process CPU start]; only the
        # last one runs, the others are paused.
        self._open: list[list[Any]] = []
        self._nvml: ModuleType | None = None
        self._gpus: list[tuple[int, Any]] = []
        if gpu is not False:
            self._nvml, self._gpus = _start_nvml(required=bool(gpu))
        self.window_s = float(window_s)
        self._n_cpus = os.cpu_count() or 1
        self._scan(time.monotonic())
        # Readings (wall, main CPU, tree CPU, external CPU, frames): the first one is the start
        # of the window the next row averages over.
        self._readings: collections.deque[tuple[float, float, float, float, int | None]] = (
            collections.deque([(time.monotonic(), *self._cpu(), None)]))

    def watch(self, source: ExternalCpu) -> None:
        """Counts the CPU time of workers outside this process tree: ``source`` (a Batcher or
        RayBatcher) reports what its workers used, and the tree columns add it from now on.

        Args:
            source: has ``external_cpu_seconds() -> float``, a total that never decreases.
        """
        self._external.append(source)

    # ------------------------------------------------------------------ phases
    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times the ``with`` block into the ``<name>_s`` column (and its idle part into
        ``wait_s``).

        Phases nest exclusively: while an inner phase is open the outer one is paused, so the
        phase columns never count a second twice (``Run`` times the loop body as ``learn`` and,
        inside it, the ``execute()`` of a synchronous batcher as ``collect``). A sample taken
        inside an open phase counts the part up to the sample; the rest goes to the next row.

        Raises:
            ValueError: a phase of this name is already open.
        """
        if any(entry[0] == name for entry in self._open):
            raise ValueError(f"phase {name!r} is already open")
        if name not in self._phase_wall:
            self._phase_names.append(name)
            self._phase_wall[name] = 0.0
        self._switch()
        self._open.append([name, time.perf_counter(), time.process_time()])
        try:
            yield
        finally:
            wall, cpu = time.perf_counter(), time.process_time()
            for i in range(len(self._open) - 1, -1, -1):
                if self._open[i][0] == name:
                    entry = self._open.pop(i)
                    if i == len(self._open):  # it was the running (innermost) phase
                        self._add(name, entry[1], entry[2], wall, cpu)
                        if self._open:  # resume the paused outer phase from now
                            self._open[-1][1:] = [wall, cpu]
                    break

    def _switch(self) -> None:
        """Bank the running (innermost) phase up to now and restart its clock."""
        if self._open:
            wall, cpu = time.perf_counter(), time.process_time()
            top = self._open[-1]
            self._add(top[0], top[1], top[2], wall, cpu)
            top[1], top[2] = wall, cpu

    def _add(self, name: str, wall0: float, cpu0: float, wall: float, cpu: float) -> None:
        elapsed = wall - wall0
        self._phase_wall[name] += elapsed
        self._wait += max(0.0, elapsed - (cpu - cpu0))

    # ------------------------------------------------------------------ sampling
    def sample(self, frames: int | None = None) -> dict[str, float]:
        """The columns for the interval since the previous sample (or since construction);
        the CPU columns over at least the last ``window_s`` seconds.

        Args:
            frames: total environment frames so far; gives ``steps_per_cpu_s`` (nan without it,
                or while the window starts at a sample without a count).

        Returns:
            ``{"collect_s", "learn_s", <other phases>_s, "wait_s", "cores_busy", "cores_main",
            "cores_workers", "steps_per_cpu_s", "load_avg", "rss_mb", "gpu<k>_util",
            "gpu<k>_mem_mb"}``
            (GPU columns only when NVML runs); see the module docstring.
        """
        self._switch()
        row: dict[str, float] = {f"{n}_s": self._phase_wall[n] for n in self._phase_names}
        row["wait_s"] = self._wait
        self._phase_wall = dict.fromkeys(self._phase_names, 0.0)
        self._wait = 0.0

        now = time.monotonic()
        if now - self._scanned_at >= self.rescan_s:
            self._scan(now)
        rss = self._rss()
        self._readings.append((now, *self._cpu(), None if frames is None else int(frames)))
        row.update(self._cpu_columns())
        row["load_avg"] = load_average()
        row["rss_mb"] = rss / _MIB
        row.update(self._gpu_columns())
        return row

    def _cpu_columns(self) -> dict[str, float]:
        """The CPU columns from the window's first reading to the last one (the window starts
        at the newest reading at least ``window_s`` old, else at the oldest)."""
        readings, now = self._readings, self._readings[-1][0]
        while len(readings) > 2 and now - readings[1][0] >= self.window_s:
            readings.popleft()
        wall0, main0, tree0, ext0, frames0 = readings[0]
        _, main, tree, ext, frames = readings[-1]
        elapsed = now - wall0
        row: dict[str, float] = {}
        if elapsed > 0:
            # The tree runs on this machine: its rate cannot exceed the cores (ticks of 10 ms
            # over a short window could); workers elsewhere (Ray) add their own.
            local = min(self._n_cpus, max(0.0, tree - tree0) / elapsed)
            row["cores_main"] = min(local, max(0.0, main - main0) / elapsed)
            row["cores_busy"] = local + max(0.0, ext - ext0) / elapsed
            row["cores_workers"] = max(0.0, row["cores_busy"] - row["cores_main"])
        else:
            row["cores_busy"] = row["cores_main"] = row["cores_workers"] = math.nan
        cpu = max(0.0, tree - tree0) + max(0.0, ext - ext0)
        row["steps_per_cpu_s"] = ((frames - frames0) / cpu if frames is not None
                                  and frames0 is not None and cpu > 0 else math.nan)
        return {k: row[k] for k in ("cores_busy", "cores_main", "cores_workers",
                                    "steps_per_cpu_s")}

    def tree_cpu_s(self) -> float:
        """Cumulative CPU seconds (user + system) of the whole tree now, reaped children
        included; the process list is re-read first. The difference of two readings is the
        CPU the tree used in between (the tuner's meter); :meth:`sample` is not disturbed.
        """
        self._scan(time.monotonic())
        _, tree, external = self._cpu()
        return tree + external

    @property
    def n_processes(self) -> int:
        """How many processes of the tree are currently tracked (the root included)."""
        return len(self._procs)

    @property
    def gpu_indices(self) -> list[int]:
        """The ``k`` of the ``gpu<k>_*`` columns (empty without NVML)."""
        return [k for k, _ in self._gpus]

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Shuts NVML down (idempotent); the monitor reports no GPU columns afterwards."""
        nvml, self._nvml, self._gpus = self._nvml, None, []
        if nvml is not None:
            with contextlib.suppress(Exception):  # NVML already down or broken: nothing to free
                nvml.nvmlShutdown()

    def __enter__(self) -> ResourceMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _scan(self, now: float) -> None:
        """Re-read the tree; keep the cached Process objects of the pids still there."""
        try:
            found = [self._root, *self._root.children(recursive=True)]
        except psutil.NoSuchProcess:
            found = []
        procs: dict[int, psutil.Process] = {}
        for proc in found:
            cached = self._procs.get(proc.pid)
            # Process equality compares pid and creation time: a reused pid is a new process.
            procs[proc.pid] = cached if cached is not None and cached == proc else proc
        self._procs, self._scanned_at = procs, now

    def _cpu(self, retries: int = 2) -> tuple[float, float, float]:
        """Cumulative CPU seconds: (this process's own, the whole tree's (this one's
        included), the workers' outside the tree); this process's own time read exactly."""
        main = tree = 0.0
        gone = False
        for pid, proc in self._procs.items():
            try:
                t = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                gone = True
                continue
            own = t.user + t.system
            if pid == self._root_pid:
                # time.process_time: nanoseconds, not the kernel's 10 ms ticks of /proc
                main = own = time.process_time() if pid == os.getpid() else own
            tree += own + t.children_user + t.children_system
        if gone and retries > 0:  # its reaped time now sits in its parent's children_* counters
            self._scan(time.monotonic())
            return self._cpu(retries - 1)
        # Batcher workers outside this tree (Ray actors elsewhere) report their own CPU time.
        return main, tree, sum(source.external_cpu_seconds() for source in self._external)

    def _rss(self) -> int:
        total = 0
        for proc in self._procs.values():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += proc.memory_info().rss
        return total

    def _gpu_columns(self) -> dict[str, float]:
        nvml = self._nvml
        if nvml is None:
            return {}
        out: dict[str, float] = {}
        for k, handle in self._gpus:
            try:
                out[f"gpu{k}_util"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                out[f"gpu{k}_mem_mb"] = nvml.nvmlDeviceGetMemoryInfo(handle).used / _MIB
            except Exception:  # noqa: BLE001 - a GPU fallen off the bus: nan, the run goes on
                out[f"gpu{k}_util"] = out[f"gpu{k}_mem_mb"] = math.nan
        return out


def load_average() -> float:
    """The machine's load average over the last minute (``os.getloadavg``); nan where the
    system does not tell."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return math.nan


def _start_nvml(required: bool) -> tuple[ModuleType | None, list[tuple[int, Any]]]:
    """``(pynvml, [(k, handle), ...])``, or ``(None, [])`` when NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:  # ImportError, NVMLError (no driver, no GPU)
        if required:
            raise RuntimeError(f"ResourceMonitor(gpu=True): NVML is unavailable ({err!r}); "
                               "pip install nvidia-ml-py, and check the NVIDIA driver") from err
        return None, []
    try:
        count = pynvml.nvmlDeviceGetCount()
        indices = _visible_indices(count)
        gpus = [(k, pynvml.nvmlDeviceGetHandleByIndex(i)) for k, i in enumerate(indices)]
    except Exception as err:  # NVMLError: no GPU columns, unless they are required
        with contextlib.suppress(Exception):  # NVML half started: freeing it is best effort
            pynvml.nvmlShutdown()
        if required:
            raise RuntimeError(f"ResourceMonitor(gpu=True): NVML failed ({err!r})") from err
        return None, []
    if not gpus:
        with contextlib.suppress(Exception):  # NVML half started: freeing it is best effort
            pynvml.nvmlShutdown()
        if required:
            raise RuntimeError("ResourceMonitor(gpu=True): NVML sees no GPU")
        return None, []
    return pynvml, gpus


def _visible_indices(count: int) -> list[int]:
    """NVML indices of the GPUs CUDA sees, in CUDA order (``CUDA_VISIBLE_DEVICES`` of integers;
    all GPUs when it is unset or names GPUs by UUID)."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(count))
    indices: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.lstrip("-").isdigit():
            return list(range(count))  # UUIDs or MIG names: report every GPU
        i = int(part)
        if i < 0 or i >= count:
            break  # CUDA stops at the first invalid index
        indices.append(i)
    return indices


# ---------------------------------------------------------------------------------- figure
def smooth(points: Sequence[tuple[float, float]], width: int) -> list[tuple[float, float]]:
    """The trailing moving average of ``points`` (``(x, y)``) over ``width`` points.

    Example:
        >>> smooth([(0, 0.0), (1, 2.0), (2, 4.0)], 2)
        [(0, 0.0), (1, 1.0), (2, 3.0)]
    """
    out, total = [], 0.0
    for i, (x, y) in enumerate(points):
        total += y - (points[i - width][1] if i >= width else 0.0)
        out.append((x, total / min(i + 1, width)))
    return out


def resource_curves(progress_csv: str | Path) -> dict[str, list[tuple[float, float]]]:
    """The ``(frames, value)`` points :func:`resources_figure` draws: ``cores_busy`` as
    recorded, the cores columns smoothed (``<column>_smooth``: a trailing mean over about a
    50th of the rows), the machine's ``load_avg`` and ``steps_per_s``; rows without a value are
    left out.

    Raises:
        FileNotFoundError: ``progress_csv`` does not exist.
    """
    progress_csv = Path(progress_csv)
    if not progress_csv.is_file():
        raise FileNotFoundError(f"no progress.csv at {progress_csv}")
    run = RunFolder(progress_csv.parent, read_rows(progress_csv))
    curves = {column: run.series(column) for column in
              ("cores_busy", "cores_main", "cores_workers", "load_avg", "steps_per_s")}
    for column in ("cores_busy", "cores_main", "cores_workers"):
        points = curves[column]
        curves[f"{column}_smooth"] = smooth(points, max(1, len(points) // 50))
    return curves


def resources_figure(progress_csv: str | Path, out_png: str | Path) -> Path:
    """Draw cores busy (tree, main process, workers; smoothed, the recorded ``cores_busy``
    faint behind) beside the machine's load average, and steps/s, against frames into a PNG.

    Reads a ``progress.csv`` (:func:`resource_curves`). The load average counts every process
    of the machine that runs or waits for a core: a load above ``cores_busy`` is other work
    competing for the machine; both low is a layout that leaves cores idle. Matplotlib's Agg
    canvas, like :func:`rlstruct.runs.plotting.plot_runs`.

    Returns:
        ``out_png`` as a ``Path``.

    Raises:
        FileNotFoundError: ``progress_csv`` does not exist.
        ImportError: matplotlib is not installed.
    """
    from rlstruct.runs.plotting import finish_figure, new_figure

    curves = resource_curves(progress_csv)
    fig = new_figure(9, 6)
    top, bottom = fig.subplots(2, 1, sharex=True)
    if curves["cores_busy"]:
        top.plot(*zip(*curves["cores_busy"]), color="tab:blue", lw=0.8, alpha=0.25)
    for column, style in (("cores_busy", "-"), ("cores_main", "--"), ("cores_workers", ":")):
        points = curves[f"{column}_smooth"]
        if points:
            top.plot(*zip(*points), ls=style, lw=2 if column == "cores_busy" else 1.2,
                     label=f"{column} (smoothed)")
    if curves["load_avg"]:
        top.plot(*zip(*curves["load_avg"]), color="tab:grey", lw=1.2, ls="-.",
                 label="machine load average (1 min)")
    top.set_ylabel("cores")
    top.set_ylim(bottom=0)
    speed = curves["steps_per_s"]
    if speed:
        bottom.plot(*zip(*speed), color="tab:green", lw=1.5, label="steps_per_s")
    bottom.set_ylabel("steps / s")
    bottom.set_xlabel("frames")
    bottom.set_ylim(bottom=0)
    top.set_title(Path(progress_csv).parent.name or "resources")
    return finish_figure(fig, out_png, "no values recorded")
