"""The searches: a coordinate search within a budget (:func:`search`) and the exhaustive grid
(:func:`grid_search`), over any ``measure(candidate, seconds) -> Measurement``."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rlstruct.errors import ConfigError
from rlstruct.runs.layout import LayoutConfig
from rlstruct.runs.layout_file import TunedLayout
from rlstruct.tools.tune.candidates import AXES, Candidate

__all__ = ["tuned_layout", "OBJECTIVES", "Measurement", "CandidateStats", "TuneResult", "MeasureFn",
           "search", "grid_search", "default_probe_s", "paired_winner"]

Objective = Literal["steps_per_s", "steps_per_cpu_s"]
OBJECTIVES: tuple[str, ...] = ("steps_per_s", "steps_per_cpu_s")


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
        """What :func:`tuned_layout` stores under ``"tuned"``: objective, budget and figures."""
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
                    overhead_guess_s: float = 0.5, n_rounds: int = 2) -> float:
    """A probe length that lets a coordinate search of ``candidates`` and its finals fit in
    ``budget_s``: about 1.5 sweeps of probes plus ``n_rounds`` rounds of ``n_finalists``
    probe-long measurements."""
    sweep = 1 + sum(len(_values(candidates, a)) - 1 for a in AXES)
    probes = 1.5 * min(sweep, len(candidates))
    finals = min(n_finalists, len(candidates)) * n_rounds
    units = probes + finals
    return max(0.1, (budget_s - (probes + finals) * overhead_guess_s) / units)


def _choose(stats: Mapping[Candidate, CandidateStats], objective: str,
            among: Sequence[Candidate] | None = None) -> Candidate:
    pool = list(among) if among is not None else list(stats)
    return max(pool, key=lambda c: stats[c].score(objective))


def _value(m: Measurement, objective: str) -> float:
    """One measurement's objective (nan when it failed or has no figure)."""
    if m.error is not None:
        return math.nan
    if objective == "steps_per_s":
        return m.steps / m.wall_s if m.wall_s > 0 else math.nan
    return m.steps / m.cpu_s if m.cpu_s > 0 else math.nan


def paired_winner(rounds: Sequence[Mapping[Candidate, Measurement]], objective: str
                  ) -> Candidate | None:
    """The best candidate by rounds measured close together: in each complete round (every
    candidate measured, none failed) each candidate's figure is divided by the round's best,
    and the candidate with the best median ratio wins (ties: the best mean ratio). A load that
    comes and goes between rounds scales a whole round and cancels out. None without a complete
    round.
    """
    ratios: dict[Candidate, list[float]] = {}
    for measured in rounds:
        values = {c: _value(m, objective) for c, m in measured.items()}
        top = max(values.values(), default=math.nan)
        if not values or any(math.isnan(v) for v in values.values()) or not top > 0:
            continue
        for c, v in values.items():
            ratios.setdefault(c, []).append(v / top)
    if not ratios:
        return None
    n = max(len(r) for r in ratios.values())
    full = {c: sorted(r) for c, r in ratios.items() if len(r) == n}
    return max(full, key=lambda c: (full[c][(n - 1) // 2] + full[c][n // 2], sum(full[c])))


def search(
    candidates: Sequence[Candidate],
    measure: MeasureFn,
    *,
    budget_s: float,
    objective: str = "steps_per_s",
    probe_s: float | None = None,
    n_finalists: int = 3,
    n_rounds: int = 2,
    overhead_guess_s: float = 0.5,
    log: Callable[[str], None] | None = None,
) -> TuneResult:
    """Coordinate search, then finals: the tuner's choice within ``budget_s``.

    1. Measure the candidate in the upper middle of every axis for ``probe_s``.
    2. Sweep the axes (workers, envs per process, ``T``, pipeline): measure the neighbours of
       the current candidate along the axis (the other axes kept; the nearest valid candidate
       where the grid has a hole, e.g. no pipelined SerialBatcher), move to the best.
       Repeat sweeps until one moves no more.
    3. Finals: the ``n_finalists`` best measured are measured again for ``probe_s`` each, in
       ``n_rounds`` interleaved rounds (round ``r`` starts at finalist ``r``, so no candidate
       is always first or last); the winner is decided within rounds (:func:`paired_winner`),
       so a load that changes between rounds on a shared machine does not decide. Without a
       complete round, the best by all its measurements (total steps over total seconds) wins.

    A measurement starts only while ``spent + probe + overhead`` fits in the budget, where
    the overhead (start-up, warm-up, close) is the largest one seen so far
    (``overhead_guess_s`` before the first); the sweeps stop early enough to leave the finals
    their share (on a loaded machine the overheads grow beyond the guess).

    Args:
        candidates: the layouts to choose from (any subset of a grid).
        measure: ``measure(candidate, seconds) -> Measurement``.
        budget_s: seconds the measurements may take in all.
        objective: ``"steps_per_s"`` or ``"steps_per_cpu_s"``.
        probe_s: seconds of a measurement (default: :func:`default_probe_s`).
        n_finalists: candidates measured again at the end.
        n_rounds: rounds of the finals (>= 1).
        overhead_guess_s: expected cost of a measurement beyond its window, before one is seen.
        log: called with one line per measurement.

    Returns:
        The :class:`TuneResult`.

    Raises:
        ConfigError: no candidates, an unknown objective, ``n_rounds`` below 1, or not even
            one measurement fits.
    """
    candidates = _check(candidates, objective)
    if n_rounds < 1:
        raise ConfigError(f"n_rounds must be >= 1, got {n_rounds}")
    if probe_s is None:
        probe_s = default_probe_s(candidates, budget_s, n_finalists, overhead_guess_s, n_rounds)
    book = _Book(measure, budget_s, overhead_guess_s, log)
    current = _start(candidates)
    if not book.run(current, probe_s):
        raise ConfigError(f"budget_s={budget_s} leaves no time for one measurement of "
                          f"{probe_s:.2f} s (+ about {overhead_guess_s} s of start-up)")
    _sweep_axes(book, current, candidates, objective, probe_s, n_finalists, n_rounds)
    finalists, rounds = _finals(book, objective, probe_s, n_finalists, n_rounds)
    best = paired_winner([r for r in rounds if len(r) == len(finalists)], objective) or \
        _choose(book.stats, objective, finalists or None)
    return TuneResult(best, book.stats, objective, budget_s, book.spent, len(candidates))


def _sweep_axes(book: _Book, current: Candidate, candidates: Sequence[Candidate],
                objective: str, probe_s: float, n_finalists: int, n_rounds: int) -> None:
    """Step 2 of :func:`search`: sweeps of the axes from ``current`` (measured), moving to the
    best neighbour, until a sweep moves no more or the budget left is the finals' share."""
    moved, out_of_budget = True, False
    while moved and not out_of_budget:
        moved = False
        for axis in AXES:
            near = _neighbours(current, axis, candidates)
            for c in near:
                reserve = min(n_finalists, len(book.stats)) * n_rounds * book.cost(probe_s)
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


def _finals(book: _Book, objective: str, probe_s: float, n_finalists: int,
            n_rounds: int) -> tuple[list[Candidate], list[dict[Candidate, Measurement]]]:
    """Step 3 of :func:`search`: the ``n_finalists`` best measured without error, and their
    interleaved rounds (the last one incomplete if the budget ran out)."""
    finalists = [s.candidate for s in sorted(book.stats.values(),
                                             key=lambda s: -s.score(objective))
                 if s.error is None][:n_finalists]
    rounds: list[dict[Candidate, Measurement]] = []
    if len(finalists) > 1:
        for r in range(n_rounds):
            rounds.append({})
            for c in finalists[r % len(finalists):] + finalists[:r % len(finalists)]:
                if not book.run(c, probe_s):
                    break
                rounds[-1][c] = book.stats[c].measurements[-1]
            if len(rounds[-1]) < len(finalists):
                break
    return finalists, rounds


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


def tuned_layout(result: TuneResult | Candidate, base: LayoutConfig | None = None,
                 **extra: Any) -> TunedLayout:
    """The pick of a search as a layout file's content
    (:func:`rlstruct.runs.layout_file.write_layout` writes it).

    Args:
        result: a TuneResult (its ``best`` and figures) or a Candidate.
        base: the fields the tuner does not choose (devices of the learner and evaluation,
            check_devices); default ``LayoutConfig()``.
        **extra: more entries under ``"tuned"`` (e.g. ``algo``, ``env_id``).

    Returns:
        The layout, ``T``, the learner's ``n_threads`` and, under ``tuned``, the candidate's
        label, the result's summary and ``extra``.
    """
    candidate = result.best if isinstance(result, TuneResult) else result
    figures = result.summary() if isinstance(result, TuneResult) else {}
    return TunedLayout(candidate.layout(base), candidate.n_timesteps,
                       {"label": candidate.label, **figures, **extra}, candidate.n_threads)
