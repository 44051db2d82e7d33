"""Plots of run directories: the returns of one run, or several runs on one figure.

What a curve shows is what the run's ``progress.csv`` says, so the plot, the csv, the stop test
and the printed summary agree:

- the training return is the ``train_return_mean<N>`` column (the mean of the last ``N``
  finished episodes, the number the stop test reads), one solid line per run;
- the evaluation return is drawn as markers at the rows where an evaluation finished (nan
  elsewhere), joined by a dashed line;
- for a single run, each episode's return (``episodes.csv``) is drawn as a faint dot.

Among several runs, a run with nothing to draw (no episode finished: it failed at start-up, or
was stopped at once) is skipped, and a run whose ``summary.json`` says it ``failed`` or was
``interrupted`` is labelled so in the legend; the title counts the runs drawn, and the ones
skipped (:func:`select_runs`). Each run's label tells it from the others (:func:`run_labels`):
its folder's name (its path when names repeat, as in a sweep), its seed, and the config values
that differ between the runs.

The x axis is ``frames`` (default) or ``wall_time``: seconds since the run started, as
``progress.csv`` says (an episode at the wall time of the rows around its frame count).

A sweep's trial graph (:func:`trial_figure`, drawn by :mod:`rlstruct.tools.sweep`) shows the mean
train return of a trial's sessions over the longest session, with the min-max band of the
sessions still running and a moving average.

``rlstruct plot PATH [PATH ...] [--x wall_time]`` calls :func:`plot_runs`; a PATH may be a run
directory or a folder holding run directories (``runs/``, or a sweep's ``--out`` folder), whose
runs are compared on one figure.
Run folders are read with :mod:`rlstruct.runs.folder`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlstruct.errors import ConfigError, RunFileError, install_hint
from rlstruct.runs.folder import RunFolder, find_runs, is_run_dir, read_run

__all__ = ["plot_runs", "runs_figure", "run_curves", "select_runs", "RunSelection", "find_runs",
           "is_run_dir", "run_labels", "X_AXES",
           "trial_curves", "trial_figure", "new_figure", "finish_figure"]

#: Default width, in grid points, of the trial graph's moving average (``--ma-window``).
MA_WINDOW = 10

#: The x axes a plot of runs can have: the frames, or the wall time in seconds.
X_AXES: tuple[str, ...] = ("frames", "wall_time")
XAxis = Literal["frames", "wall_time"]
_X_LABELS = {"frames": "frames", "wall_time": "wall time (s)"}
#: Config entries that differ between runs without telling them apart (where they were written).
_UNTOLD = ("runs_dir", "resume", "seed")

#: Statuses of ``summary.json`` that the legend and the title point out.
FLAGGED_STATUSES: tuple[str, ...] = ("failed", "interrupted")


@dataclass
class RunSelection:
    """What :func:`plot_runs` draws of the runs it found.

    Attributes:
        drawn: the runs with something to draw, in order.
        skipped: the runs with nothing to draw (no training return, evaluation or episode).
        curves: :func:`run_curves` of each drawn run, by folder.
    """

    drawn: list[RunFolder] = field(default_factory=list)
    skipped: list[RunFolder] = field(default_factory=list)
    curves: dict[Path, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)

    @staticmethod
    def label(run: RunFolder) -> str:
        """The run's name, with its status when it failed or was interrupted."""
        return f"{run.name} ({run.status})" if run.status in FLAGGED_STATUSES else run.name

    @property
    def labels(self) -> dict[Path, str]:
        """The legend label of each drawn run, by folder (:func:`run_labels`)."""
        return run_labels(self.drawn)

    @property
    def title(self) -> str:
        """The figure's title: the run's label for one run; otherwise how many runs are
        drawn, how many of them failed or were interrupted, and how many were skipped."""
        runs = self.drawn + self.skipped
        if len(runs) == 1:
            return self.label(runs[0])
        notes = [f"{n} {status}" for status in FLAGGED_STATUSES
                 if (n := sum(r.status == status for r in self.drawn))]
        if self.skipped:
            notes.append(f"{len(self.skipped)} skipped: no episodes")
        drawn = f"{len(self.drawn)} run{'s' if len(self.drawn) != 1 else ''}"
        return drawn + (f" ({'; '.join(notes)})" if notes else "")


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def run_labels(runs: Sequence[RunFolder], max_keys: int = 4) -> dict[Path, str]:
    """Labels that tell ``runs`` apart in a legend, by folder.

    A label is the folder's name (its path below the runs' common folder when two names are
    the same, as the sessions of a sweep may have), ``seed N`` when the config has a seed, the
    first ``max_keys`` config values that differ between the runs (``lr=0.001``), and the
    status when the run failed or was interrupted. Labels that are still the same get
    ``#2``, ``#3``, ...
    """
    flat = {run.path: _flat(run.config) for run in runs}
    keys = list(dict.fromkeys(k for values in flat.values() for k in values))
    differ = [k for k in keys if k not in _UNTOLD and len({repr(v.get(k)) for v in
                                                           flat.values()}) > 1][:max_keys]
    names = [run.name for run in runs]
    common = Path(os.path.commonpath([r.path for r in runs])) if len(runs) > 1 else None
    labels: dict[Path, str] = {}
    seen: dict[str, int] = {}
    for run in runs:
        config = flat[run.path]
        name = (run.path.relative_to(common).as_posix() if common is not None
                and names.count(run.name) > 1 else run.name)
        parts = [name, *([f"seed {config['seed']}"] if "seed" in config else []),
                 *(f"{k}={config.get(k)}" for k in differ)]
        if run.status in FLAGGED_STATUSES:
            parts.append(f"({run.status})")
        label = " ".join(parts)
        seen[label] = seen.get(label, 0) + 1
        labels[run.path] = label if seen[label] == 1 else f"{label} #{seen[label]}"
    return labels


def select_runs(run_dirs: Sequence[str | Path], x: XAxis = "frames") -> RunSelection:
    """The runs of ``run_dirs`` (see :func:`find_runs`) split into drawn and skipped; the
    curves against ``x`` (``frames`` or ``wall_time``).

    Raises:
        FileNotFoundError: see :func:`find_runs`.
        RunFileError: a run's CSV file is not UTF-8 text, or cannot be read.
    """
    selection = RunSelection()
    for path in find_runs(run_dirs):
        run = read_run(path)
        curves = run_curves(run, x)
        if any(curves.values()):
            selection.drawn.append(run)
            selection.curves[run.path] = curves
        else:
            selection.skipped.append(run)
    return selection


def new_figure(width: float = 9, height: float = 5) -> Any:
    """A matplotlib ``Figure`` on the Agg canvas (no display, no pyplot state).

    Raises:
        ImportError: matplotlib is not installed (``pip install -e '.[plot]'``).
    """
    try:
        import matplotlib  # noqa: F401 - first: a cached submodule would hide its absence
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            f"plotting needs matplotlib ({err}); install the plot extra: {install_hint('plot')}"
        ) from err
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def finish_figure(fig: Any, out: str | Path, empty_text: str, outside: bool = False) -> Path:
    """Grid and legend on every axes (``empty_text`` on those with no line), then the PNG
    ``out`` is written (parent folders are created); returns its path. ``outside``: each
    legend to the right of its axes, where it covers no data (comparisons of many runs)."""
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        if ax.lines and outside:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                      borderaxespad=0.0)
        elif ax.lines:
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, empty_text, ha="center", va="center", transform=ax.transAxes)
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png", bbox_inches="tight" if outside else None)
    except OSError as err:
        raise RunFileError(f"cannot write the plot {out}: {type(err).__name__}: "
                           f"{err.strerror or err} (give another file with -o/--out)") from err
    return out


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path, x: XAxis = "frames") -> Path:
    """Plot the returns of run directories (or folders of them) against frames (or the wall
    time) into a PNG.

    Each run gets one colour (see the module docstring for its curves); the legend names runs by
    directory name. Runs of different envs are drawn on axes of their own, one per env (their
    returns do not share a scale), and a comparison's legends stand beside the axes. Among
    several runs, those with nothing to draw are skipped and counted in the title
    (:func:`select_runs`). Uses matplotlib's Agg canvas: no display, no pyplot state.

    Args:
        run_dirs: run directories written by :class:`~rlstruct.runs.logger.RunLogger`, or folders
            of them.
        out: the PNG to write (parent folders are created).
        x: the x axis: ``frames``, or ``wall_time`` (seconds since the run started).

    Returns:
        ``out`` as a ``Path``.

    Raises:
        FileNotFoundError: see :func:`find_runs`.
        ConfigError: ``x`` is not one of :data:`X_AXES`.
        RunFileError: a run's CSV is not UTF-8 text, or ``out`` cannot be written (a
            read-only folder); the file is named.
        ImportError: matplotlib is not installed (``pip install -e '.[plot]'``).
    """
    fig, single = runs_figure(run_dirs, x)
    return finish_figure(fig, out, "no episodes recorded", outside=not single)


def runs_figure(run_dirs: Sequence[str | Path], x: XAxis = "frames") -> tuple[Any, bool]:
    """The figure of :func:`plot_runs`, not yet finished (legends) nor written, and whether it
    draws a single run."""
    if x not in X_AXES:
        raise ConfigError(f"plot: x must be one of {', '.join(X_AXES)}, got {x!r}")
    selection = select_runs(run_dirs, x)
    labels = selection.labels
    envs = list(dict.fromkeys(str(run.config.get("env_id", "?")) for run in selection.drawn))
    fig = new_figure(height=max(5.0, 3.5 * len(envs)))
    axes = {env: fig.add_subplot(max(1, len(envs)), 1, i + 1) for i, env in enumerate(envs)}
    ax = fig.add_subplot() if not envs else next(iter(axes.values()))
    from matplotlib import colormaps  # importable: new_figure checked it

    colours = colormaps["tab10"].colors
    single = len(selection.drawn) + len(selection.skipped) == 1
    for i, run in enumerate(selection.drawn):
        ax = axes[str(run.config.get("env_id", "?"))]
        colour = colours[i % len(colours)]
        name = "" if single else f"{labels[run.path]} "
        curves = dict(selection.curves[run.path])
        episodes, evals = curves.pop("episode_return"), curves.pop("eval_return")
        if episodes and single:
            ax.plot(*zip(*episodes), color=colour, alpha=0.3, ls="none", marker=".", ms=3,
                    label="episode return")
        for column, train in curves.items():
            if train:
                ax.plot(*zip(*train), color=colour, lw=2, label=f"{name}{column}")
        if evals:
            ax.plot(*zip(*evals), color=colour, ls="--", marker="o", ms=4,
                    label=f"{name}eval_return")
    for env, env_ax in axes.items():
        env_ax.set_xlabel(_X_LABELS[x])
        env_ax.set_ylabel(f"return ({env})" if len(axes) > 1 else "return")
    ax = next(iter(axes.values()), ax)
    ax.set_title(selection.title)
    return fig, single


def run_curves(run: str | Path | RunFolder,
               x: XAxis = "frames") -> dict[str, list[tuple[float, float]]]:
    """The ``(frames, value)`` (or ``(wall_time, value)``) points :func:`plot_runs` draws for
    one run directory.

    Args:
        run: the run directory, or a :class:`~rlstruct.runs.folder.RunFolder` read already.
        x: ``frames``, or ``wall_time``: an episode then stands at the wall time interpolated
            between the progress rows around its frame count.

    Returns:
        ``{"<train column>": ..., "eval_return": ..., "episode_return": ...}``: the training
        return column of ``progress.csv`` (``train_return_mean<N>``; ``train_return`` in runs
        written before it was named), the rows where an evaluation finished, and one point per
        finished episode (``episodes.csv``). Rows without a value are left out.
    """
    if not isinstance(run, RunFolder):
        run = read_run(run)
    column = run.train_column
    episodes = run.episode_points()
    if x == "wall_time":
        clock = run.series("wall_time")  # (frames, wall_time) of the rows
        episodes = ([(float(np.interp(f, *zip(*clock))), v) for f, v in episodes]
                    if clock else [])
    return {
        column: run.series(column, x),
        "eval_return": run.series("eval_return", x),
        "episode_return": episodes,
    }


# ------------------------------------------------------------------ trial graphs (sweeps)
def trial_curves(
    run_dirs: Sequence[str | Path], points: int = 200, ma_window: int = MA_WINDOW
) -> dict[str, np.ndarray]:
    """The trial graph's curves: the sessions' train return on a common frames grid.

    Each session's ``train_return_mean<N>`` column (rows with a value) is interpolated
    linearly on ``points`` frames spanning the longest session (from the earliest first value
    to the latest last one). A session that stopped earlier (solved, or out of budget) keeps
    its last value from there on: the mean and the min-max band are over every session that
    has started, so the mean does not drop when the first (often the best) session stops;
    ``n_running`` says how many sessions still run at each frame. Runs without a value are
    left out.

    Args:
        run_dirs: the sessions' run folders.
        points: grid size.
        ma_window: width, in grid points, of the trailing moving average of the mean
            (points without a mean are skipped).

    Returns:
        ``{"frames", "mean", "min", "max", "ma", "n_running"}`` (each of shape ``(points,)``),
        ``"ends"`` (the last frame of each session, sorted) and ``"n_sessions"`` (a 0-d
        array); empty arrays when no session has a value.

    Raises:
        ConfigError: ``points`` or ``ma_window`` is below 1.
    """
    if points < 1 or ma_window < 1:
        raise ConfigError(f"trial_curves: need points >= 1 and ma_window >= 1, got "
                          f"points={points}, ma_window={ma_window}")
    series = []
    for path in run_dirs:
        run = read_run(path)
        xy = run.series(run.train_column)
        if xy:
            x, y = np.array(xy, dtype=np.float64).T
            order = np.argsort(x, kind="stable")
            series.append((x[order], y[order]))
    empty = np.zeros(0)
    if not series:
        return {"frames": empty, "mean": empty, "min": empty, "max": empty, "ma": empty,
                "n_running": empty, "ends": empty, "n_sessions": np.array(0)}
    lo, hi = min(x[0] for x, _ in series), max(x[-1] for x, _ in series)
    grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
    # np.interp holds the last value past a session's end: a finished session keeps it.
    values = np.stack([np.where(grid >= x[0], np.interp(grid, x, y), np.nan)
                       for x, y in series])
    running = np.stack([(grid >= x[0]) & (grid <= x[-1]) for x, _ in series]).sum(axis=0)
    started = (~np.isnan(values)).sum(axis=0)
    with np.errstate(invalid="ignore"):
        total = np.nansum(values, axis=0)
        mean = np.where(started > 0, total / np.maximum(started, 1), np.nan)
        low = np.where(started > 0, np.fmin.reduce(values, axis=0), np.nan)
        high = np.where(started > 0, np.fmax.reduce(values, axis=0), np.nan)
    has = ~np.isnan(mean)
    csum = np.concatenate([[0.0], np.cumsum(np.where(has, mean, 0.0))])
    ccount = np.concatenate([[0], np.cumsum(has)])
    idx = np.arange(1, len(mean) + 1)
    start = np.maximum(0, idx - ma_window)
    count = ccount[idx] - ccount[start]
    ma = np.where(has & (count > 0), (csum[idx] - csum[start]) / np.maximum(count, 1), np.nan)
    return {"frames": grid, "mean": mean, "min": low, "max": high, "ma": ma,
            "n_running": running, "ends": np.sort([x[-1] for x, _ in series]),
            "n_sessions": np.array(len(series))}


def trial_figure(
    run_dirs: Sequence[str | Path], out_png: str | Path, title: str = "trial",
    ma_window: int = MA_WINDOW,
) -> Path:
    """Draw a trial graph: mean train return vs frames across sessions, min-max band, and its
    moving average (SLM-Lab's trial graph and its ``_ma`` twin on one figure).

    The frames axis spans the longest session; the band and the mean are over every session,
    a finished one at its last value (:func:`trial_curves`), and a dotted line marks where each
    shorter session ended.

    Args:
        run_dirs: the sessions' run folders.
        out_png: the PNG to write.
        title: the figure's title.
        ma_window: width, in grid points, of the moving average.

    Raises:
        ImportError: matplotlib is not installed.
    """
    curves = trial_curves(run_dirs, ma_window=ma_window)
    ax = (fig := new_figure()).add_subplot()
    n = int(curves["n_sessions"])
    if n:
        x = curves["frames"]
        ax.fill_between(x, curves["min"], curves["max"], color="tab:blue", alpha=0.2,
                        label=f"min-max of the {n} sessions (an ended one at its last value)")
        ax.plot(x, curves["mean"], color="tab:blue", lw=1.5, label="mean train return")
        ax.plot(x, curves["ma"], color="tab:orange", lw=2,
                label=f"moving average ({ma_window} points)")
        for i, end in enumerate(curves["ends"][:-1]):
            ax.axvline(end, color="grey", ls=":", lw=1,
                       label="a session ends" if i == 0 else None)
    ax.set_xlabel("frames")
    ax.set_ylabel("train return")
    ax.set_title(title)
    return finish_figure(fig, out_png, "no session recorded a return")
