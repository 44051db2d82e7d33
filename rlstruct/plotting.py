"""Plots of run directories: the returns of one run, or several runs on one figure.

What a curve shows is what the run's ``progress.csv`` says, so the plot, the csv, the stop test
and the printed summary agree:

- the training return is the ``train_return_mean<N>`` column (the mean of the last ``N``
  finished episodes, the number the stop test reads), one solid line per run;
- the evaluation return is drawn as markers at the rows where an evaluation finished (nan
  elsewhere), joined by a dashed line;
- for a single run, each episode's return (``episodes.csv``) is drawn as a faint dot.

``python -m rlstruct plot PATH [PATH ...]`` calls :func:`plot_runs`; a PATH may be a run
directory or a folder of run directories (``runs/``), whose runs are compared on one figure.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["plot_runs", "run_curves", "find_runs", "is_run_dir"]

_TRAIN_COLUMN = re.compile(r"^train_return_mean\d+$")


def is_run_dir(path: str | Path) -> bool:
    """True if ``path`` holds a ``progress.csv`` or an ``episodes.csv``."""
    path = Path(path)
    return (path / "progress.csv").is_file() or (path / "episodes.csv").is_file()


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """The run directories named by ``paths``: each path is a run directory or a folder whose
    subfolders that are run directories are taken, sorted by name.

    Raises:
        FileNotFoundError: a path does not exist, or is neither a run directory nor a folder
            holding one.
    """
    runs: list[Path] = []
    for path in map(Path, paths):
        if is_run_dir(path):
            runs.append(path)
            continue
        inside = sorted(p for p in path.iterdir() if is_run_dir(p)) if path.is_dir() else []
        if not inside:
            raise FileNotFoundError(
                f"{path} is not a run directory (no progress.csv or episodes.csv) nor a folder "
                "of run directories"
            )
        runs.extend(inside)
    return runs


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path) -> Path:
    """Plot the returns of run directories (or folders of them) against frames into a PNG.

    Each run gets one colour (see the module docstring for its curves); the legend names runs by
    directory name. Uses matplotlib's Agg canvas: no display, no pyplot state.

    Args:
        run_dirs: run directories written by :class:`~rlstruct.logger.RunLogger`, or folders
            of them.
        out: the PNG to write (parent folders are created).

    Returns:
        ``out`` as a ``Path``.

    Raises:
        FileNotFoundError: see :func:`find_runs`.
        ImportError: matplotlib is not installed (``pip install 'rlstruct[plot]'``).
    """
    runs = find_runs(run_dirs)
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            f"plotting needs matplotlib ({err}); install it with: pip install 'rlstruct[plot]'"
        ) from err
    fig = Figure(figsize=(9, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colours = matplotlib.colormaps["tab10"].colors
    for i, run in enumerate(runs):
        colour = colours[i % len(colours)]
        name = "" if len(runs) == 1 else f"{run.name} "
        curves = run_curves(run)
        episodes, evals = curves.pop("episode_return"), curves.pop("eval_return")
        if episodes and len(runs) == 1:
            ax.plot(*zip(*episodes), color=colour, alpha=0.3, ls="none", marker=".", ms=3,
                    label="episode return")
        for column, train in curves.items():
            if train:
                ax.plot(*zip(*train), color=colour, lw=2, label=f"{name}{column}")
        if evals:
            ax.plot(*zip(*evals), color=colour, ls="--", marker="o", ms=4,
                    label=f"{name}eval_return")
    ax.set_xlabel("frames")
    ax.set_ylabel("return")
    ax.set_title(runs[0].name if len(runs) == 1 else f"{len(runs)} runs")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(loc="best", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no episodes recorded", ha="center", va="center",
                transform=ax.transAxes)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def run_curves(run_dir: str | Path) -> dict[str, list[tuple[float, float]]]:
    """The ``(frames, value)`` points :func:`plot_runs` draws for one run directory.

    Returns:
        ``{"<train column>": ..., "eval_return": ..., "episode_return": ...}``: the training
        return column of ``progress.csv`` (``train_return_mean<N>``; ``train_return`` in runs
        written before it was named), the rows where an evaluation finished, and one point per
        finished episode (``episodes.csv``). Rows without a value are left out.
    """
    run = Path(run_dir)
    progress = _read_csv(run / "progress.csv")
    header = progress[0] if progress else {}
    column = next((c for c in header if _TRAIN_COLUMN.match(c)), "train_return")
    episodes = [
        (_num(r.get("frames_at_record")), _num(r.get("return")))
        for r in _read_csv(run / "episodes.csv")
    ]
    return {
        column: _series(progress, column),
        "eval_return": _series(progress, "eval_return"),
        "episode_return": [(f, v) for f, v in episodes if not (math.isnan(f) or math.isnan(v))],
    }


def _series(rows: list[dict[str, str]], column: str) -> list[tuple[float, float]]:
    """``(frames, value)`` of the rows where ``column`` has a value."""
    points = [(_num(r.get("frames")), _num(r.get(column))) for r in rows]
    return [(f, v) for f, v in points if not (math.isnan(f) or math.isnan(v))]


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan
