"""Layout autotuner: measure candidate batcher layouts within a time budget and pick the best.

A *layout* is where and how the training batcher collects: a :class:`~rlstruct.SerialBatcher`
(``n_processes=1``, on the CPU or on a GPU) or a :class:`~rlstruct.Batcher` with ``P`` worker
processes, ``n_envs`` envs per process, ``T = n_timesteps`` steps per segment, and ``pipeline``
(1: synchronous; 2: the workers collect the next segment while the learner learns).

Each candidate is measured by :class:`BatcherMeasure`: build the batcher (constructor and
``reset``: the *start-up*), collect one warm-up batch, then collect whole batches for a given
number of seconds, each followed by the same *fake learner* (``learn_s`` seconds of sleep, 0 by
default: pure collection) and an ``update`` with the model's weights. A pipelined candidate
overlaps collection with that learner time; with ``learn_s = 0`` it only overlaps the
main process's own work. Over the window it reports steps/s, the cores the process tree kept
busy (CPU seconds of this process and all its descendants, over wall seconds) and steps per
CPU-second. The fake learner sleeps: its CPU time is not counted.

The search (:func:`search`) is smarter than the exhaustive grid (:func:`grid_search`): a
coordinate search over the axes (workers, envs per process, ``T``, pipeline) starts from the
middle of the grid, measures the neighbours of the current layout along one axis at a time
and moves to the best, until a sweep moves no more; then the best few layouts measured are
measured again, interleaved and for longer, and the best by the accumulated measurements wins.
It spends at most ``budget_s`` seconds (a measurement is only started when the estimate of
its cost still fits). ``benchmarks/tune_vs_grid.py`` compares it with the grid in one run.

Use it from Python (:func:`tune` with your factories, :func:`tune_algo` with an algorithm's
name) or from the shell, ``python -m rlstruct tune --algo ppo --budget 60 --out tune.json``
(:func:`main`). The JSON file holds :class:`~rlstruct.experiment.LayoutConfig`'s fields plus
``n_timesteps`` (and the measurements under ``"tuned"``); :func:`read_layout`,
:func:`layout_from_json` and :func:`apply_layout` read it back.

Changing ``n_envs``, ``n_processes`` or ``T`` changes the batch (``B = P * n_envs`` rows of
``T`` steps), which is a hyperparameter of on-policy algorithms: restrict the options (e.g.
``n_timesteps_options=(cfg.n_timesteps,)``) when the batch must not change.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from rlstruct.agent import Agent
from rlstruct.dicttensor import DictTensor
from rlstruct.envs.base import VecEnv
from rlstruct.errors import ConfigError
from rlstruct.experiment import LayoutConfig, default_processes, make_batcher

__all__ = [
    "Candidate",
    "Measurement",
    "CandidateStats",
    "TuneResult",
    "TunedLayout",
    "BatcherMeasure",
    "candidate_grid",
    "search",
    "grid_search",
    "tune",
    "tune_algo",
    "write_layout",
    "read_layout",
    "layout_from_json",
    "apply_layout",
    "main",
]

Objective = Literal["steps_per_s", "steps_per_cpu_s"]
OBJECTIVES: tuple[str, ...] = ("steps_per_s", "steps_per_cpu_s")
#: The axes the coordinate search moves along, in sweep order.
AXES: tuple[str, ...] = ("workers", "n_envs", "n_timesteps", "pipeline")
#: The layout fields the tuner chooses (the others of LayoutConfig are copied from a base).
TUNED_FIELDS: tuple[str, ...] = ("batcher_device", "n_processes", "n_envs", "pipeline")


# ------------------------------------------------------------------------------ candidates
@dataclass(frozen=True, order=True)
class Candidate:
    """One layout of the training batcher.

    Attributes:
        n_processes: 1: a SerialBatcher (collects in this process); ``P >= 2``: a Batcher
            with ``P`` worker processes (CPU only).
        n_envs: envs per process (or in the SerialBatcher).
        n_timesteps: ``T``, steps per env and segment.
        pipeline: segment slots per worker (2: pipelined; worker processes only).
        device: the batcher's device (a GPU selects the SerialBatcher; ``n_processes`` is 1).
    """

    n_processes: int
    n_envs: int
    n_timesteps: int
    pipeline: int = 1
    device: str = "cpu"

    def __post_init__(self) -> None:
        problems = [f"{name} must be >= 1, got {getattr(self, name)}"
                    for name in ("n_processes", "n_envs", "n_timesteps", "pipeline")
                    if getattr(self, name) < 1]
        if self.pipeline > 1 and self.n_processes < 2:
            problems.append(f"pipeline={self.pipeline} needs n_processes >= 2")
        if self.device != "cpu" and self.n_processes != 1:
            problems.append(f"a {self.device} batcher is one process: n_processes must be 1")
        if problems:
            raise ConfigError(f"bad candidate {self}: " + "; ".join(problems))

    @property
    def workers(self) -> tuple[str, int]:
        """The value on the ``workers`` axis: ``(device, n_processes)``."""
        return (self.device, self.n_processes)

    def axis(self, name: str) -> Any:
        """The candidate's value on axis ``name`` (one of :data:`AXES`)."""
        return self.workers if name == "workers" else getattr(self, name)

    @property
    def label(self) -> str:
        """A short description, e.g. ``"Batcher 2x32 T=32 pipe2"`` or ``"Serial cpu 64 T=16"``."""
        if self.n_processes == 1:
            where = f"Serial {self.device} {self.n_envs}"
        else:
            where = f"Batcher {self.n_processes}x{self.n_envs}"
        pipe = f" pipe{self.pipeline}" if self.pipeline > 1 else ""
        return f"{where} T={self.n_timesteps}{pipe}"

    def layout(self, base: LayoutConfig | None = None) -> LayoutConfig:
        """``base`` (default: ``LayoutConfig()``) with this candidate's batcher fields."""
        return dataclasses.replace(
            base or LayoutConfig(), batcher_device=self.device, n_processes=self.n_processes,
            n_envs=self.n_envs, pipeline=self.pipeline,
        )


def _process_options(cores: int) -> list[int]:
    """1, 2, 4, ... up to ``cores``, and ``cores`` itself."""
    options, p = [1], 2
    while p <= cores:
        options.append(p)
        p *= 2
    if cores not in options:
        options.append(cores)
    return options


def candidate_grid(
    processes: Sequence[int] | None = None,
    n_envs_options: Sequence[int] = (8, 16, 32, 64),
    n_timesteps_options: Sequence[int] = (16, 32, 64),
    pipelines: Sequence[int] = (1, 2),
    devices: Sequence[str] | None = None,
) -> list[Candidate]:
    """The full grid of valid candidates.

    Args:
        processes: worker counts (1: SerialBatcher); default 1, 2, 4, ... and the core count.
        n_envs_options: envs per process.
        n_timesteps_options: values of ``T``.
        pipelines: pipeline depths (more than 1 only for ``P >= 2``).
        devices: GPU devices for a SerialBatcher on a GPU (default: ``cuda:0`` when CUDA is
            available, none otherwise).

    Returns:
        The candidates, CPU ones first.
    """
    procs = list(processes) if processes is not None else _process_options(default_processes())
    if devices is None:
        devices = ["cuda:0"] if torch.cuda.is_available() else []
    out = []
    for n_envs in n_envs_options:
        for t in n_timesteps_options:
            for p in procs:
                for pipe in pipelines:
                    if pipe == 1 or p >= 2:
                        out.append(Candidate(p, n_envs, t, pipe))
            out.extend(Candidate(1, n_envs, t, 1, str(d)) for d in devices)
    return sorted(set(out), key=lambda c: (c.device != "cpu", c))


# ----------------------------------------------------------------------------- measurements
@dataclass
class Measurement:
    """One measurement of one candidate.

    Attributes:
        candidate: the layout measured.
        steps: env transitions collected in the window.
        wall_s: seconds of the window.
        cpu_s: CPU seconds of the process tree in the window (nan: not measured).
        startup_s: constructor and ``reset`` of the batcher.
        elapsed_s: everything the measurement cost (start-up, warm-up, window, close).
        error: why the candidate failed (then the other figures are 0).
    """

    candidate: Candidate
    steps: int
    wall_s: float
    cpu_s: float
    startup_s: float
    elapsed_s: float
    error: str | None = None


@dataclass
class CandidateStats:
    """Every measurement of one candidate, accumulated (sums of steps, wall and CPU time)."""

    candidate: Candidate
    measurements: list[Measurement] = field(default_factory=list)

    def _ok(self) -> list[Measurement]:
        return [m for m in self.measurements if m.error is None]

    @property
    def error(self) -> str | None:
        """The first error, when no measurement succeeded."""
        if self._ok() or not self.measurements:
            return None
        return self.measurements[0].error

    @property
    def steps_per_s(self) -> float:
        ok = self._ok()
        wall = sum(m.wall_s for m in ok)
        return sum(m.steps for m in ok) / wall if wall > 0 else 0.0

    @property
    def cores_busy(self) -> float:
        ok = self._ok()
        wall = sum(m.wall_s for m in ok)
        return sum(m.cpu_s for m in ok) / wall if wall > 0 else math.nan

    @property
    def steps_per_cpu_s(self) -> float:
        ok = self._ok()
        cpu = sum(m.cpu_s for m in ok)
        return sum(m.steps for m in ok) / cpu if cpu > 0 else math.nan

    @property
    def startup_s(self) -> float:
        """The median start-up over the measurements."""
        ok = sorted(m.startup_s for m in self._ok())
        return ok[len(ok) // 2] if ok else math.nan

    def score(self, objective: str) -> float:
        """The objective (higher is better); ``-inf`` for a failed or unmeasured candidate."""
        if not self._ok():
            return -math.inf
        value = getattr(self, objective)
        return -math.inf if math.isnan(value) else value


@dataclass
class TuneResult:
    """The outcome of a search.

    Attributes:
        best: the chosen layout.
        stats: every candidate measured, with its measurements, in the order first measured.
        objective: what was maximised.
        budget_s: the budget (``inf`` for the grid).
        spent_s: the sum of the measurements' ``elapsed_s``.
        n_candidates: how many candidates there were to choose from.
    """

    best: Candidate
    stats: dict[Candidate, CandidateStats]
    objective: str
    budget_s: float
    spent_s: float
    n_candidates: int

    @property
    def n_measurements(self) -> int:
        """How many times a candidate was measured."""
        return sum(len(s.measurements) for s in self.stats.values())

    def ranked(self) -> list[CandidateStats]:
        """The measured candidates, best first."""
        return sorted(self.stats.values(), key=lambda s: -s.score(self.objective))

    def table(self) -> str:
        """The measured candidates, best first, one line each (the pick is marked ``*``)."""
        head = (f"  {'layout':32s} {'steps/s':>9s} {'cores busy':>10s} {'steps/CPU-s':>11s} "
                f"{'start-up s':>10s} {'runs':>4s}")
        lines = [head]
        for s in self.ranked():
            mark = "*" if s.candidate == self.best else " "
            if s.error is not None:
                lines.append(f"{mark} {s.candidate.label:32s} failed: {s.error}")
                continue
            lines.append(
                f"{mark} {s.candidate.label:32s} {s.steps_per_s:9.0f} {s.cores_busy:10.2f} "
                f"{s.steps_per_cpu_s:11.0f} {s.startup_s:10.2f} {len(s.measurements):4d}"
            )
        return "\n".join(lines)

    def summary(self) -> dict[str, Any]:
        """What :func:`write_layout` stores under ``"tuned"``: objective, budget and figures."""
        best = self.stats[self.best]
        return {
            "objective": self.objective,
            "budget_s": self.budget_s,
            "spent_s": round(self.spent_s, 3),
            "n_candidates": self.n_candidates,
            "n_measured": len(self.stats),
            "n_measurements": self.n_measurements,
            "steps_per_s": round(best.steps_per_s, 1),
            "cores_busy": round(best.cores_busy, 3),
            "steps_per_cpu_s": round(best.steps_per_cpu_s, 1),
            "startup_s": round(best.startup_s, 3),
        }


MeasureFn = Callable[[Candidate, float], Measurement]


# ----------------------------------------------------------------------------- the searches
class _Book:
    """Measurements so far and the budget they used."""

    def __init__(self, measure: MeasureFn, budget_s: float, overhead_guess_s: float,
                 log: Callable[[str], None] | None) -> None:
        self.measure, self.budget_s, self.log = measure, budget_s, log
        self.overhead_guess_s = overhead_guess_s
        self.stats: dict[Candidate, CandidateStats] = {}
        self.spent = 0.0
        self.overheads: list[float] = []

    def cost(self, seconds: float) -> float:
        """The expected cost of a measurement of ``seconds``: the largest overhead seen."""
        return seconds + max(self.overheads, default=self.overhead_guess_s)

    def affords(self, seconds: float, reserve_s: float = 0.0) -> bool:
        return self.spent + self.cost(seconds) + reserve_s <= self.budget_s

    def run(self, candidate: Candidate, seconds: float, reserve_s: float = 0.0) -> bool:
        """Measures ``candidate`` when the budget allows it with ``reserve_s`` left over;
        False when it does not."""
        if not self.affords(seconds, reserve_s):
            return False
        m = self.measure(candidate, seconds)
        self.spent += m.elapsed_s
        if m.error is None:
            self.overheads.append(max(0.0, m.elapsed_s - m.wall_s))
        self.stats.setdefault(candidate, CandidateStats(candidate)).measurements.append(m)
        if self.log is not None:
            what = m.error or f"{m.steps / m.wall_s if m.wall_s else 0:.0f} steps/s"
            self.log(f"  {candidate.label:32s} {what}  ({self.spent:.1f} s spent)")
        return True


def _values(candidates: Sequence[Candidate], axis: str) -> list[Any]:
    return sorted({c.axis(axis) for c in candidates}, key=lambda v: (v[0] != "cpu", v[1])
                  if axis == "workers" else v)


def _neighbours(current: Candidate, axis: str, candidates: Sequence[Candidate]) -> list[Candidate]:
    """For every other value of ``axis``: the candidates with it that differ from ``current``
    on the fewest other axes (exactly one when the grid is complete there)."""
    by_value: dict[Any, list[tuple[int, Candidate]]] = {}
    for c in candidates:
        if c.axis(axis) == current.axis(axis):
            continue
        distance = sum(c.axis(a) != current.axis(a) for a in AXES if a != axis)
        by_value.setdefault(c.axis(axis), []).append((distance, c))
    out = []
    for options in by_value.values():
        nearest = min(d for d, _ in options)
        out.extend(c for d, c in options if d == nearest)
    return out


def _start(candidates: Sequence[Candidate]) -> Candidate:
    """The candidate nearest the upper middle of every axis (index ``len // 2``)."""
    index = {a: {v: i for i, v in enumerate(_values(candidates, a))} for a in AXES}
    middle = {a: len(index[a]) // 2 for a in AXES}
    return min(candidates, key=lambda c: (
        sum(abs(index[a][c.axis(a)] - middle[a]) for a in AXES), c))


def default_probe_s(candidates: Sequence[Candidate], budget_s: float, n_finalists: int = 3,
                    overhead_guess_s: float = 0.5) -> float:
    """A probe length that lets a coordinate search of ``candidates`` and its finals fit in
    ``budget_s``: about 1.5 sweeps of probes plus ``n_finalists`` measurements twice as long."""
    sweep = 1 + sum(len(_values(candidates, a)) - 1 for a in AXES)
    probes = 1.5 * min(sweep, len(candidates))
    finals = min(n_finalists, len(candidates))
    units = probes + 2 * finals
    return max(0.1, (budget_s - (probes + finals) * overhead_guess_s) / units)


def _choose(stats: Mapping[Candidate, CandidateStats], objective: str,
            among: Sequence[Candidate] | None = None) -> Candidate:
    pool = list(among) if among is not None else list(stats)
    return max(pool, key=lambda c: stats[c].score(objective))


def search(
    candidates: Sequence[Candidate],
    measure: MeasureFn,
    *,
    budget_s: float,
    objective: str = "steps_per_s",
    probe_s: float | None = None,
    n_finalists: int = 3,
    overhead_guess_s: float = 0.5,
    log: Callable[[str], None] | None = None,
) -> TuneResult:
    """Coordinate search, then finals: the tuner's choice within ``budget_s``.

    1. Measure the candidate in the upper middle of every axis for ``probe_s``.
    2. Sweep the axes (workers, envs per process, ``T``, pipeline): measure the neighbours of
       the current candidate along the axis (the other axes kept; the nearest valid candidate
       where the grid has a hole, e.g. no pipelined SerialBatcher), move to the best.
       Repeat sweeps until one moves no more.
    3. Finals: the ``n_finalists`` best measured are measured again for ``2 * probe_s``, in
       turn; the best by all its measurements (total steps over total seconds) wins.

    A measurement starts only while ``spent + probe + overhead`` fits in the budget, where
    the overhead (start-up, warm-up, close) is the largest one seen so far
    (``overhead_guess_s`` before the first); the sweeps stop early enough to leave the finals
    their share (on a loaded machine the overheads grow beyond the guess).

    Args:
        candidates: the layouts to choose from (any subset of a grid).
        measure: ``measure(candidate, seconds) -> Measurement``.
        budget_s: seconds the measurements may take in all.
        objective: ``"steps_per_s"`` or ``"steps_per_cpu_s"``.
        probe_s: seconds of a first measurement (default: :func:`default_probe_s`).
        n_finalists: candidates measured again at the end.
        overhead_guess_s: expected cost of a measurement beyond its window, before one is seen.
        log: called with one line per measurement.

    Returns:
        The :class:`TuneResult`.

    Raises:
        ConfigError: no candidates, an unknown objective, or not even one measurement fits.
    """
    candidates = _check(candidates, objective)
    if probe_s is None:
        probe_s = default_probe_s(candidates, budget_s, n_finalists, overhead_guess_s)
    book = _Book(measure, budget_s, overhead_guess_s, log)
    current = _start(candidates)
    if not book.run(current, probe_s):
        raise ConfigError(f"budget_s={budget_s} leaves no time for one measurement of "
                          f"{probe_s:.2f} s (+ about {overhead_guess_s} s of start-up)")
    moved, out_of_budget = True, False
    while moved and not out_of_budget:
        moved = False
        for axis in AXES:
            near = _neighbours(current, axis, candidates)
            for c in near:
                reserve = min(n_finalists, len(book.stats)) * book.cost(2 * probe_s)
                if c not in book.stats and not book.run(c, probe_s, reserve):
                    out_of_budget = True
                    break
            measured = [c for c in [current, *near] if c in book.stats]
            best = _choose(book.stats, objective, measured)
            if best != current and book.stats[best].score(objective) > book.stats[
                    current].score(objective):
                current, moved = best, True
            if out_of_budget:
                break
    finalists = [s.candidate for s in sorted(book.stats.values(),
                                             key=lambda s: -s.score(objective))
                 if s.error is None][:n_finalists]
    if len(finalists) > 1:
        for c in finalists:
            if not book.run(c, 2 * probe_s):
                break
    best = _choose(book.stats, objective, finalists or None)
    return TuneResult(best, book.stats, objective, budget_s, book.spent, len(candidates))


def grid_search(
    candidates: Sequence[Candidate],
    measure: MeasureFn,
    *,
    seconds: float,
    objective: str = "steps_per_s",
    log: Callable[[str], None] | None = None,
) -> TuneResult:
    """The exhaustive reference: every candidate measured once for ``seconds``; the best wins.

    Args:
        candidates: the layouts.
        measure: ``measure(candidate, seconds) -> Measurement``.
        seconds: the window of each measurement.
        objective: ``"steps_per_s"`` or ``"steps_per_cpu_s"``.
        log: called with one line per measurement.
    """
    candidates = _check(candidates, objective)
    book = _Book(measure, math.inf, 0.0, log)
    for c in candidates:
        book.run(c, seconds)
    best = _choose(book.stats, objective)
    return TuneResult(best, book.stats, objective, math.inf, book.spent, len(candidates))


def _check(candidates: Sequence[Candidate], objective: str) -> list[Candidate]:
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    unique = list(dict.fromkeys(candidates))
    if not unique:
        raise ConfigError("no candidate layouts to measure")
    return unique


# --------------------------------------------------------------------------- the real meter
class _TreeCPU:
    """CPU seconds (user + system) of this process and all its live descendants (psutil)."""

    def __init__(self) -> None:
        try:
            import psutil
        except ImportError:  # pragma: no cover - psutil is a dev/bench dependency
            self.root = None
        else:
            self.root = psutil.Process()
        self._start: dict[int, float] = {}

    def _times(self) -> dict[int, float]:
        import psutil

        out = {}
        for proc in [self.root, *self.root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                out[proc.pid] = t.user + t.system
        return out

    def start(self) -> None:
        if self.root is not None:
            self._start = self._times()

    def stop(self) -> float:
        """CPU seconds since :meth:`start` (nan without psutil). Processes that exited in the
        window are not counted; processes started in it are counted whole."""
        if self.root is None:
            return math.nan
        return sum(t - self._start.get(pid, 0.0) for pid, t in self._times().items())


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class BatcherMeasure:
    """Measures a candidate for real: builds its batcher with
    :func:`~rlstruct.experiment.make_batcher`, collects, closes it (``with``).

    Args:
        create_agent: ``create_agent(**agent_args) -> Agent`` (on the CPU).
        agent_args: keyword arguments of ``create_agent``.
        create_env: ``create_env(**env_args, n_envs=..., seed=s) -> VecEnv``.
        env_args: keyword arguments of ``create_env`` but ``n_envs`` (set per candidate).
        seed: the batchers' seed.
        learn_s: the fake learner's seconds per batch (a sleep after every ``get``).
        weights: a state_dict handed to ``update`` after every batch (None: no update).
        agent_info: example agent_info of the batchers.
    """

    def __init__(
        self,
        create_agent: Callable[..., Agent],
        agent_args: Mapping[str, Any],
        create_env: Callable[..., VecEnv],
        env_args: Mapping[str, Any],
        *,
        seed: int = 0,
        learn_s: float = 0.0,
        weights: Mapping[str, torch.Tensor] | None = None,
        agent_info: DictTensor | None = None,
    ) -> None:
        if learn_s < 0:
            raise ConfigError(f"learn_s must be >= 0, got {learn_s}")
        self.create_agent, self.agent_args = create_agent, dict(agent_args)
        self.create_env, self.env_args = create_env, dict(env_args)
        self.seed, self.learn_s, self.weights, self.agent_info = seed, learn_s, weights, agent_info
        self._cpu = _TreeCPU()

    def warm_up(self) -> None:
        """Starts the worker processes' forkserver and pays its imports once (a small
        Batcher), so that no candidate's start-up includes them."""
        self(Candidate(2, 1, 1, 1), 0.0)

    def __call__(self, candidate: Candidate, seconds: float) -> Measurement:
        """Measures ``candidate`` over whole batches for at least ``seconds`` (and 2 batches);
        a candidate that raises is reported with its error."""
        t0 = time.perf_counter()
        try:
            return self._measure(candidate, seconds, t0)
        except Exception as err:  # a failing layout (memory, device) loses, the search goes on
            return Measurement(candidate, 0, 0.0, math.nan, math.nan,
                               time.perf_counter() - t0, f"{type(err).__name__}: {err}")

    def _measure(self, c: Candidate, seconds: float, t0: float) -> Measurement:
        batcher = make_batcher(
            device=c.device, n_processes=c.n_processes, n_timesteps=c.n_timesteps,
            create_agent=self.create_agent, agent_args=self.agent_args,
            create_env=self.create_env, env_args={**self.env_args, "n_envs": c.n_envs},
            seeds=self.seed, agent_info=self.agent_info, pipeline=c.pipeline,
        )
        with batcher:
            batcher.reset()
            startup = time.perf_counter() - t0
            pipelined = c.pipeline > 1
            if pipelined:
                batcher.execute()  # starts the stream

            def one_batch() -> int:
                if not pipelined:
                    batcher.execute()
                traj, _ = batcher.get()
                if self.learn_s:
                    time.sleep(self.learn_s)
                if self.weights is not None:
                    batcher.update(self.weights)
                return int(traj.lengths.sum())

            one_batch()  # warm-up: the first agent calls, the shared weights' allocation
            self._cpu.start()
            start, steps, n = time.perf_counter(), 0, 0
            while n < 2 or time.perf_counter() - start < seconds:
                steps += one_batch()
                n += 1
            wall = time.perf_counter() - start
            cpu = self._cpu.stop()
        return Measurement(c, steps, wall, cpu, startup, time.perf_counter() - t0)


# ------------------------------------------------------------------------------ entry points
def tune(
    create_agent: Callable[..., Agent],
    agent_args: Mapping[str, Any],
    create_env: Callable[..., VecEnv],
    env_args: Mapping[str, Any],
    *,
    candidates: Sequence[Candidate] | None = None,
    budget_s: float = 60.0,
    processes: Sequence[int] | None = None,
    n_envs_options: Sequence[int] = (8, 16, 32, 64),
    n_timesteps_options: Sequence[int] = (16, 32, 64),
    pipelines: Sequence[int] = (1, 2),
    devices: Sequence[str] | None = None,
    objective: Objective = "steps_per_s",
    learn_s: float = 0.0,
    weights: Mapping[str, torch.Tensor] | None = None,
    agent_info: DictTensor | None = None,
    seed: int = 0,
    probe_s: float | None = None,
    n_threads: int = 1,
    verbose: bool = True,
) -> TuneResult:
    """Measures candidate layouts of a training batcher within ``budget_s`` and picks the best.

    Args:
        create_agent: ``create_agent(**agent_args) -> Agent`` (on the CPU, picklable).
        agent_args: keyword arguments of ``create_agent``.
        create_env: ``create_env(**env_args, n_envs=n, seed=s) -> VecEnv``.
        env_args: keyword arguments of ``create_env`` but ``n_envs`` and ``seed``.
        candidates: the layouts (default: :func:`candidate_grid` of the options below).
        budget_s: seconds the measurements may take (plus a one-off warm-up of about a
            second, and the start-up of the first worker processes of the program).
        processes: worker counts for the grid (1: SerialBatcher).
        n_envs_options: envs per process for the grid.
        n_timesteps_options: ``T`` values for the grid.
        pipelines: pipeline depths for the grid (keep ``(1,)`` for an algorithm that cannot
            learn from a pipelined batcher).
        devices: GPU devices for a SerialBatcher (default: ``cuda:0`` when there is one).
        objective: ``"steps_per_s"`` (default) or ``"steps_per_cpu_s"``.
        learn_s: the fake learner's seconds per batch, the same for every candidate (0: pure
            collection; a pipelined layout overlaps collection with it).
        weights: a state_dict published with ``update`` after each batch, as a training loop
            does (None: no update).
        agent_info: example agent_info of the batchers.
        seed: the batchers' seed.
        probe_s: seconds of a first measurement (default: derived from the budget).
        n_threads: torch threads of this process while measuring (1, as the algorithms').
        verbose: print one line per measurement and the final table.

    Returns:
        The :class:`TuneResult`; ``write_layout(path, result)`` saves the pick.
    """
    if candidates is None:
        candidates = candidate_grid(processes, n_envs_options, n_timesteps_options, pipelines,
                                    devices)
    measure = BatcherMeasure(create_agent, agent_args, create_env, env_args, seed=seed,
                             learn_s=learn_s, weights=weights, agent_info=agent_info)
    log = print if verbose else None
    with _torch_threads(n_threads):
        if any(c.n_processes > 1 for c in candidates):
            measure.warm_up()
        if verbose:
            print(f"tuning {len(candidates)} candidate layouts in {budget_s:.0f} s "
                  f"(objective {objective}, fake learner {learn_s} s per batch)")
        result = search(candidates, measure, budget_s=budget_s, objective=objective,
                        probe_s=probe_s, log=log)
    if verbose:
        print(result.table())
    return result


#: Algorithms :func:`tune_algo` knows: module ``algos.<name>`` -> (model class, agent class,
#: learns from a pipelined batcher). Each model is ``Model(obs_dim, n_actions, hidden)`` and
#: each agent ``Agent(model)``, collecting from ``GymEnvInf`` without agent_info.
ALGOS: dict[str, tuple[str, str, bool]] = {
    "ppo": ("ActorCritic", "PPOAgent", True),
    "a2c": ("MLPActorCritic", "A2CAgent", True),
    "impala": ("ActorCritic", "BehaviourAgent", True),
}


def _algo_factories(algo: str, **overrides: Any) -> tuple[Any, Any, Any, bool]:
    """``(cfg, model, agent class, pipelined)`` of ``algos.<algo>`` with config overrides."""
    if algo not in ALGOS:
        raise ConfigError(f"tune_algo knows {sorted(ALGOS)}, not {algo!r}: call tune() with "
                          "the algorithm's agent and env factories")
    from rlstruct.run import env_dims

    module = importlib.import_module(f"algos.{algo}")
    cfg = module.Config(**overrides)
    if getattr(cfg, "env_backend", "gymnasium") != "gymnasium":
        raise ConfigError("tune_algo measures gymnasium envs (env_backend='gymnasium')")
    model_name, agent_name, pipelined = ALGOS[algo]
    if getattr(cfg, "recurrent", False):
        model_name = "GRUActorCritic"
    obs_dim, n_actions = env_dims(cfg.env_id)
    model = getattr(module, model_name)(obs_dim, n_actions, cfg.hidden)
    return cfg, model, getattr(module, agent_name), pipelined


def tune_algo(algo: str = "ppo", *, budget_s: float = 60.0, **kwargs: Any) -> TuneResult:
    """:func:`tune` for an algorithm of ``algos/``: its model and agent, its env.

    The coupling is small: ``algos.<algo>.Config`` (``env_id``, ``hidden``, ``seed``), the
    model and agent classes named in :data:`ALGOS`, and ``GymEnvInf(env=env_id, n_envs=...)``
    (as :meth:`rlstruct.run.Run.training_batcher` builds it). The model's ``state_dict`` is
    published after each batch, as the algorithms do.

    Args:
        algo: ``"ppo"``, ``"a2c"`` or ``"impala"``.
        budget_s: seconds the measurements may take.
        **kwargs: fields of the algorithm's ``Config`` (e.g. ``env_id="Acrobot-v1"``,
            ``hidden=256``), and keyword arguments of :func:`tune` (``candidates``,
            ``n_envs_options``, ``objective``, ``learn_s``, ...).
    """
    from rlstruct.envs import GymEnvInf

    tune_keys = set(list(inspect.signature(tune).parameters)[4:])
    options = {k: v for k, v in kwargs.items() if k in tune_keys}
    overrides = {k: v for k, v in kwargs.items() if k not in tune_keys}
    cfg, model, agent_cls, pipelined = _algo_factories(algo, **overrides)
    if not pipelined:
        options.setdefault("pipelines", (1,))
    options.setdefault("seed", cfg.seed)
    return tune(agent_cls, {"model": model}, GymEnvInf, {"env": cfg.env_id},
                budget_s=budget_s, weights=model.state_dict(), **options)


# ------------------------------------------------------------------------------- JSON files
@dataclass
class TunedLayout:
    """A layout file read back: the layout and ``T``.

    Attributes:
        layout: the LayoutConfig (tuned fields from the file, others as written there).
        n_timesteps: ``T`` of the pick.
        tuned: the measurements stored with it (objective, steps/s, ...).
    """

    layout: LayoutConfig
    n_timesteps: int
    tuned: dict[str, Any] = field(default_factory=dict)

    def batcher_kwargs(self) -> dict[str, Any]:
        """The layout keyword arguments of :func:`~rlstruct.experiment.make_batcher`
        (``device``, ``n_processes``, ``n_timesteps``, ``pipeline``, ``check_devices``); the
        env's ``n_envs`` is ``layout.n_envs``."""
        return {"device": self.layout.batcher_device, "n_processes": self.layout.n_processes,
                "n_timesteps": self.n_timesteps, "pipeline": self.layout.pipeline,
                "check_devices": self.layout.check_devices}


def write_layout(path: str | os.PathLike, result: TuneResult | Candidate,
                 base: LayoutConfig | None = None, **extra: Any) -> Path:
    """Writes the pick as JSON: LayoutConfig's fields, ``n_timesteps``, and ``"tuned"``.

    Args:
        path: the file.
        result: a TuneResult (its ``best`` and figures) or a Candidate.
        base: the fields the tuner does not choose (devices of the learner and evaluation,
            check_devices); default ``LayoutConfig()``.
        **extra: more entries under ``"tuned"`` (e.g. ``algo``, ``env_id``).

    Returns:
        The path written.
    """
    candidate = result.best if isinstance(result, TuneResult) else result
    data: dict[str, Any] = dataclasses.asdict(candidate.layout(base))
    data["n_timesteps"] = candidate.n_timesteps
    tuned = result.summary() if isinstance(result, TuneResult) else {}
    data["tuned"] = {"label": candidate.label, **tuned, **extra}
    path = Path(path)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def read_layout(path: str | os.PathLike) -> TunedLayout:
    """Reads a file of :func:`write_layout` (or any JSON of LayoutConfig fields and an
    optional ``n_timesteps``; a missing field keeps LayoutConfig's default).

    Raises:
        ConfigError: not a JSON object, an unknown key, or a field of the wrong type.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot read the layout file {path}: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object of LayoutConfig fields")
    data = dict(data)
    tuned = data.pop("tuned", {})
    n_timesteps = data.pop("n_timesteps", None)
    fields = {f.name: f for f in dataclasses.fields(LayoutConfig)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{path}: unknown layout keys {unknown}; expected {sorted(fields)}, "
                          "n_timesteps and tuned")
    defaults = LayoutConfig()
    for name, value in data.items():
        want = type(getattr(defaults, name))
        if type(value) is not want:
            raise ConfigError(f"{path}: {name} must be a {want.__name__}, got {value!r}")
    if n_timesteps is None:
        n_timesteps = 0
    elif type(n_timesteps) is not int or n_timesteps < 1:
        raise ConfigError(f"{path}: n_timesteps must be an int >= 1, got {n_timesteps!r}")
    return TunedLayout(LayoutConfig(**data), n_timesteps, tuned)


def layout_from_json(path: str | os.PathLike) -> LayoutConfig:
    """The LayoutConfig of a layout file (``LayoutConfig.from_json``); ``n_timesteps`` and the
    measurements are dropped (see :func:`read_layout`)."""
    return read_layout(path).layout


def apply_layout(cfg: Any, path: str | os.PathLike) -> Any:
    """Sets the tuned fields of a run config from a layout file, in place, and returns it.

    ``cfg.layout``'s ``batcher_device``, ``n_processes``, ``n_envs`` and ``pipeline``, and
    ``cfg.n_timesteps`` when the file has one; the learner and evaluation devices and
    ``check_devices`` stay the config's.

    Args:
        cfg: a :class:`~rlstruct.run.RunConfig` (anything with ``layout`` and ``n_timesteps``).
        path: a file of :func:`write_layout`.
    """
    tuned = read_layout(path)
    cfg.layout = dataclasses.replace(
        cfg.layout, **{name: getattr(tuned.layout, name) for name in TUNED_FIELDS})
    if tuned.n_timesteps:
        cfg.n_timesteps = tuned.n_timesteps
    return cfg


# ------------------------------------------------------------------------------ command line
def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") \
            from err
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rlstruct tune``: tune an algorithm's layout, print the table, write JSON.

    Returns:
        The exit code (0; 1 when no candidate could be measured).
    """
    parser = argparse.ArgumentParser(
        prog="python -m rlstruct tune",
        description="Measure candidate batcher layouts of an algorithm within a time budget, "
                    "print a table and write the best one to a JSON layout file.")
    parser.add_argument("--algo", default="ppo", choices=sorted(ALGOS),
                        help="the algorithm whose model, agent and env are measured")
    parser.add_argument("--env-id", default=None, help="gymnasium id (default: the algorithm's)")
    parser.add_argument("--hidden", type=int, default=None, help="model width (default: the "
                        "algorithm's)")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="seconds the measurements may take (default 60)")
    parser.add_argument("--objective", default="steps_per_s", choices=OBJECTIVES,
                        help="maximise steps per second or steps per CPU-second")
    parser.add_argument("--learn-s", type=float, default=0.0,
                        help="fake learner seconds per batch, the same for every layout "
                             "(0: pure collection)")
    parser.add_argument("--processes", type=_ints, default=None,
                        help="worker counts, e.g. 1,2,4 (1: SerialBatcher; default 1, 2, 4, "
                             "... up to the cores)")
    parser.add_argument("--n-envs", type=_ints, default=[8, 16, 32, 64],
                        help="envs per process (default 8,16,32,64)")
    parser.add_argument("--n-timesteps", type=_ints, default=[16, 32, 64],
                        help="values of T (default 16,32,64)")
    parser.add_argument("--pipeline", type=_ints, default=None,
                        help="pipeline depths (default 1,2 for algorithms that support it)")
    parser.add_argument("--devices", default=None,
                        help="comma-separated GPU devices for a SerialBatcher (default cuda:0 "
                             "when there is one; 'none' for none)")
    parser.add_argument("--probe-s", type=float, default=None,
                        help="seconds of a first measurement (default: from the budget)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--out", type=Path, default=Path("tune.json"),
                        help="the layout file to write (default tune.json)")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {"seed": args.seed}
    if args.env_id is not None:
        overrides["env_id"] = args.env_id
    if args.hidden is not None:
        overrides["hidden"] = args.hidden
    devices = None
    if args.devices is not None:
        devices = [] if args.devices == "none" else [d for d in args.devices.split(",") if d]
    options: dict[str, Any] = dict(
        processes=args.processes, n_envs_options=args.n_envs,
        n_timesteps_options=args.n_timesteps, devices=devices, objective=args.objective,
        learn_s=args.learn_s, probe_s=args.probe_s)
    if args.pipeline is not None:
        options["pipelines"] = args.pipeline
    try:
        result = tune_algo(args.algo, budget_s=args.budget, **options, **overrides)
    except ConfigError as err:
        print(f"python -m rlstruct tune: error: {err}", file=sys.stderr)
        return 2
    if result.stats[result.best].error is not None:
        print("python -m rlstruct tune: every measured layout failed", file=sys.stderr)
        return 1
    env_id = args.env_id or importlib.import_module(f"algos.{args.algo}").Config().env_id
    written = write_layout(args.out, result, algo=args.algo, env_id=env_id,
                           learn_s=args.learn_s)
    print(f"best: {result.best.label} -> {written} (use it with --layout {written})")
    return 0
